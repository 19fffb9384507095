// The training telemetry of a `train` job as `status` and `watch` show it. A train rank reports
// its latest step's figures as JobDetail.metrics (rank 0): loss, aux_loss, tokens,
// tokens_per_second, step_seconds, forward_backward_seconds, optimizer_seconds, mfu (0..1),
// grad_norm, lr, dropped_tokens, activation_peak_bytes, memory_budget_bytes (0 = unlimited),
// model_flops, entropy_floor (Markov data only), imbalance_max, imbalance.<moe_layer> and
// expert_tokens.<moe_layer>.<expert>. ParseTrainMetrics turns that flat map into a typed view; the
// rest are pure functions of it (and of the job), so every rendering is testable without a
// controller. A figure the rank did not report is absent and shown as nothing, never as 0.
#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "furnace/v1/controller.pb.h"

namespace furnace::cli {

struct MoeLayerRouting {
  int layer = 0;                          // MoE layer index (0 = the first MoE layer)
  std::optional<double> imbalance;        // max / mean tokens per expert
  std::vector<double> tokens_per_expert;  // [expert]; experts the rank did not report are 0
};

struct TrainMetrics {
  std::optional<double> loss, aux_loss, tokens, tokens_per_second, step_seconds,
      forward_backward_seconds, optimizer_seconds, checkpoint_seconds, mfu, grad_norm, lr,
      dropped_tokens, activation_peak_bytes, memory_budget_bytes, model_flops, entropy_floor,
      imbalance_max;
  std::vector<MoeLayerRouting> layers;  // ascending by layer
  std::set<std::string> keys;           // the metric keys this view consumed
};

// The training view of `metrics`, or nullopt when they hold no training figure (a commcheck job,
// or a train job before its first step).
std::optional<TrainMetrics> ParseTrainMetrics(
    const google::protobuf::Map<std::string, double>& metrics);

// "2.4512  (entropy floor 2.1000, gap +16.7%)", or just "2.4512" without a floor; "-" without a
// loss. The gap is (loss - floor) / floor: how far the model is from the best possible loss.
std::string FormatLoss(const TrainMetrics& m);
// "13.4 MiB of 64.0 MiB (21%)", or "13.4 MiB (no budget)" when the budget is 0 or unknown; "-"
// without a peak.
std::string FormatActivationMemory(const TrainMetrics& m);
// "1.34  (layer 0 1.34, layer 1 1.12)": the worst layer, then each; "-" when none reported.
std::string FormatImbalance(const TrainMetrics& m);
// "3.40%": MFU with two decimals below 10%, one above; "-" when not reported.
std::string FormatMfu(const TrainMetrics& m);

// The "training" section of `furnace status`: a key/value block (step, loss, aux loss, tokens per
// step and per second, step time with its phases, MFU, grad norm, lr, activation memory against
// the budget, imbalance, dropped tokens) and, when routing was reported, a tokens-per-expert table
// per MoE layer (each expert up to 16; beyond that, min / mean / max and the busiest expert).
// Starts with a blank line and a heading; empty when `m` is nullopt.
std::string RenderTrainSection(const v1::JobSummary& summary, const std::optional<TrainMetrics>& m);

// Seconds until the last step, from a rate in steps per second: `observed_steps_per_second` when
// > 0 (what watch measured across polls, checkpoint and restart time included), else the inverse
// of the last step_seconds. nullopt when the total or the rate is unknown or the job is final.
std::optional<double> EstimateEtaSeconds(const v1::JobSummary& summary,
                                         const std::optional<TrainMetrics>& m,
                                         double observed_steps_per_second);

// The two watch-frame lines of a training job:
//   "loss 2.4512 (floor 2.1000, gap +16.7%)  aux 0.0123  tokens/s 12.3k  MFU 3.40%"
//   "imbalance 1.34  dropped 12  memory 13.4 MiB of 64.0 MiB (21%)"
std::vector<std::string> TrainWatchLines(const TrainMetrics& m);
// What a plain (not a terminal) watch line appends: "  loss 2.4512  tokens/s 12.3k  MFU 3.40%".
std::string TrainPlainSuffix(const TrainMetrics& m);

}  // namespace furnace::cli
