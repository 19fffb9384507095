#include "proto/furnace/v1/state_names.h"

namespace furnace::v1 {

const char* StateWord(JobState state) {
  switch (state) {
    case JOB_PENDING:
      return "pending";
    case JOB_SCHEDULED:
      return "scheduled";
    case JOB_STARTING:
      return "starting";
    case JOB_RUNNING:
      return "running";
    case JOB_RECOVERING:
      return "recovering";
    case JOB_SUCCEEDED:
      return "succeeded";
    case JOB_FAILED:
      return "failed";
    case JOB_CANCELLED:
      return "cancelled";
    default:
      return "";
  }
}

const char* StateWord(RankState state) {
  switch (state) {
    case RANK_STATE_ASSIGNED:
      return "assigned";
    case RANK_STATE_RUNNING:
      return "running";
    case RANK_STATE_EXITED:
      return "exited";
    default:
      return "";
  }
}

const char* StateWord(AttemptState state) {
  switch (state) {
    case ATTEMPT_STATE_RUNNING:
      return "running";
    case ATTEMPT_STATE_FAILED:
      return "failed";
    case ATTEMPT_STATE_SUCCEEDED:
      return "succeeded";
    case ATTEMPT_STATE_CANCELLED:
      return "cancelled";
    case ATTEMPT_STATE_INTERRUPTED:
      return "interrupted";
    default:
      return "";
  }
}

const char* StateWord(WorkerState state) {
  switch (state) {
    case WORKER_STATE_READY:
      return "ready";
    case WORKER_STATE_BUSY:
      return "busy";
    case WORKER_STATE_LOST:
      return "lost";
    default:
      return "";
  }
}

const char* WorkerStateWord(const WorkerInfo& worker) {
  if (worker.state() == WORKER_STATE_LOST && worker.left()) return "left";
  return StateWord(worker.state());
}

}  // namespace furnace::v1
