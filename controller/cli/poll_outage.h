// PollOutage: how a command that polls the controller (watch, logs --follow, submit --watch) rides
// out a controller that is restarting or slow. Once the controller has answered this command, a
// poll that finds it unreachable (UNAVAILABLE) or late (DEADLINE_EXCEEDED) is retried until the
// outage has lasted kPollOutageGraceS; past that, or for any other error, the error stands.
//
// Threading: one per command, on its thread.
#pragma once

#include "absl/status/status.h"
#include "runtime/base/clock.h"

namespace furnace::cli {

inline constexpr double kPollOutageGraceS = 10.0;

class PollOutage {
 public:
  // `answered`: the controller already answered this command (submit --watch: the submission).
  PollOutage(const Clock& clock, bool answered) : clock_(clock), answered_(answered) {}

  // A poll succeeded: any outage is over.
  void Answered() {
    answered_ = true;
    since_ = -1;
  }
  // Whether to poll again (after the usual pause) rather than end with `failed`.
  bool Retry(const absl::Status& failed) {
    if (!answered_ || !(absl::IsUnavailable(failed) || absl::IsDeadlineExceeded(failed))) {
      return false;
    }
    const double now = clock_.MonotonicSeconds();
    if (since_ < 0) since_ = now;
    return now - since_ <= kPollOutageGraceS;
  }

 private:
  const Clock& clock_;
  bool answered_;
  double since_ = -1;  // monotonic seconds of the outage's first failed poll; -1: none
};

}  // namespace furnace::cli
