// ExpertDispatcher: moves the rows of an MoE layer between the ranks that route tokens and the
// ranks that hold the experts, for expert parallelism (EP) with expert sharding (ESP). This is the
// `deepspeed` schedule (DESIGN.md "MoE layer schedules"): every rank sends its own routed rows, so
// tensor-parallel peers, which hold the same tokens, each send and receive their copy. (Where the
// experts are sliced, ScheduleExecutor gives it no ESP group and all-reduces over esp itself:
// executor.h.)
//
// Row orders. A rank's routed rows (S, C) come out of the gate grouped by global expert (token
// order within an expert). EP rank j holds experts [j*El, (j+1)*El). The expert-side buffer
// (R, C) holds every row this rank's experts must process, grouped by local expert, and inside an
// expert by (ESP peer q, EP source s): exactly the rows of the ESP group's members, because every
// ESP rank computes its hidden-width slice of the expert for all of them.
//
//   ToExperts   (S, C) -> (R, C):  all-to-all over EP, all-gather over ESP, regroup by expert.
//   FromExperts (R, C) -> (S, C):  un-regroup, reduce-scatter over ESP (sums the hidden-width
//                                  partial products), all-to-all back over EP.
// They are each other's adjoint: the layer's forward is ToExperts (dispatch) then FromExperts
// (combine); its backward runs ToExperts on the output gradient and FromExperts on the input
// gradient. Each direction is three phases (prepare: buffers and counts; communicate; finish:
// reorder) so a schedule can overlap them; Run* chains them.
//
// A DispatchHandle is made once per micro-batch and layer by Prepare (it exchanges the per-expert
// counts: an all-to-all over EP and an all-gather over ESP) and is required by every later call
// of that micro-batch; backward reuses it.
//
// Rows live in the memory of ExpertGroups::device (a discrete device's rows go to the
// communicators as device buffers: comm::ForDevice); the reorders are copies on the calling
// thread's current stream, one per contiguous block of rows. No device: host memory.
//
// Thread-safety: one thread. Errors: the communicators' Status, the device's for a copy,
// InvalidArgument for counts that do not match the layout.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/comm/communicator.h"
#include "runtime/device/device.h"

namespace furnace::moe {

struct ExpertGroups {
  comm::Communicator* ep = nullptr;   // nullptr: a group of one
  comm::Communicator* esp = nullptr;  // nullptr: a group of one
  // Whose memory the rows are; nullptr: host memory (plain memcpy).
  device::Device* device = nullptr;
  int ep_size() const { return ep == nullptr ? 1 : ep->size(); }
  int esp_size() const { return esp == nullptr ? 1 : esp->size(); }
};

struct DispatchHandle {
  int E = 0, El = 0, ep = 1, esp = 1;
  int64_t S = 0;  // routed rows on this rank
  // send_rows[j]: rows this rank sends to EP rank j; recv_rows[s]: rows it receives from EP rank s.
  std::vector<int64_t> send_rows, recv_rows;
  // counts[q][s][le]: rows that ESP peer q received from EP source s for local expert le.
  std::vector<std::vector<std::vector<int64_t>>> counts;
  std::vector<int64_t> peer_rows;           // (esp) rows each ESP peer received over EP
  std::vector<int64_t> expert_offsets;      // (El + 1) row offsets of the local experts in (R, C)
  std::vector<int64_t> gathered_to_expert;  // (R) row of the gathered order -> expert order
  // Set by ScheduleExecutor::Prepare (executor.h) for a schedule that splits the routed rows over
  // the tp peers (s2): the routed rows per expert before the split (E), and each tp peer's ep rank
  // (for the fused ops' step order). Empty otherwise.
  std::vector<int64_t> all_counts;
  std::vector<int> tp_peer_ep;
  int64_t R() const { return expert_offsets.empty() ? 0 : expert_offsets.back(); }
  int64_t A() const;  // rows this rank received over EP
};

class ExpertDispatcher {
 public:
  ExpertDispatcher(ExpertGroups groups, int experts);

  // expert_counts (E): this rank's routed rows per global expert (kept rows, after capacity).
  absl::StatusOr<DispatchHandle> Prepare(const std::vector<int64_t>& expert_counts) const;

  // The phases. `scratch` holds ScratchRows(h) * C floats: the EP-received rows (A), then the
  // ESP-gathered rows (R). A phase that has nothing to move hands its input through, so the
  // returned pointer may alias `rows`.
  //   dispatch, communicate: rows (S, C) -> all-to-all over EP -> all-gather over ESP; returns the
  //                          gathered rows (R, C, in gathered order);
  //   dispatch, finish:      gathered rows -> out (R, C) grouped by local expert;
  //   combine, prepare:      expert rows (R, C) -> scratch in gathered order;
  //   combine, communicate:  reduce-scatter over ESP -> all-to-all back over EP -> out (S, C).
  // (The combine's finish, the gate-weighted sum per token, is the layer's.)
  absl::StatusOr<const float*> DispatchCommunicate(const DispatchHandle& h, const float* rows,
                                                   int C, float* scratch) const;
  absl::Status DispatchFinish(const DispatchHandle& h, const float* gathered, int C,
                              float* out) const;
  absl::StatusOr<const float*> CombinePrepare(const DispatchHandle& h, const float* rows, int C,
                                              float* scratch) const;
  absl::Status CombineCommunicate(const DispatchHandle& h, const float* gathered, int C,
                                  float* scratch, float* out) const;

  // The phases chained. rows (S, C) -> out (R, C).
  absl::Status ToExperts(const DispatchHandle& h, const float* rows, float* out, int C,
                         float* scratch) const;
  // rows (R, C) -> out (S, C), summing over ESP.
  absl::Status FromExperts(const DispatchHandle& h, const float* rows, float* out, int C,
                           float* scratch) const;
  // Rows of scratch either direction needs: A + R (the EP-received rows and the gathered rows).
  static int64_t ScratchRows(const DispatchHandle& h);

  const ExpertGroups& groups() const { return groups_; }

  // dst <- src (bytes) in the rows' memory: a copy on the current stream of groups().device, or a
  // memcpy without one.
  static absl::Status CopyRows(device::Device* device, void* dst, const void* src, int64_t bytes);

 private:
  ExpertGroups groups_;
  int E_;
};

}  // namespace furnace::moe
