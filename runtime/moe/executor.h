// ScheduleExecutor: runs the communication of one MoE layer's schedule (schedule.h) for one
// micro-batch. The MoE block (runtime/model/moe_block.cc) computes (gate, order, expert, inverse
// order, each with its backward kernel) and hands the executor the rows between them; the
// executor walks the op list of the current direction and runs the segment the block is at:
//
//   Slice       the ops before the gate           (s1: mp_split, this peer's N / tp tokens)
//   Prepare     kCounts                           (per-expert counts: a2a over ep, ag over esp
//                                                   unless sliced)
//   ToExperts   the ops between order and expert  (a2a + ag(esp); s2: row_split + fused;
//                                                   sliced deepspeed: a2a + copy(esp))
//   FromExperts the ops between expert and inverse (rs(esp) + a2a; s2: rs + fused with the tp
//                                                   all-gather of the rows, then plan order;
//                                                   sliced deepspeed: ar(esp) + a2a)
//   Unslice     the ops after the inverse order   (s1: mp_all_gather)
//
// Forward and backward lists have the same segments by the adjoint rules (schedule.h), so the
// block calls ToExperts on the way in (forward: the routed rows; backward: the output gradient)
// and FromExperts on the way out in both directions; a test holds the segments equal.
//
// Row orders. Routed rows (S_all, C) come out of the order op grouped by global expert. Under s2
// each tp peer keeps, of expert e's c_e rows, [c_e q / tp, c_e (q + 1) / tp) (RowShare); its
// local rows (S, C) are those shares in expert order; everywhere else S = S_all. The expert side
// (R, C) is ExpertDispatcher's (dispatcher.h): grouped by local expert, then (esp peer, ep source).
//
// Counters: bytes, calls and seconds per op and group (ExchangeCounters), the logical payload in
// the Communicator convention (communicator.h), so tests compare them with the analytical volumes
// exactly; the count exchange is its own op ("counts").
//
// Memory: the rows are memory of groups.expert.device (dispatcher.h); every reorder is a copy on
// the calling thread's current stream. The fused op (comm/fused_exchange.h) copies chunks on the
// host, so on a discrete device it runs on host staging (two downloads, one upload per call).
//
// Thread-safety: one thread (the rank's compute thread); the fused op runs a helper thread inside
// a call. Errors: the communicators' Status; InvalidArgument for rows that do not fit the layout.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/comm/communicator.h"
#include "runtime/moe/dispatcher.h"
#include "runtime/moe/schedule.h"

namespace furnace::moe {

// Per op name ("a2a(ep)", "fused(a2a ep, ag tp)", "counts", ...): what this rank handed to it.
class ExchangeCounters {
 public:
  struct Entry {
    int64_t bytes = 0, calls = 0;
    double seconds = 0;
  };
  void Add(const std::string& op, int64_t bytes, double seconds);
  std::map<std::string, Entry> Snapshot() const;
  void Reset();

 private:
  mutable std::mutex mu_;
  std::map<std::string, Entry> entries_;
};

struct ScheduleGroups {
  comm::Communicator* tp = nullptr;  // nullptr: a group of one
  ExpertGroups expert;
  // The ESP group is the TP group (topology::Topology::EspGroupIsTpGroup): the deepspeed schedule
  // then slices the experts (schedule.h SlicedExperts).
  bool esp_is_tp = false;
};

// The share of every expert's rows that tp peer q keeps under s2: (E) counts.
std::vector<int64_t> RowShare(const std::vector<int64_t>& expert_counts, int tp, int q);

// The s1 gate statistics of the whole tp group: every peer's per-expert choice counts and router
// probability sums, so the aux loss and the capacity cut are the group's, not the slice's.
struct GateStats {
  std::vector<double> psum;     // (E) router probabilities summed over the group
  std::vector<int64_t> total;   // (E) choices summed over the group
  std::vector<int64_t> queued;  // (E) choices of the peers before this one
};

// A digest of the routed rows' tokens, in routed order (DispatchPlan::token): equal on two ranks
// that routed the same tokens to the same experts in the same order (ScheduleExecutor::Prepare).
uint64_t RoutingDigest(const std::vector<int32_t>& row_tokens);

class ScheduleExecutor {
 public:
  // counters: may be nullptr (no accounting); must outlive the executor. With tp == 1 every
  // schedule is the same computation and runs as deepspeed (nothing to pause).
  ScheduleExecutor(Schedule schedule, ScheduleGroups groups, int experts,
                   ExchangeCounters* counters);

