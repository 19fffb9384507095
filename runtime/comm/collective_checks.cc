#include "runtime/comm/collective_checks.h"

#include <numeric>

#include "absl/strings/str_format.h"
#include "runtime/base/status.h"

namespace furnace::comm {

int64_t Sum(const std::vector<int64_t>& v) {
  return std::accumulate(v.begin(), v.end(), int64_t{0});
}

absl::Status CheckAllReduceArgs(const float* data, int64_t count) {
  if (count < 0 || (count > 0 && data == nullptr)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("count %d with %s data", count, data == nullptr ? "null" : "non-null"));
  }
  return absl::OkStatus();
}

absl::Status CheckReduceScatterArgs(const float* in, const float* out, int64_t count_per_rank) {
  if (count_per_rank < 0 || (count_per_rank > 0 && (in == nullptr || out == nullptr))) {
    return absl::InvalidArgumentError(absl::StrFormat("count_per_rank %d", count_per_rank));
  }
  return absl::OkStatus();
}

absl::Status CheckPerRankSizes(const char* what, const std::vector<int64_t>& sizes, int size) {
  if (static_cast<int>(sizes.size()) != size) {
    return absl::InvalidArgumentError(absl::StrFormat("%s has %d entries", what, sizes.size()));
  }
  for (int64_t s : sizes) {
    if (s < 0) return absl::InvalidArgumentError(absl::StrFormat("%s has a negative entry", what));
  }
  return absl::OkStatus();
}

absl::Status CheckReduceScatterVArgs(const float* in, const float* out,
                                     const std::vector<int64_t>& counts, int rank, int size) {
  RETURN_IF_ERROR(CheckPerRankSizes("counts", counts, size));
  if ((Sum(counts) > 0 && in == nullptr) || (counts[rank] > 0 && out == nullptr)) {
    return absl::InvalidArgumentError("null buffer");
  }
  return absl::OkStatus();
}

absl::Status CheckAllGatherArgs(const void* in, const void* out, int64_t bytes_per_rank) {
  if (bytes_per_rank < 0 || (bytes_per_rank > 0 && (in == nullptr || out == nullptr))) {
    return absl::InvalidArgumentError(absl::StrFormat("bytes_per_rank %d", bytes_per_rank));
  }
  return absl::OkStatus();
}

absl::Status CheckAllGatherVArgs(const void* in, int64_t in_bytes, const void* out,
                                 const std::vector<int64_t>& recv_bytes, int rank, int size) {
  RETURN_IF_ERROR(CheckPerRankSizes("recv_bytes", recv_bytes, size));
  if (recv_bytes[rank] != in_bytes || (in_bytes > 0 && in == nullptr) ||
      (Sum(recv_bytes) > 0 && out == nullptr)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("in_bytes %d but recv_bytes[%d] = %d", in_bytes, rank, recv_bytes[rank]));
  }
  return absl::OkStatus();
}

absl::Status CheckAllToAllVArgs(const void* in, const std::vector<int64_t>& send_bytes,
                                const void* out, const std::vector<int64_t>& recv_bytes, int rank,
                                int size) {
  RETURN_IF_ERROR(CheckPerRankSizes("send_bytes", send_bytes, size));
  RETURN_IF_ERROR(CheckPerRankSizes("recv_bytes", recv_bytes, size));
  if (send_bytes[rank] != recv_bytes[rank] || (Sum(send_bytes) > 0 && in == nullptr) ||
      (Sum(recv_bytes) > 0 && out == nullptr)) {
    return absl::InvalidArgumentError(absl::StrFormat("send_bytes[%d] = %d, recv_bytes[%d] = %d",
                                                      rank, send_bytes[rank], rank,
                                                      recv_bytes[rank]));
  }
  return absl::OkStatus();
}

absl::Status CheckBroadcastArgs(const void* data, int64_t bytes, int root, int size) {
  if (bytes < 0 || (bytes > 0 && data == nullptr) || root < 0 || root >= size) {
    return absl::InvalidArgumentError(absl::StrFormat("bytes %d, root %d", bytes, root));
  }
  return absl::OkStatus();
}

absl::Status CheckPointToPointArgs(const void* data, int64_t bytes, int peer, int size) {
  if (bytes < 0 || (bytes > 0 && data == nullptr) || peer < 0 || peer >= size) {
    return absl::InvalidArgumentError(absl::StrFormat("bytes %d, peer %d", bytes, peer));
  }
  return absl::OkStatus();
}

}  // namespace furnace::comm
