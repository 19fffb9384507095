// What `furnace watch` shows, as pure functions of the JobDetail the controller returned (and the
// time now), so that both renderings are testable without a terminal or a controller.
//   TTY: a frame of lines redrawn in place each poll (WatchFrame, then RedrawFrame).
//   Not a TTY: a line only when something changed since the previous poll (PlainWatchLines).
#pragma once

#include <string>
#include <vector>

#include "furnace/v1/controller.pb.h"

namespace furnace::cli {

// The lines of one TTY frame: job and state, attempt and restarts, a progress bar with step and
// elapsed time, the last event, latest metrics if any, and the latest commcheck row per collective.
// Each line is cut to `width` columns so the terminal never wraps (which would break the redraw).
std::vector<std::string> WatchFrame(const v1::JobDetail& job, double now_unix, int width);

// The bytes that replace a frame of `previous_lines` lines already on screen with `lines`: cursor
// up, then each line cleared and rewritten; leftover old lines are cleared. The cursor ends below
// the new frame.
std::string RedrawFrame(int previous_lines, const std::vector<std::string>& lines);

// The plain lines for a change from `previous` (null at the first poll) to `current`: one status
// line when the state, attempt or step changed, and one line per event not seen before. Empty when
// nothing changed.
std::vector<std::string> PlainWatchLines(const v1::JobDetail* previous,
                                         const v1::JobDetail& current);

// The closing line: "job j-1 SUCCEEDED after 1m05s (attempt 2, 1 restart: <cause>), step 10/10".
std::string WatchSummary(const v1::JobDetail& job, double now_unix);

}  // namespace furnace::cli
