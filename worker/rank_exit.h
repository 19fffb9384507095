// The exit-code contract between a rank process (`furnace-worker rank`), its agent and the
// controller: furnace.v1.RankExitCode (proto/furnace/v1/agent.proto). Fault injection may use
// other codes.
#pragma once

#include "furnace/v1/agent.pb.h"

namespace furnace::worker {

inline constexpr int kRankExitSuccess = furnace::v1::RANK_EXIT_SUCCESS;
inline constexpr int kRankExitError = furnace::v1::RANK_EXIT_ERROR;
inline constexpr int kRankExitUnknownKind = furnace::v1::RANK_EXIT_UNKNOWN_KIND;
inline constexpr int kRankExitOutOfMemory = furnace::v1::RANK_EXIT_OUT_OF_MEMORY;
inline constexpr int kRankExitBadInput = furnace::v1::RANK_EXIT_BAD_INPUT;
inline constexpr int kRankExitHealthCheck = furnace::v1::RANK_EXIT_HEALTH_CHECK;
inline constexpr int kRankExitCorruptData = furnace::v1::RANK_EXIT_CORRUPT_DATA;
inline constexpr int kRankExitStopped = furnace::v1::RANK_EXIT_STOPPED;

}  // namespace furnace::worker
