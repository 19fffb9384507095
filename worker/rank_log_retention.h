// Rank log retention on a worker: the agent writes each rank's output to
// <work-dir>/logs/<job>/attempt-<a>/rank-<r>.log (worker/agent.cc), and the controller keeps its
// own copy of every line it received. A long-lived worker would keep every job's local copy
// forever; with --keep-rank-logs SECONDS the agent removes a job's directory once none of its
// files has changed for that long and no rank of the job runs on it.
//
// Ownership: the files are the agent's; nothing else on the worker writes them.
// Threading: a plain function over the file system, called from the agent's own sweeper thread
// (a slow disk must not hold its heartbeats back).
// Errors: a directory that cannot be read or removed is skipped and named in a warning; it is
// tried again next pass.
#pragma once

#include <cstddef>
#include <functional>
#include <mutex>
#include <string>

namespace furnace::worker {

// The allowed --keep-rank-logs values: 0 keeps every job's logs; otherwise at least this long.
inline constexpr double kMinKeepRankLogsS = 3600;
// How often the agent looks (and once at start).
inline constexpr double kRankLogSweepEveryS = 600;

struct RankLogSweep {
  size_t removed = 0;      // job directories removed
  size_t kept_active = 0;  // stale by their files' times, but a rank of the job runs here
};

// Removes each directory under `logs_dir` (one per job, named as the agent names it) whose newest
// file was last modified more than `keep_s` seconds before `now_unix`, unless `active(name)` says
// a rank of that job runs here. `guard` (may be null) is held across each stale directory's
// `active` check and its removal, so a rank the agent starts under it meanwhile (opening a new
// log in that directory) is either seen as active or starts after the removal. keep_s <= 0
// removes nothing. A missing logs_dir is no error.
RankLogSweep SweepRankLogs(const std::string& logs_dir, double keep_s, double now_unix,
                           const std::function<bool(const std::string&)>& active,
                           std::mutex* guard = nullptr);

}  // namespace furnace::worker
