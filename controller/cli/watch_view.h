// What `furnace watch` shows, as pure functions of the JobDetail the controller returned (and the
// time now), so that both renderings are testable without a terminal or a controller.
//   TTY: a frame of lines redrawn in place each poll (WatchFrame, then RedrawFrame).
//   Not a TTY: a line only when something changed since the previous poll (PlainWatchLines).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "furnace/v1/controller.pb.h"

namespace furnace::cli {

// The lines of one TTY frame: job and state, attempt and restarts, a progress bar with step and
// elapsed time, the cause (while recovering or once ended; "restarted after: ..." while a later
// attempt runs), the last event, and the latest commcheck row per collective. A train job adds an
// ETA to the progress line (EstimateEtaSeconds from `observed_steps_per_second`, 0 when not yet
// measured) and two lines of training figures (loss, tokens/s, MFU; imbalance, dropped tokens,
// memory against the budget). Each line is cut to `width` columns so the terminal never wraps
// (which would break the redraw).
std::vector<std::string> WatchFrame(const v1::JobDetail& job, double now_unix, int width,
                                    double observed_steps_per_second = 0);

// The bytes that replace a frame of `previous_lines` lines already on screen with `lines`: cursor
// up, then each line cleared and rewritten; leftover old lines are cleared. The cursor ends below
// the new frame.
std::string RedrawFrame(int previous_lines, const std::vector<std::string>& lines);

// The plain lines for a change from `previous` (null at the first poll) to `current`: one line per
// event not seen before, then one status line when the state, attempt or step changed (a train
// job's with loss, tokens/s and MFU; the cause only while recovering or once ended: a running
// attempt's line carries no earlier attempt's cause). Empty when nothing changed.
std::vector<std::string> PlainWatchLines(const v1::JobDetail* previous,
                                         const v1::JobDetail& current);

// The closing line: "job j-1 SUCCEEDED after 1m05s (attempt 2, 1 restart), step 10/10: <cause>";
// a train job's adds its last loss after the step.
std::string WatchSummary(const v1::JobDetail& job, double now_unix);

// The step rate watch measures across polls, for the ETA. Samples (monotonic seconds, step) older
// than `window_s` are dropped (the latest two always kept); a new attempt or a step that went back
// starts over, since a restart resumes from a checkpoint. Thread-compatible.
class StepRate {
 public:
  explicit StepRate(double window_s = 60.0) : window_s_(window_s) {}
  void Observe(double monotonic_s, uint32_t attempt, uint64_t step);
  // Steps per second over the window; 0 until two samples at least a step apart.
  double steps_per_second() const;

 private:
  struct Sample {
    double t;
    uint64_t step;
  };
  double window_s_;
  uint32_t attempt_ = 0;
  std::vector<Sample> samples_;
};

}  // namespace furnace::cli
