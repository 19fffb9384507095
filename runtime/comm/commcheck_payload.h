// Payloads and their checks for the communication health check (commcheck.h), kept apart from the
// collectives so that tests can feed the checks deliberately wrong buffers.
//
// Integer payloads (allgather, alltoallv, broadcast) encode who sent an element, where it sat in
// the sender's buffer and which call produced it, so a misrouted, misplaced or stale element shows
// up by value (the NCCL/DeepEP test idea). One int32 holds
//   bits 31..24: sender rank mod 256 | bits 23..20: iteration mod 16 |
//   bits 19..0: (index + 4099 * (sender rank / 256)) mod 2^20,
// so in worlds over 256 ranks an element of rank r + 256 in rank r's place shows up too.
// Checks compare whole words against the expected word, and the receiver refills its output with
// kPoison before every call, so a word the collective never wrote is caught too.
//
// Float payloads (allreduce) are (rank % 4 + 1) * ((i + iter) % 3 + 1): every partial sum, in
// whatever order the collective adds, is an integer of at most 12 * world_size, exact in float32
// up to a million ranks, so the check is exact equality. A missing or doubled contribution changes
// the sum, and so does a stale iteration (the second factor); one rank's buffer used in place of
// another's with the same rank % 4 does not (the integer payloads below check who sent what).

// All functions are pure and thread-safe.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace furnace::comm {

// Mismatch count of one check plus a description of the first mismatch (empty when none).
struct VerifyResult {
  uint64_t errors = 0;
  std::string first_error;
};

// A word no collective output should still hold after the call.
inline constexpr int32_t kPoison = static_cast<int32_t>(0xDEADBEEFu);

int32_t EncodeElement(int src_rank, uint64_t index, uint32_t iter);
// "src 3 iter 1 index 17" for a word (the low bits only, as encoded: the rank mod 256, and for
// ranks from 256 the index field holds the shifted index).
std::string DescribeElement(int32_t word);

// allreduce: in-place on float32.
void FillAllreduce(int rank, uint32_t iter, std::span<float> buffer);
VerifyResult VerifyAllreduce(int world_size, uint32_t iter, std::span<const float> buffer);

// allgather: each rank contributes `input.size()` elements; output holds world_size of them.
void FillAllgatherInput(int rank, uint32_t iter, std::span<int32_t> input);
VerifyResult VerifyAllgather(int world_size, uint32_t iter, std::span<const int32_t> output);

// alltoallv with uneven counts: every rank sends `elements_per_rank` elements in total, split
// unevenly over the destinations by weights that depend on (src, dst); what a rank receives
// therefore varies too. Element j of a rank's send buffer encodes (rank, j, iter).
int64_t AlltoallvCount(int src, int dst, int world_size, uint64_t elements_per_rank);
std::vector<int64_t> AlltoallvSendCounts(int rank, int world_size, uint64_t elements_per_rank);
std::vector<int64_t> AlltoallvRecvCounts(int rank, int world_size, uint64_t elements_per_rank);
void FillAlltoallvInput(int rank, uint32_t iter, std::span<int32_t> input);
VerifyResult VerifyAlltoallv(int rank, int world_size, uint64_t elements_per_rank, uint32_t iter,
                             std::span<const int32_t> output);

// broadcast: the root rotates with the iteration. The root's buffer holds its payload, every other
// rank's buffer is poisoned before the call.
int BroadcastRoot(uint32_t iter, int world_size);
void FillBroadcast(int rank, int root, uint32_t iter, std::span<int32_t> buffer);
VerifyResult VerifyBroadcast(int root, uint32_t iter, std::span<const int32_t> buffer);

}  // namespace furnace::comm
