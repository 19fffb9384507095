// A training job's goodput (furnace.v1.JobGoodput: where its time went, controller/store/goodput.h)
// as `furnace status` and `furnace report` show it: key/value rows, a pure function of the message.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "furnace/v1/controller.pb.h"

namespace furnace::cli {

// Whether the job has measured anything yet (a step, or a start-up or recovery in progress).
bool HasGoodput(const v1::JobDetail& job);

// The rows, e.g.
//   goodput      96.3%  (productive 1m12s over 300 steps)
//   lost         2.8 s: restart 1.9 s, redone 0.6 s (12 steps), checkpoint stall 0.2 s, ...
//   recovering   3.1 s so far (counted as restart once the next attempt steps)
//   failures     2, MTBF 31s observed
//   interval     checkpoint.every auto: 25 steps (1.2 s)
std::vector<std::pair<std::string, std::string>> GoodputRows(const v1::JobGoodput& goodput);

// The "goodput" section of `furnace status`: a blank line, a heading and the rows; empty when the
// job has measured nothing yet.
std::string RenderGoodputSection(const v1::JobDetail& job);

}  // namespace furnace::cli
