// fault.mean_steps: failures at random steps, for benchmarks of goodput under a failure rate
// (bench/recovery/goodput.py). In each attempt the faulty rank fails after K of the steps it
// computes (redone steps count: a failure rate is per unit of work, not per step of progress),
// K geometric with mean fault.mean_steps: each computed step fails with probability
// 1 / mean_steps. K is drawn from train.seed and the attempt, so a run replays exactly.
#pragma once

#include <cstdint>
#include <optional>

#include "furnace/v1/agent.pb.h"
#include "worker/rank_progress.h"

namespace furnace::worker {

// The number of computed steps (>= 1) after which an attempt fails: geometric with mean
// `mean_steps` (>= 1), a pure function of (mean_steps, seed, attempt).
uint64_t FaultAfterSteps(uint32_t mean_steps, uint64_t seed, uint32_t attempt);

// Fires spec.fault (its mode, on its rank, in the attempts it names) when `computed`, the steps
// this attempt has computed, reaches FaultAfterSteps; `done` is the step just completed (for the
// messages). nullopt when fault.mean_steps is 0 or it is not time; else as MaybeInjectFault.
std::optional<int> MaybeInjectRandomFault(const furnace::v1::RankTask& task, uint64_t computed,
                                          uint64_t done, Progress& progress);

}  // namespace furnace::worker
