#include "runtime/comm/commcheck_payload.h"

#include <algorithm>

#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"

namespace furnace::comm {
namespace {

constexpr uint32_t kIndexMask = (1u << 20) - 1;

// Weight of the (src, dst) chunk in alltoallv: 1..3, so chunks differ between peers and between
// senders.
uint64_t AlltoallvWeight(int src, int dst) { return 1 + static_cast<uint64_t>(src + 2 * dst) % 3; }

void Record(VerifyResult& result, absl::string_view collective, uint64_t position, int32_t got,
            int32_t want) {
  if (result.errors++ == 0) {
    result.first_error =
        absl::StrFormat("%s element %d: got 0x%08x (%s), want 0x%08x (%s)", collective, position,
                        static_cast<uint32_t>(got), DescribeElement(got),
                        static_cast<uint32_t>(want), DescribeElement(want));
  }
}

// The allreduce element of `rank` at index i: a rank factor times an index factor (header).
int AllreduceRankFactor(int rank) { return rank % 4 + 1; }
int AllreduceIndexFactor(uint64_t i, uint32_t iter) { return static_cast<int>((i + iter) % 3) + 1; }

}  // namespace

int32_t EncodeElement(int src_rank, uint64_t index, uint32_t iter) {
  const uint64_t shifted = index + 4099 * (static_cast<uint64_t>(src_rank) >> 8);
  const uint32_t word = (static_cast<uint32_t>(src_rank) & 0xFFu) << 24 | (iter & 0xFu) << 20 |
                        (static_cast<uint32_t>(shifted) & kIndexMask);
  return static_cast<int32_t>(word);
}

std::string DescribeElement(int32_t word) {
  const uint32_t w = static_cast<uint32_t>(word);
  return absl::StrFormat("src %d iter %d index %d", w >> 24, (w >> 20) & 0xFu, w & kIndexMask);
}

void FillAllreduce(int rank, uint32_t iter, std::span<float> buffer) {
  for (uint64_t i = 0; i < buffer.size(); ++i) {
    buffer[i] = static_cast<float>(AllreduceRankFactor(rank) * AllreduceIndexFactor(i, iter));
  }
}

VerifyResult VerifyAllreduce(int world_size, uint32_t iter, std::span<const float> buffer) {
  VerifyResult result;
  int64_t rank_sum = 0;
  for (int r = 0; r < world_size; ++r) rank_sum += AllreduceRankFactor(r);
  for (uint64_t i = 0; i < buffer.size(); ++i) {
    const float want = static_cast<float>(rank_sum * AllreduceIndexFactor(i, iter));
    if (buffer[i] != want && result.errors++ == 0) {
      result.first_error =
          absl::StrFormat("allreduce element %d: got %g, want %g", i, buffer[i], want);
    }
  }
  return result;
}

void FillAllgatherInput(int rank, uint32_t iter, std::span<int32_t> input) {
  for (uint64_t i = 0; i < input.size(); ++i) input[i] = EncodeElement(rank, i, iter);
}

VerifyResult VerifyAllgather(int world_size, uint32_t iter, std::span<const int32_t> output) {
  VerifyResult result;
  const uint64_t per_rank = output.size() / static_cast<uint64_t>(world_size);
  for (uint64_t k = 0; k < output.size(); ++k) {
    const int32_t want = EncodeElement(static_cast<int>(k / per_rank), k % per_rank, iter);
    if (output[k] != want) Record(result, "allgather", k, output[k], want);
  }
  return result;
}

int64_t AlltoallvCount(int src, int dst, int world_size, uint64_t elements_per_rank) {
  uint64_t total_weight = 0;
  for (int p = 0; p < world_size; ++p) total_weight += AlltoallvWeight(src, p);
  const uint64_t count = elements_per_rank * AlltoallvWeight(src, dst) / total_weight;
  if (dst != world_size - 1) return static_cast<int64_t>(count);
  // The last destination takes the rounding remainder so each sender sends exactly
  // elements_per_rank.
  uint64_t others = 0;
  for (int p = 0; p + 1 < world_size; ++p) {
    others += elements_per_rank * AlltoallvWeight(src, p) / total_weight;
  }
  return static_cast<int64_t>(elements_per_rank - others);
}

std::vector<int64_t> AlltoallvSendCounts(int rank, int world_size, uint64_t elements_per_rank) {
  std::vector<int64_t> counts(world_size);
  for (int p = 0; p < world_size; ++p) {
    counts[p] = AlltoallvCount(rank, p, world_size, elements_per_rank);
  }
  return counts;
}

std::vector<int64_t> AlltoallvRecvCounts(int rank, int world_size, uint64_t elements_per_rank) {
  std::vector<int64_t> counts(world_size);
  for (int s = 0; s < world_size; ++s) {
    counts[s] = AlltoallvCount(s, rank, world_size, elements_per_rank);
  }
  return counts;
}

void FillAlltoallvInput(int rank, uint32_t iter, std::span<int32_t> input) {
  for (uint64_t j = 0; j < input.size(); ++j) input[j] = EncodeElement(rank, j, iter);
}

VerifyResult VerifyAlltoallv(int rank, int world_size, uint64_t elements_per_rank, uint32_t iter,
                             std::span<const int32_t> output) {
  VerifyResult result;
  uint64_t position = 0;
  for (int src = 0; src < world_size; ++src) {
    // Where this rank's chunk starts in the sender's send buffer.
    uint64_t src_offset = 0;
    for (int p = 0; p < rank; ++p)
      src_offset += AlltoallvCount(src, p, world_size, elements_per_rank);
    const uint64_t count = AlltoallvCount(src, rank, world_size, elements_per_rank);
    for (uint64_t k = 0; k < count; ++k, ++position) {
      const int32_t want = EncodeElement(src, src_offset + k, iter);
      const int32_t got = position < output.size() ? output[position] : kPoison;
      if (got != want) Record(result, "alltoallv", position, got, want);
    }
  }
  // Anything past the expected total is a size mismatch: count every extra word.
  for (; position < output.size(); ++position) {
    Record(result, "alltoallv (beyond expected size)", position, output[position], kPoison);
  }
  return result;
}

int BroadcastRoot(uint32_t iter, int world_size) {
  return static_cast<int>(iter % static_cast<uint32_t>(world_size));
}

void FillBroadcast(int rank, int root, uint32_t iter, std::span<int32_t> buffer) {
  if (rank == root) {
    for (uint64_t i = 0; i < buffer.size(); ++i) buffer[i] = EncodeElement(root, i, iter);
  } else {
    std::fill(buffer.begin(), buffer.end(), kPoison);
  }
}

VerifyResult VerifyBroadcast(int root, uint32_t iter, std::span<const int32_t> buffer) {
  VerifyResult result;
  for (uint64_t i = 0; i < buffer.size(); ++i) {
    const int32_t want = EncodeElement(root, i, iter);
    if (buffer[i] != want) Record(result, "broadcast", i, buffer[i], want);
  }
  return result;
}

}  // namespace furnace::comm
