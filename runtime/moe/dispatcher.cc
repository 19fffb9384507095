#include "runtime/moe/dispatcher.h"

#include <cstring>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "runtime/base/status.h"
#include "runtime/tensor/transfer.h"

namespace furnace::moe {
namespace {

std::vector<int64_t> Scaled(const std::vector<int64_t>& rows, int64_t bytes_per_row) {
  std::vector<int64_t> out(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) out[i] = rows[i] * bytes_per_row;
  return out;
}

int64_t Sum(const std::vector<int64_t>& v) {
  return std::accumulate(v.begin(), v.end(), int64_t{0});
}

// Row i of `from` to row map[i] of `to` (to_mapped) or row map[i] of `from` to row i of `to`, one
// copy per run of consecutive rows (the map is a permutation of (q, s, le) blocks).
absl::Status PermuteRows(device::Device* device, const std::vector<int64_t>& map, bool to_mapped,
                         const float* from, float* to, int C) {
  const int64_t row_bytes = int64_t{C} * sizeof(float);
  const int64_t R = static_cast<int64_t>(map.size());
  for (int64_t i = 0; i < R;) {
    int64_t run = 1;
    while (i + run < R && map[i + run] == map[i] + run) ++run;
    const float* src = to_mapped ? from + i * C : from + map[i] * C;
    float* dst = to_mapped ? to + map[i] * C : to + i * C;
    RETURN_IF_ERROR(ExpertDispatcher::CopyRows(device, dst, src, run * row_bytes));
    i += run;
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ExpertDispatcher::CopyRows(device::Device* device, void* dst, const void* src,
                                        int64_t bytes) {
  if (bytes <= 0 || dst == src) return absl::OkStatus();
  if (device != nullptr) {
    return tensor::CopyOnDevice(*device, dst, src, static_cast<size_t>(bytes));
  }
  std::memmove(dst, src, static_cast<size_t>(bytes));
  return absl::OkStatus();
}

int64_t DispatchHandle::A() const { return Sum(recv_rows); }

ExpertDispatcher::ExpertDispatcher(ExpertGroups groups, int experts)
    : groups_(groups), E_(experts) {}

int64_t ExpertDispatcher::ScratchRows(const DispatchHandle& h) { return h.A() + h.R(); }

absl::StatusOr<DispatchHandle> ExpertDispatcher::Prepare(
    const std::vector<int64_t>& expert_counts) const {
  DispatchHandle h;
  h.E = E_;
  h.ep = groups_.ep_size();
  h.esp = groups_.esp_size();
  if (static_cast<int>(expert_counts.size()) != E_ || E_ % h.ep != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "dispatch: ", expert_counts.size(), " expert counts for E = ", E_, " over ep = ", h.ep));
  }
  h.El = E_ / h.ep;
  const int El = h.El;
  h.S = Sum(expert_counts);
  h.send_rows.assign(h.ep, 0);
  for (int e = 0; e < E_; ++e) h.send_rows[e / El] += expert_counts[e];

  // Counts for my local experts from every EP source: chunk j of my counts goes to EP rank j.
  std::vector<int64_t> from_sources(static_cast<size_t>(h.ep) * El);
  if (h.ep == 1) {
    from_sources = expert_counts;
  } else {
    const std::vector<int64_t> chunk(h.ep, El * int64_t{sizeof(int64_t)});
    RETURN_IF_ERROR(groups_.ep->AllToAllV(expert_counts.data(), chunk, from_sources.data(), chunk));
  }
  h.recv_rows.assign(h.ep, 0);
  for (int s = 0; s < h.ep; ++s) {
    for (int le = 0; le < El; ++le) h.recv_rows[s] += from_sources[s * El + le];
  }

  // What every ESP peer received, so each can lay out the gathered rows.
  std::vector<int64_t> all(static_cast<size_t>(h.esp) * h.ep * El);
  if (h.esp == 1) {
    all = from_sources;
  } else {
    RETURN_IF_ERROR(groups_.esp->AllGather(from_sources.data(), all.data(),
                                           from_sources.size() * sizeof(int64_t)));
  }
  h.counts.assign(h.esp, std::vector<std::vector<int64_t>>(h.ep, std::vector<int64_t>(El)));
  h.peer_rows.assign(h.esp, 0);
  for (int q = 0; q < h.esp; ++q) {
    for (int s = 0; s < h.ep; ++s) {
      for (int le = 0; le < El; ++le) {
        const int64_t c = all[(static_cast<size_t>(q) * h.ep + s) * El + le];
        h.counts[q][s][le] = c;
        h.peer_rows[q] += c;
      }
    }
  }

  // Gathered order: (q, s, le); expert order: (le, q, s).
  h.expert_offsets.assign(El + 1, 0);
  for (int le = 0; le < El; ++le) {
    int64_t n = 0;
    for (int q = 0; q < h.esp; ++q)
      for (int s = 0; s < h.ep; ++s) n += h.counts[q][s][le];
    h.expert_offsets[le + 1] = h.expert_offsets[le] + n;
  }
  std::vector<int64_t> cursor(h.expert_offsets.begin(), h.expert_offsets.end() - 1);
  // Expert-order start of each (q, s, le) block, filled in (le, q, s) order.
  std::vector<int64_t> block_start(static_cast<size_t>(h.esp) * h.ep * El);
  for (int le = 0; le < El; ++le) {
    for (int q = 0; q < h.esp; ++q) {
      for (int s = 0; s < h.ep; ++s) {
        block_start[(static_cast<size_t>(q) * h.ep + s) * El + le] = cursor[le];
        cursor[le] += h.counts[q][s][le];
      }
    }
  }
  h.gathered_to_expert.resize(h.R());
  int64_t g = 0;
  for (int q = 0; q < h.esp; ++q) {
    for (int s = 0; s < h.ep; ++s) {
      for (int le = 0; le < El; ++le) {
        const int64_t start = block_start[(static_cast<size_t>(q) * h.ep + s) * El + le];
        for (int64_t i = 0; i < h.counts[q][s][le]; ++i) h.gathered_to_expert[g++] = start + i;
      }
    }
  }
  return h;
}

absl::StatusOr<const float*> ExpertDispatcher::DispatchCommunicate(const DispatchHandle& h,
                                                                   const float* rows, int C,
                                                                   float* scratch) const {
  const int64_t row_bytes = int64_t{C} * sizeof(float);
  // EP all-to-all: rows (S) -> received (A).
  const float* received = rows;
  if (h.ep > 1) {
    RETURN_IF_ERROR(groups_.ep->AllToAllV(rows, Scaled(h.send_rows, row_bytes), scratch,
                                          Scaled(h.recv_rows, row_bytes)));
    received = scratch;
  }
  // ESP all-gather: received (A) -> gathered (R), peers in rank order.
  if (h.esp == 1) return received;
  float* gathered = scratch + h.A() * C;
  RETURN_IF_ERROR(groups_.esp->AllGatherV(received, h.A() * row_bytes, gathered,
                                          Scaled(h.peer_rows, row_bytes)));
  return gathered;
}

absl::Status ExpertDispatcher::DispatchFinish(const DispatchHandle& h, const float* gathered, int C,
                                              float* out) const {
  return PermuteRows(groups_.device, h.gathered_to_expert, /*to_mapped=*/true, gathered, out, C);
}

absl::StatusOr<const float*> ExpertDispatcher::CombinePrepare(const DispatchHandle& h,
                                                              const float* rows, int C,
                                                              float* scratch) const {
  float* gathered = scratch + h.A() * C;
  RETURN_IF_ERROR(
      PermuteRows(groups_.device, h.gathered_to_expert, /*to_mapped=*/false, rows, gathered, C));
  return gathered;
}

absl::Status ExpertDispatcher::CombineCommunicate(const DispatchHandle& h, const float* gathered,
                                                  int C, float* scratch, float* out) const {
  const int64_t row_bytes = int64_t{C} * sizeof(float);
  // ESP reduce-scatter: the peers' hidden-width partial outputs summed, each peer its own rows.
  const float* mine = gathered;
  if (h.esp > 1) {
    std::vector<int64_t> counts(h.peer_rows.size());
    for (size_t q = 0; q < counts.size(); ++q) counts[q] = h.peer_rows[q] * C;
    RETURN_IF_ERROR(groups_.esp->ReduceScatterV(gathered, scratch, counts));
    mine = scratch;
  }
  // EP all-to-all back to the sources, in the order they sent.
  if (h.ep > 1) {
    return groups_.ep->AllToAllV(mine, Scaled(h.recv_rows, row_bytes), out,
                                 Scaled(h.send_rows, row_bytes));
  }
  return CopyRows(groups_.device, out, mine, h.S * row_bytes);
}

absl::Status ExpertDispatcher::ToExperts(const DispatchHandle& h, const float* rows, float* out,
                                         int C, float* scratch) const {
  ASSIGN_OR_RETURN(const float* gathered, DispatchCommunicate(h, rows, C, scratch));
  return DispatchFinish(h, gathered, C, out);
}

absl::Status ExpertDispatcher::FromExperts(const DispatchHandle& h, const float* rows, float* out,
                                           int C, float* scratch) const {
  ASSIGN_OR_RETURN(const float* gathered, CombinePrepare(h, rows, C, scratch));
  return CombineCommunicate(h, gathered, C, scratch, out);
}

}  // namespace furnace::moe
