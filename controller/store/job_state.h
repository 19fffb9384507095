// The job lifecycle (DESIGN.md, Processes):
//   PENDING -> SCHEDULED -> STARTING -> RUNNING -> SUCCEEDED | FAILED | CANCELLED
//   STARTING | RUNNING -> RECOVERING -> STARTING   (a failure while the restart budget lasts)
// plus CANCELLED from every non-final state and FAILED from every non-final state (a job can fail
// before it runs: no placement possible, restart budget spent while recovering).
// Every transition the controller makes goes through CheckTransition; an illegal one is a bug
// and is refused (FailedPrecondition) rather than persisted.
#pragma once

#include <string_view>

#include "absl/status/status.h"
#include "furnace/v1/controller.pb.h"

namespace furnace::controller {

using JobState = furnace::v1::JobState;

bool IsFinal(JobState state);
// Lower-case name for people ("running"); "unknown" for values outside the enum.
const char* StateName(JobState state);
absl::Status CheckTransition(JobState from, JobState to);

}  // namespace furnace::controller
