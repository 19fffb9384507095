#include "controller/store/job_state.h"

#include "absl/strings/str_cat.h"
#include "proto/furnace/v1/state_names.h"

namespace furnace::controller {

using v1::JobState;

bool IsFinal(JobState state) {
  return state == v1::JOB_SUCCEEDED || state == v1::JOB_FAILED || state == v1::JOB_CANCELLED;
}

const char* StateName(JobState state) {
  const char* word = v1::StateWord(state);
  return *word ? word : "unknown";
}

absl::Status CheckTransition(JobState from, JobState to) {
  bool legal = false;
  if (!IsFinal(from) && from != v1::JOB_STATE_UNSPECIFIED &&
      (to == v1::JOB_FAILED || to == v1::JOB_CANCELLED)) {
    legal = true;
  } else {
    switch (from) {
      case v1::JOB_PENDING:
        legal = to == v1::JOB_SCHEDULED;
        break;
      case v1::JOB_SCHEDULED:
        legal = to == v1::JOB_STARTING;
        break;
      case v1::JOB_STARTING:
        legal = to == v1::JOB_RUNNING || to == v1::JOB_RECOVERING;
        break;
      case v1::JOB_RUNNING:
        legal = to == v1::JOB_SUCCEEDED || to == v1::JOB_RECOVERING;
        break;
      case v1::JOB_RECOVERING:
        legal = to == v1::JOB_STARTING;
        break;
      default:
        legal = false;
    }
  }
  if (legal) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat("illegal job transition ", StateName(from), " -> ", StateName(to)));
}

}  // namespace furnace::controller
