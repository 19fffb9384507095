// The "no progress" rung of the restart ladder: a job whose attempts keep failing before they get
// past the step the job had already reached gains nothing from another restart, so after
// recovery.max_attempts_without_progress such attempts in a row it ends FAILED. A pure function of
// the attempts so the rule is testable on its own.
//
// An attempt's step is the lowest latest step over its ranks (what the job has certainly reached:
// train steps completed, or commcheck rounds). An attempt makes progress when its step passes the
// highest step of every attempt before it (0 before the first), so a resumed attempt that fails
// again before the step where the last one failed counts as no progress, and a health-check
// failure (the attempt never trained) always does. Only attempts under the same conditions as the
// newest count: one with another memory policy (an out-of-memory escalation) or another layout
// (recovery.shrink) ends the run, since a change may be what helps. Interrupted attempts (the
// controller stopped its own workers) neither count nor break a run.
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "furnace/v1/controller.pb.h"

namespace furnace::controller {

// The lowest latest step over the attempt's ranks (0 without ranks).
uint64_t AttemptStep(const furnace::v1::AttemptInfo& attempt);

struct NoProgress {
  uint32_t attempts = 0;  // failed attempts at the end of the list that made no progress
  uint64_t step = 0;      // the step none of them got past
};
NoProgress AttemptsWithoutProgress(const std::vector<furnace::v1::AttemptInfo>& attempts);

// The workers the next attempt should avoid (placement.h: used only when no spare is free): where
// the newest failed attempt's failure was blamed (AttemptInfo::culprit_worker), and where each
// failure of the run of attempts without progress before it was. A job whose attempts keep
// failing on different workers thus moves on to workers it has not failed on, rather than going
// back and forth between two; once an attempt makes progress, only its own culprit stays. A pure
// function of the stored attempts, so a restarted controller places as the one before it would.
std::set<std::string> SuspectWorkers(const std::vector<furnace::v1::AttemptInfo>& attempts);

}  // namespace furnace::controller
