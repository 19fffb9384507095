// The phases of one recovery (issue 12, item 3c): from the failure of attempt N to the first
// completed step of attempt N+1, computed from the timestamps the controller keeps on both
// attempts (AttemptInfo: failed_unix, ended_unix, ranks_exited_unix, recover_at_unix on the failed
// one; started_unix, all_running_unix and the ranks' start-up points on the next).
//
//   detection        failure (as the culprit's agent saw it) -> the controller failed the attempt
//   teardown         -> every rank of the failed attempt ended   } side by side: placement waits
//   backoff          -> recovery.backoff's delay was over        } for the later of the two
//   placement        the later of the two -> the next attempt placed (free workers found)
//   start            -> every rank process launched (their agents' start reports)
//   rendezvous       -> every rank connected to its groups
//   setup            -> every rank built its model, memory policy, MoE schedules, peak FLOPs
//   checkpoint_load  -> every rank restored the newest checkpoint
//   first_step       -> every rank completed its first step
//
// Rank-side points are the latest over the attempt's ranks (the slowest rank sets the pace), on
// the ranks' clocks; a phase that would come out negative (clocks of different machines) is 0.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "furnace/v1/controller.pb.h"

namespace furnace::controller {

// When `failed` failed: as the culprit's agent saw it (a hang: the start of the phase it
// overran), else when the controller ended it. The start of a recovery's time.
double FailureUnix(const furnace::v1::AttemptInfo& failed);

// nullopt until `next` has completed its first step (and `failed` has a failure time).
std::optional<furnace::v1::RecoveryPhases> RecoveryPhasesOf(const furnace::v1::AttemptInfo& failed,
                                                            const furnace::v1::AttemptInfo& next);

// (phase, seconds) in timeline order: the label values of furnace_recovery_phase_seconds.
std::vector<std::pair<std::string, double>> RecoveryPhaseList(
    const furnace::v1::RecoveryPhases& phases);

// "6.21 s from the failure to the first step: detection 0.05 s, teardown 0.10 s, backoff 1.00 s,
// ... (longest: setup)".
std::string RecoveryPhasesLine(const furnace::v1::RecoveryPhases& phases);

}  // namespace furnace::controller
