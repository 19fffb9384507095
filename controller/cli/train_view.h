// The training telemetry of a `train` job as `status` and `watch` show it. JobDetail.telemetry is
// the latest step as rank 0 reported it (furnace.v1.StepTelemetry); TrainMetricsOf turns it into
// the view the renderings read; they are pure functions of it (and of the job), so every rendering
// is testable without a controller. A figure that is not known (0 in the message for a time, MFU
// without the device's peak FLOPs, the activation peak, the entropy floor of data other than the
// Markov chain) is absent and shown as nothing, never as 0.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "furnace/v1/controller.pb.h"

namespace furnace::cli {

struct MoeLayerRouting {
  int layer = 0;                          // MoE layer index (0 = the first MoE layer)
  std::optional<double> imbalance;        // max / mean tokens per expert
  std::vector<double> tokens_per_expert;  // [expert]
  std::string schedule;                   // "deepspeed", "s1", "s2" (v1::MoeLayerScheduleLabel)
};

// One collective on one group of rank 0 in the last step.
struct CommRow {
  std::string op, group;  // "all_reduce", "tp" (v1::CollectiveOpLabel, v1::ParallelGroupLabel)
  double bytes = 0, seconds = 0, calls = 0;
};

// One op of the MoE schedules on rank 0 in the last step (furnace.v1.MoeOpTelemetry).
struct MoeOpRow {
  std::string op;  // as the runtime names it: "a2a(ep)", "fused(a2a ep, ag tp)", ...
  double bytes = 0, seconds = 0, calls = 0;
};

struct TrainMetrics {
  std::optional<double> loss, aux_loss, tokens, tokens_per_second, step_seconds,
      forward_backward_seconds, optimizer_seconds, sync_seconds, checkpoint_seconds, mfu, grad_norm,
      lr, dropped_tokens, activation_peak_bytes, memory_budget_bytes, model_flops, entropy_floor,
      imbalance_max, pipeline_in_flight, planner_decisions, emergency_offloads, late_reloads,
      agreed_drops;
  bool routing_spike = false;
  // The step these figures are of (rank 0's newest; 0: not known), and the job's progress (the
  // lowest step over the ranks): the views label the figures with their step when the two differ.
  uint64_t step = 0, progress_step = 0;
  // The latest held-out evaluation (eval.every): its loss, perplexity and the step it ran after.
  std::optional<double> eval_loss, eval_perplexity;
  uint64_t eval_step = 0;
  std::vector<MoeLayerRouting> layers;                  // ascending by layer
  std::string schedule_reason;                          // moe.schedule auto: why
  std::vector<CommRow> comm;                            // as reported
  std::vector<MoeOpRow> moe_ops;                        // as reported
  std::vector<std::pair<std::string, double>> planner;  // bytes per planner action
};

// The training view of a step's telemetry.
TrainMetrics TrainMetricsOf(const v1::StepTelemetry& telemetry);
// The training view of the job's latest step, or nullopt when it has none (a commcheck job, or a
// train job before its first step).
std::optional<TrainMetrics> TrainMetricsOf(const v1::JobDetail& job);

// "2.4512  (entropy floor 2.1000, gap +16.7%)", or just "2.4512" without a floor; "-" without a
// loss. The gap is (loss - floor) / floor: how far the model is from the best possible loss.
std::string FormatLoss(const TrainMetrics& m);
// "2.5123  (perplexity 12.33, after step 40)"; "-" without an evaluation.
std::string FormatEvalLoss(const TrainMetrics& m);
// "13.4 MiB of 64.0 MiB (21%)", or "13.4 MiB (no budget)" when the budget is 0 or unknown; "-"
// without a peak.
std::string FormatActivationMemory(const TrainMetrics& m);
// "1.34  (layer 0 1.34, layer 1 1.12)": the worst layer, then each; "-" when none reported.
std::string FormatImbalance(const TrainMetrics& m);
// "3.40%": MFU with two decimals below 10%, one above; "-" when not reported.
std::string FormatMfu(const TrainMetrics& m);

// The "training" section of `furnace status`: a key/value block (step, loss, aux loss, tokens per
// step and per second, step time with its phases, MFU, grad norm, lr, activation memory against
// the budget, pipeline micro-batches in flight, imbalance, MoE schedule, dropped tokens); when
// routing was reported, a tokens-per-expert table per MoE layer (each expert up to 16; beyond that,
// min / mean / max and the busiest expert); when collectives ran, a table of bytes, time and calls
// per (operation, group) of rank 0; when the MoE schedules' ops ran, their bytes, time and calls
// per op of rank 0; when the memory planner acted, its bytes per action.
// Starts with a blank line and a heading; empty when `m` is nullopt.
std::string RenderTrainSection(const v1::JobSummary& summary, const std::optional<TrainMetrics>& m);

// Seconds until the last step, from a rate in steps per second: `observed_steps_per_second` when
// > 0 (what watch measured across polls, checkpoint and restart time included), else the inverse
// of the last step_seconds. nullopt when the total or the rate is unknown or the job is final.
std::optional<double> EstimateEtaSeconds(const v1::JobSummary& summary,
                                         const std::optional<TrainMetrics>& m,
                                         double observed_steps_per_second);

// The two watch-frame lines of a training job (the first starts "step 42: " when the figures are
// of another step than the progress shown):
//   "loss 2.4512 (floor 2.1000, gap +16.7%)  aux 0.0123  tokens/s 12.3k  MFU 3.40%"
//   "imbalance 1.34  schedule s1  dropped 12  memory 13.4 MiB of 64.0 MiB (21%)"
// (the schedule only where a MoE layer runs s1 or s2: "s1", or "deepspeed x2, s1 x6" when mixed)
std::vector<std::string> TrainWatchLines(const TrainMetrics& m);
// What a plain (not a terminal) watch line appends: "  loss 2.4512  tokens/s 12.3k  MFU 3.40%"
// ("  step 42: loss ..." when the figures are of another step than the progress shown).
std::string TrainPlainSuffix(const TrainMetrics& m);

}  // namespace furnace::cli