  Schedule schedule() const { return schedule_; }
  // schedule.h SlicedExperts: copy(esp) / ar(esp) around the expert instead of ag / rs. The
  // dispatcher then sees no ESP group (the rows a rank's shards compute are the rows it received:
  // R == A) and the executor all-reduces the partial products over esp.
  bool sliced() const { return sliced_; }
  int tp() const { return groups_.tp == nullptr ? 1 : groups_.tp->size(); }
  int tp_rank() const { return groups_.tp == nullptr ? 0 : groups_.tp->rank(); }
  // Whether rows cross ranks (ep larger than one, or esp unless the experts are sliced).
  bool distributed() const;
  // Whether the routed rows go through ToExperts / FromExperts: they cross ranks, the tp peers
  // split them (s2), or the sliced shards' partial products are all-reduced. Otherwise the routed
  // rows are the expert rows.
  bool exchanges() const { return distributed() || schedule_ == Schedule::kS2 || sliced_; }

  // Slice: the tokens this peer gates, [begin, begin + count) of the layer's N (all of them
  // unless s1). N must divide by tp under s1 (InvalidArgument otherwise).
  absl::StatusOr<int64_t> SliceCount(int64_t N) const;
  int64_t SliceBegin(int64_t N) const;
  // s1: the group's gate statistics (an all-gather over tp of 2E doubles per peer).
  absl::StatusOr<GateStats> ExchangeGateStats(const std::vector<int64_t>& counts,
                                              const std::vector<double>& psum) const;

  // Prepare: `expert_counts` (E) are the routed rows per expert of the order op (S_all);
  // `routing_digest` is RoutingDigest of the token each of those rows holds, in order (s2 checks
  // that its tp peers routed exactly the same rows before it splits them). Returns the handle
  // ToExperts / FromExperts need (backward reuses forward's).
  absl::StatusOr<DispatchHandle> Prepare(const std::vector<int64_t>& expert_counts,
                                         uint64_t routing_digest) const;
  // Rows of the routed buffer (S_all) and of this peer's share (S) for a handle.
  static int64_t AllRows(const DispatchHandle& h);
  // Scratch either direction needs, in rows of C floats.
  static int64_t ScratchRows(const DispatchHandle& h);

  // routed (S_all, C) -> out (R, C) grouped by local expert.
  absl::Status ToExperts(Direction d, const DispatchHandle& h, const float* routed, float* out,
                         int C, float* scratch) const;
  // expert rows (R, C) -> out (S_all, C) in routed order (ESP partial products summed).
  absl::Status FromExperts(Direction d, const DispatchHandle& h, const float* rows, float* out,
                           int C, float* scratch) const;
  // Unslice (s1): local (count, C) rows of every peer -> out (N, C), peers in rank order.
  absl::Status MpAllGather(const float* local, int64_t count, float* out, int C) const;

 private:
  // The ops of direction d's list strictly between the first op of kind `after` and the next of
  // kind `before`.
  std::vector<Op> Segment(Direction d, OpKind after, OpKind before) const;
  absl::Status RunFused(const Op& op, const DispatchHandle& h, const float* in, float* out, int C,
                        bool to_experts) const;
  void Count(const Op& op, int64_t bytes, double seconds) const;
  // The device whose memory the rows are (nullptr: host memory).
  device::Device* Rows() const { return groups_.expert.device; }

  Schedule schedule_;
  ScheduleGroups groups_;
  bool sliced_;
  ExpertDispatcher dispatcher_;
  int E_;
  ExchangeCounters* counters_;
};

}  // namespace furnace::moe
