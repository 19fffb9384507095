// moe.schedule auto, measured: the cost model (cost_model.h) narrows the schedules, a trial of the
// MoE layer itself decides among those left.
//
// The alpha-beta model prices each collective by a fit on isolated messages; inside a layer, on
// ranks that share cores or a link with other work, a call costs more than that fit says, and on
// small shapes a schedule that runs more collectives (s1: 8 in a layer's forward where sliced
// deepspeed runs 4) was predicted up to 36% faster and measured up to 1.38x slower
// (bench/parm/REPORT.md). So where the model leaves a real choice, the ranks run the layer's
// forward and backward under each candidate, with their own groups, device and shape, and take
// the fastest as measured:
//   - candidates: deepspeed (the baseline a Parm schedule must beat), and every schedule predicted
//     within `window` of the best prediction (s1 only where the tokens split over tp);
//   - one untimed run of each, then timed rounds, the candidates' order rotating round by round,
//     a world barrier before every run; a run's time is the slowest rank's (every rank
//     all-gathers its own), a candidate's the median over the rounds; at least `reps` rounds, more
//     while the rounds so far took under `seconds` (small layers are noisy and cheap), at most
//     `max_reps`;
//   - deepspeed first, then the others in the order of their predictions: each replaces the
//     incumbent only when measured at least `margin` faster (a difference within the noise goes
//     to the baseline, and between s1 and s2 to the model's order).
// Every rank computes the same numbers (the all-gathered maxima), so every rank picks the same
// schedule. With one candidate (tp 1, or only deepspeed within the window) nothing runs and the
// model's choice stands.
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/comm/communicator.h"
#include "runtime/moe/cost_model.h"

namespace furnace::moe {

// TrialOptions and TrialCandidates (pure, for `furnace plan` too): cost_model.h.

// One forward and backward of the layer under a schedule on this rank: its seconds, or the error.
using LayerRun = std::function<absl::StatusOr<double>(Schedule)>;

// `predicted` with the trial's pick: schedule, reason ("s1: measured 2.61 ms fwd+bwd vs deepspeed
// 3.1 ms (slowest rank, median of 11; predicted deepspeed 2.95 ms, s1 2.4 ms, s2 5.1 ms not
// tried)") and measured_s. Collective over `world` (nullptr: one rank); every rank must call it
// with the same `predicted`, `shape` and options. A run's error is returned as it is (the peers
// then wait in their collectives for the communicator's timeout, as in a training step).
absl::StatusOr<Choice> MeasureSchedules(const Choice& predicted, const LayerShape& shape,
                                        comm::Communicator* world, const LayerRun& run,
                                        const TrialOptions& options = {});

// The trial's outcome for a cache (a restarted attempt runs the schedules the first one measured,
// so it continues bit for bit): {"schedule", "reason", "measured_s"}, doubles printed exactly.
std::string TrialToJson(const Choice& measured);
// `predicted` with the cached outcome; InvalidArgument naming what is missing or malformed.
absl::StatusOr<Choice> TrialFromJson(const Choice& predicted, std::string_view text);

}  // namespace furnace::moe
