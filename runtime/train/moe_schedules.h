// ChooseMoeSchedules: the schedule each MoE layer of a rank's model runs (moe.schedule;
// runtime/moe/schedule.h), decided the same way on every rank of the job.
//
//   deepspeed | s1 | s2   every MoE layer runs it (tp == 1: every schedule is deepspeed's
//                         computation, runtime/moe/executor.h);
//   auto                  the alpha-beta cost model (runtime/moe/cost_model.h) prices each
//                         schedule's forward and backward for the layer's shape (N = micro_batch *
//                         seq_len tokens, d_model, expert_ffn, E, k, capacity, tp, ep, esp) and the
//                         layer runs the cheapest over both directions (its backward needs what its
//                         forward saved, so one schedule per layer). s1 is left out where the
//                         tokens do not split over tp. Where the model leaves a real choice
//                         (deepspeed and every schedule predicted within 1.5x of the best), the
//                         ranks then time the layer itself under each candidate
//                         (runtime/moe/trial.h, GptMoe::TimeMoeLayer): deepspeed first, then
//                         the others in predicted order, each replacing the one before only
//                         when measured 5% faster. Not under
//                         a memory.device_budget (the trial runs outside the memory plan): the
//                         model's choice stands there, the reason says so.
// The profile auto prices with is fitted by moe::Calibrate on the job's own groups (a bounded
// micro-benchmark: every rank runs it, every rank fits the same numbers), or read from the cache
// `cost_profile.<layout>.json` under cache_dir (the job's checkpoint directory) when a previous
// attempt of the same layout wrote it; rank 0 decides whether the cache is used and hands its text
// to every rank, so no rank calibrates alone. Calibration writes the cache (rank 0); the trial's
// outcome is cached beside it (`moe_trial.<layout>_<shape>_<memory policy>.json`), the same way.
// With tp == 1 there is nothing to choose: no calibration runs. Calibration runs on the model's
// device (its collectives', GEMM's and copy's buffers are device memory, each timed to its
// completion), so a GPU rank prices what its layers pay, not host staging.
//
// Every rank of the layout must call it at the same point (collectives on every group).
// Errors: InvalidArgument for an unknown schedule; a collective's or the device's error.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/model/gpt_moe.h"
#include "runtime/moe/cost_model.h"
#include "runtime/moe/trial.h"
#include "runtime/train/rank_layout.h"

namespace furnace::train {

struct MoeScheduleChoice {
  std::vector<moe::Schedule> per_layer;  // per MoE layer of the model, in layer order
  // auto only: the layer shape's choice (predictions of every schedule, the reason) and the
  // profile it priced with, whether that came from the cache, and the calibration's seconds.
  std::optional<moe::Choice> choice;
  std::optional<moe::CostProfile> profile;
  bool from_cache = false;
  std::string cache_path;  // empty: no cache directory
  // auto's trial of the schedules (runtime/moe/trial.h): its cache file (empty: no cache
  // directory, or no trial) and whether its outcome came from there.
  std::string trial_cache_path;
  bool trial_from_cache = false;
  // Rank 0: why the profile or the trial just measured could not be cached (empty: they were, or
  // nothing was measured). A later attempt then measures again and may pick other schedules.
  std::string cache_error;
};

// `trial`: the trial's settings (the defaults in the worker; tests widen the window).
absl::StatusOr<MoeScheduleChoice> ChooseMoeSchedules(const std::string& requested,
                                                     model::GptMoe& model, const RankLayout& layout,
                                                     int micro_batch, const std::string& cache_dir,
                                                     const moe::TrialOptions& trial = {});

// The sizes Calibrate times for `shape`: its defaults (16 KiB to 1 MiB), then the layer's largest
// single collective (at most 64 MiB) where it is above them, so the bandwidth term is measured up
// to what the layer moves rather than extrapolated tens of times past 1 MiB (where a link may not
// have reached its bandwidth yet). The same on every rank (a function of the shape).
std::vector<int64_t> CalibrationSizesFor(const moe::LayerShape& shape);

// The GEMM sizes (FLOPs) Calibrate times for `shape`: its defaults (1 to 67 MFLOP), then the
// layer's largest expert GEMM (at most 2^34 FLOP) where it is above them. On a GPU the defaults
// take about the launch overhead each, so a slope fitted on them alone is noise, and the expert
// GEMMs it priced are orders of magnitude larger. (ChooseMoeSchedules uses it on GPUs; where
// GEMMs run on host cores, the defaults take milliseconds already.)
std::vector<int64_t> CalibrationGemmFlopsFor(const moe::LayerShape& shape);

// The layer shape auto prices for `model` on `layout` with micro-batches of micro_batch sequences.
moe::LayerShape LayerShapeOf(const model::ModelConfig& config, const RankLayout& layout,
                             int micro_batch);

}  // namespace furnace::train
