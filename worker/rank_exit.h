// The exit-code contract between a rank process (`furnace-worker rank`) and its agent. The agent
// classifies a rank's end from these (worker/rank_supervisor.h); fault injection may use others.
#pragma once

namespace furnace::worker {

inline constexpr int kRankExitSuccess = 0;
inline constexpr int kRankExitError = 1;        // any error; the reason is on stderr and in telemetry
inline constexpr int kRankExitUnknownKind = 2;  // the job kind is not in this build
inline constexpr int kRankExitOutOfMemory = 3;  // the rank ran out of (device) memory

}  // namespace furnace::worker
