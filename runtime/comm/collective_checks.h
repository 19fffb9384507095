// Argument checks shared by the Gloo and NCCL communicators (internal to furnace_comm): the part of
// communicator.h's contract one rank can check on its own before it touches the transport, so both
// implementations reject exactly the same calls with the same words.
//
// Each returns OK or InvalidArgument whose message is only the detail ("send_bytes has 3 entries");
// the communicator prefixes its own "<backend> <op> on <group> (rank r of n)" and makes the result
// its sticky error. `size` is the group's size, `rank` this rank in it. Pure functions: any thread.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"

namespace furnace::comm {

// The sum of a per-rank size vector.
int64_t Sum(const std::vector<int64_t>& v);

absl::Status CheckAllReduceArgs(const float* data, int64_t count);

// ReduceScatter: `count_per_rank` floats per rank; buffers for the whole input and this rank's
// chunk.
absl::Status CheckReduceScatterArgs(const float* in, const float* out, int64_t count_per_rank);

// `sizes` (named `what` in the message) has one non-negative entry per rank.
absl::Status CheckPerRankSizes(const char* what, const std::vector<int64_t>& sizes, int size);

// ReduceScatterV: counts per rank, and buffers for the whole input and this rank's chunk.
absl::Status CheckReduceScatterVArgs(const float* in, const float* out,
                                     const std::vector<int64_t>& counts, int rank, int size);

absl::Status CheckAllGatherArgs(const void* in, const void* out, int64_t bytes_per_rank);

// AllGatherV: recv_bytes per rank, recv_bytes[rank] == in_bytes, and buffers where bytes move.
absl::Status CheckAllGatherVArgs(const void* in, int64_t in_bytes, const void* out,
                                 const std::vector<int64_t>& recv_bytes, int rank, int size);

// AllToAllV: both size vectors per rank, the chunk to self the same size on both sides, and
// buffers where bytes move.
absl::Status CheckAllToAllVArgs(const void* in, const std::vector<int64_t>& send_bytes,
                                const void* out, const std::vector<int64_t>& recv_bytes, int rank,
                                int size);

absl::Status CheckBroadcastArgs(const void* data, int64_t bytes, int root, int size);

// Send and Recv.
absl::Status CheckPointToPointArgs(const void* data, int64_t bytes, int peer, int size);

}  // namespace furnace::comm
