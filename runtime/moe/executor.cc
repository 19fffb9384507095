#include "runtime/moe/executor.h"

#include <algorithm>
#include <cstring>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "runtime/base/status.h"
#include "runtime/comm/fused_exchange.h"
#include "runtime/tensor/transfer.h"

namespace furnace::moe {
namespace {

constexpr int64_t kF32 = sizeof(float);

int64_t Sum(const std::vector<int64_t>& v) {
  return std::accumulate(v.begin(), v.end(), int64_t{0});
}

std::vector<int64_t> Scaled(const std::vector<int64_t>& rows, int64_t bytes_per_row) {
  std::vector<int64_t> out(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) out[i] = rows[i] * bytes_per_row;
  return out;
}

int SizeOf(const comm::Communicator* c) { return c == nullptr ? 1 : c->size(); }
int RankOf(const comm::Communicator* c) { return c == nullptr ? 0 : c->rank(); }

// FNV-1a of the routed rows per expert: the tp peers of s2 must have routed alike.
// FNV-1a over the counts, then the routing digest.
int64_t RoutingHash(const std::vector<int64_t>& counts, uint64_t routing_digest) {
  uint64_t h = 1469598103934665603ull;
  for (int64_t c : counts) {
    h ^= static_cast<uint64_t>(c);
    h *= 1099511628211ull;
  }
  h ^= routing_digest;
  h *= 1099511628211ull;
  return static_cast<int64_t>(h);
}

// Where row r of expert e's c rows goes under s2: peer q keeps [c q / tp, c (q + 1) / tp).
int64_t ShareBegin(int64_t c, int tp, int q) { return c * q / tp; }

}  // namespace

void ExchangeCounters::Add(const std::string& op, int64_t bytes, double seconds) {
  std::lock_guard<std::mutex> lock(mu_);
  Entry& e = entries_[op];
  e.bytes += bytes;
  e.calls += 1;
  e.seconds += seconds;
}

std::map<std::string, ExchangeCounters::Entry> ExchangeCounters::Snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  return entries_;
}

void ExchangeCounters::Reset() {
  std::lock_guard<std::mutex> lock(mu_);
  entries_.clear();
}

std::vector<int64_t> RowShare(const std::vector<int64_t>& expert_counts, int tp, int q) {
  std::vector<int64_t> share(expert_counts.size());
  for (size_t e = 0; e < share.size(); ++e) {
    share[e] = ShareBegin(expert_counts[e], tp, q + 1) - ShareBegin(expert_counts[e], tp, q);
  }
  return share;
}

ScheduleExecutor::ScheduleExecutor(Schedule schedule, ScheduleGroups groups, int experts,
                                   ExchangeCounters* counters)
    : schedule_(SizeOf(groups.tp) == 1 ? Schedule::kDeepspeed : schedule),
      groups_(groups),
      sliced_(SlicedExperts(schedule_, groups.esp_is_tp, groups.expert.esp_size())),
      dispatcher_(
          sliced_ ? ExpertGroups{groups.expert.ep, nullptr, groups.expert.device} : groups.expert,
          experts),
      E_(experts),
      counters_(counters) {}

bool ScheduleExecutor::distributed() const {
  return groups_.expert.ep_size() > 1 || (groups_.expert.esp_size() > 1 && !sliced_);
}

void ScheduleExecutor::Count(const Op& op, int64_t bytes, double seconds) const {
  if (counters_ != nullptr) counters_->Add(op.Name(), bytes, seconds);
}

std::vector<Op> ScheduleExecutor::Segment(Direction d, OpKind after, OpKind before) const {
  const std::vector<Op>& ops =
      d == Direction::kForward ? ForwardOps(schedule_, sliced_) : BackwardOps(schedule_, sliced_);
  std::vector<Op> seg;
  bool inside = false;
  for (const Op& op : ops) {
    if (!inside) {
      inside = op.kind == after;
      continue;
    }
    if (op.kind == before) break;
    if (op.kind != OpKind::kCounts) seg.push_back(op);  // Prepare runs the counts
  }
  return seg;
}

absl::StatusOr<int64_t> ScheduleExecutor::SliceCount(int64_t N) const {
  if (!GateOnTokenSlice(schedule_) || tp() == 1) return N;
  if (N % tp() != 0) {
    return absl::InvalidArgumentError(absl::StrCat("moe schedule s1: the micro-batch's ", N,
                                                   " tokens do not split over tp = ", tp()));
  }
  return N / tp();
}

int64_t ScheduleExecutor::SliceBegin(int64_t N) const {
  if (!GateOnTokenSlice(schedule_) || tp() == 1) return 0;
  return N / tp() * tp_rank();
}

absl::StatusOr<GateStats> ScheduleExecutor::ExchangeGateStats(
    const std::vector<int64_t>& counts, const std::vector<double>& psum) const {
  const int n = tp(), E = E_;
  GateStats g;
  // [counts as doubles (exact below 2^53), psum] per peer, gathered in rank order so every peer
  // sums the same numbers in the same order.
  std::vector<double> mine(2 * E);
  for (int e = 0; e < E; ++e) {
    mine[e] = static_cast<double>(counts[e]);
    mine[E + e] = psum[e];
  }
  std::vector<double> all(static_cast<size_t>(n) * 2 * E);
  if (n == 1) {
    all = mine;
  } else {
    comm::CallTimer timer;
    RETURN_IF_ERROR(groups_.tp->AllGather(mine.data(), all.data(), 2 * E * sizeof(double)));
    Count(Op{OpKind::kGate, OpGroup::kTp}, 2 * E * sizeof(double), timer.Seconds());
  }
  g.psum.assign(E, 0.0);
  g.total.assign(E, 0);
  g.queued.assign(E, 0);
  for (int q = 0; q < n; ++q) {
    const size_t at = static_cast<size_t>(q) * 2 * E;
    for (int e = 0; e < E; ++e) {
      const int64_t c = static_cast<int64_t>(all[at + e]);
      g.psum[e] += all[at + E + e];
      g.total[e] += c;
      if (q < tp_rank()) g.queued[e] += c;
    }
  }
  return g;
}

uint64_t RoutingDigest(const std::vector<int32_t>& row_tokens) {
  uint64_t h = 1469598103934665603ull;
  for (int32_t t : row_tokens) {
    h ^= static_cast<uint32_t>(t);
    h *= 1099511628211ull;
  }
  return h;
}

absl::StatusOr<DispatchHandle> ScheduleExecutor::Prepare(const std::vector<int64_t>& expert_counts,
                                                         uint64_t routing_digest) const {
  comm::CallTimer timer;
  const bool split_rows = schedule_ == Schedule::kS2 && tp() > 1;
  const std::vector<int64_t> mine =
      split_rows ? RowShare(expert_counts, tp(), tp_rank()) : expert_counts;
  ASSIGN_OR_RETURN(DispatchHandle h, dispatcher_.Prepare(mine));
  const int ep = h.ep, El = h.El;
  int64_t bytes = 0;
  if (ep > 1) bytes += int64_t{ep} * El * int64_t{sizeof(int64_t)};
  if (h.esp > 1) bytes += int64_t{ep} * El * int64_t{sizeof(int64_t)};
  if (split_rows) {
    h.all_counts = expert_counts;
    // The fused ops' step order needs each tp peer's ep rank; its layout, that every peer routed
    // the same rows to the same experts in the same order (they gate the same tokens with the
    // same weights): one all-gather of (ep rank, hash of the counts and the routing digest). ESP
    // peers share their ep coordinate (topology.h: an ESP group is one (stage, edp, ep)), so
    // theirs is this rank's.
    const int64_t mine_info[2] = {RankOf(groups_.expert.ep),
                                  RoutingHash(expert_counts, routing_digest)};
    std::vector<int64_t> info(2 * static_cast<size_t>(tp()));
    RETURN_IF_ERROR(groups_.tp->AllGather(mine_info, info.data(), sizeof(mine_info)));
    bytes += sizeof(mine_info);
    for (int q = 0; q < tp(); ++q) {
      if (info[2 * q + 1] != mine_info[1]) {
        return absl::InternalError(absl::StrCat(
            "moe schedule s2: tp peer ", q, " routed other rows than tp peer ", tp_rank(),
            " (their per-expert counts or the tokens of their rows differ: the gates disagree), "
            "so the rows cannot be split between them"));
      }
      h.tp_peer_ep.push_back(static_cast<int>(info[2 * q]));
    }
  }
  if (distributed() || split_rows) Count(Op{OpKind::kCounts, OpGroup::kEp}, bytes, timer.Seconds());
  return h;
}

int64_t ScheduleExecutor::AllRows(const DispatchHandle& h) {
  return h.all_counts.empty() ? h.S : Sum(h.all_counts);
}

int64_t ScheduleExecutor::ScratchRows(const DispatchHandle& h) {
  // The EP-received rows (A) and the gathered rows (R); s2 adds, on the way in, this peer's share
  // (S) before them and, on the way back, the staging of every peer's rows (S_all) after them.
  if (h.all_counts.empty()) return h.A() + h.R();
  return h.A() + h.R() + AllRows(h);
}

absl::Status ScheduleExecutor::RunFused(const Op& op, const DispatchHandle& h, const float* in,
                                        float* out, int C, bool to_experts) const {
  const int64_t row = int64_t{C} * kF32;
  comm::Communicator* a2a = groups_.expert.ep;
  comm::Communicator* ag = op.ag_group == OpGroup::kEsp ? groups_.expert.esp : groups_.tp;
  const int G = h.ep;
  // Each all-gather member's ep rank: ESP peers share this rank's (topology.h: an ESP group is one
  // (stage, edp, ep)); the tp peers' Prepare gathered.
  const std::vector<int> peer_ep = op.ag_group == OpGroup::kEsp
                                       ? std::vector<int>(h.esp, RankOf(groups_.expert.ep))
                                       : h.tp_peer_ep;
  const int n = static_cast<int>(peer_ep.size());
  comm::FusedLayout layout;
  layout.chunk_bytes.assign(n, std::vector<int64_t>(G, 0));
  layout.chunk_offset.assign(n, std::vector<int64_t>(G, 0));
  int64_t a2a_bytes = 0, ag_bytes = 0, out_rows = 0;
  if (to_experts) {
    // in: this peer's rows (S); out: gathered (R) in (esp peer q, ep source s, local expert).
    layout.send_bytes = Scaled(h.send_rows, row);
    int64_t offset = 0;
    std::vector<std::vector<int64_t>> block(n, std::vector<int64_t>(G, 0));
    for (int q = 0; q < n; ++q) {
      for (int s = 0; s < G; ++s) {
        block[q][s] = offset;
        offset += Sum(h.counts[q][s]) * row;
      }
    }
    for (int q = 0; q < n; ++q) {
      for (int i = 0; i < G; ++i) {
        const int s = (peer_ep[q] - i + G) % G;
        layout.chunk_bytes[q][i] = Sum(h.counts[q][s]) * row;
        layout.chunk_offset[q][i] = block[q][s];
      }
    }
    a2a_bytes = h.S * row;
    ag_bytes = h.A() * row;
    out_rows = h.R();
  } else {
    // in: this peer's received rows (A, by source); out: every tp peer's rows back, staged by
    // (peer q, ep rank j) for the caller to put in routed order.
    layout.send_bytes = Scaled(h.recv_rows, row);
    const int El = h.El;
    std::vector<std::vector<int64_t>> sent(n, std::vector<int64_t>(G, 0));  // rows q sent to j
    for (int q = 0; q < n; ++q) {
      const std::vector<int64_t> share = RowShare(h.all_counts, n, q);
      for (int j = 0; j < G; ++j) {
        for (int le = 0; le < El; ++le) sent[q][j] += share[j * El + le];
      }
    }
    int64_t offset = 0;
    std::vector<std::vector<int64_t>> block(n, std::vector<int64_t>(G, 0));
    for (int q = 0; q < n; ++q) {
      for (int j = 0; j < G; ++j) {
        block[q][j] = offset;
        offset += sent[q][j] * row;
      }
    }
    for (int q = 0; q < n; ++q) {
      for (int i = 0; i < G; ++i) {
        const int j = (peer_ep[q] - i + G) % G;
        layout.chunk_bytes[q][i] = sent[q][j] * row;
        layout.chunk_offset[q][i] = block[q][j];
      }
    }
    a2a_bytes = h.A() * row;
    ag_bytes = h.S * row;
    out_rows = AllRows(h);
  }
  comm::CallTimer timer;
  device::Device* dev = Rows();
  if (dev == nullptr || device::HostAddressable(*dev) || comm::FusedExchangeOnStreams(*a2a, *ag)) {
    // Host memory, or device memory the fused op runs on the communicators' streams (NCCL, or
    // the emulated device's transport): the rows go as they are.
    RETURN_IF_ERROR(comm::FusedAllToAllAllGather(*a2a, *ag, in, out, out_rows * row, layout));
  } else {
    // Host transports (Gloo through comm::ForDevice): the fused op moves its chunks with host
    // copies (fused_exchange.cc), so on a discrete device it runs on host staging of `in` and
    // `out` (the communicators pass host buffers through).
    std::vector<float> host_in(static_cast<size_t>(Sum(layout.send_bytes) / kF32));
    std::vector<float> host_out(static_cast<size_t>(out_rows * C));
    RETURN_IF_ERROR(tensor::CopyToHost(*dev, host_in.data(), in, host_in.size() * kF32));
    // The chunks (never overlapping: the fused op refuses that) tile `out` whole when their bytes
    // add up to it, and then every byte of it is overwritten: nothing of it to bring down.
    int64_t chunked = 0;
    for (const std::vector<int64_t>& member : layout.chunk_bytes) chunked += Sum(member);
    if (chunked != out_rows * row) {
      RETURN_IF_ERROR(tensor::CopyToHost(*dev, host_out.data(), out, host_out.size() * kF32));
    }
    RETURN_IF_ERROR(comm::FusedAllToAllAllGather(*a2a, *ag, host_in.data(), host_out.data(),
                                                 out_rows * row, layout));
    RETURN_IF_ERROR(tensor::CopyToDevice(*dev, out, host_out.data(), host_out.size() * kF32));
  }
  Count(op, a2a_bytes + ag_bytes, timer.Seconds());
  return absl::OkStatus();
}

absl::Status ScheduleExecutor::ToExperts(Direction d, const DispatchHandle& h, const float* routed,
                                         float* out, int C, float* scratch) const {
  const int64_t row = int64_t{C} * kF32;
  // Scratch: [share (S, s2 only)] [received (A)] [gathered (R)].
  const int64_t share_rows = h.all_counts.empty() ? 0 : h.S;
  float* share = scratch;
  float* received = scratch + share_rows * C;
  float* gathered = received + h.A() * C;
  const float* cur = routed;  // rows of the current stage
  for (const Op& op : Segment(d, d == Direction::kForward ? OpKind::kOrder : OpKind::kInverseOrder,
                              OpKind::kExpert)) {
    comm::CallTimer timer;
    switch (op.kind) {
      case OpKind::kRowSplit: {
        // Of every expert's rows, this peer's share, in expert order.
        float* dst = share;
        int64_t at = 0;
        for (size_t e = 0; e < h.all_counts.size(); ++e) {
          const int64_t c = h.all_counts[e];
          const int64_t lo = ShareBegin(c, tp(), tp_rank()),
                        hi = ShareBegin(c, tp(), tp_rank() + 1);
          RETURN_IF_ERROR(
              ExpertDispatcher::CopyRows(Rows(), dst, cur + (at + lo) * C, (hi - lo) * row));
          dst += (hi - lo) * C;
          at += c;
        }
        cur = share;
        break;
      }
      case OpKind::kAllToAll:
        if (h.ep > 1) {
          RETURN_IF_ERROR(groups_.expert.ep->AllToAllV(cur, Scaled(h.send_rows, row), received,
                                                       Scaled(h.recv_rows, row)));
          cur = received;
          Count(op, h.S * row, timer.Seconds());
        }
        break;
      case OpKind::kEspAllGather:
        if (h.esp > 1) {
          RETURN_IF_ERROR(
              groups_.expert.esp->AllGatherV(cur, h.A() * row, gathered, Scaled(h.peer_rows, row)));
          cur = gathered;
          Count(op, h.A() * row, timer.Seconds());
        }
        break;
      case OpKind::kEspCopy:  // the rows are already every shard's: nothing moves
        break;
      case OpKind::kFused:
        if (h.ep == 1 || h.esp == 1) {  // one of the two is a group of one: nothing to overlap
          if (h.ep > 1) {
            RETURN_IF_ERROR(groups_.expert.ep->AllToAllV(cur, Scaled(h.send_rows, row), gathered,
                                                         Scaled(h.recv_rows, row)));
            cur = gathered;
            Count(op, h.S * row, timer.Seconds());
          } else if (h.esp > 1) {
            RETURN_IF_ERROR(groups_.expert.esp->AllGatherV(cur, h.A() * row, gathered,
                                                           Scaled(h.peer_rows, row)));
            cur = gathered;
            Count(op, h.A() * row, timer.Seconds());
          }
        } else {
          RETURN_IF_ERROR(RunFused(op, h, cur, gathered, C, /*to_experts=*/true));
          cur = gathered;
        }
        break;
      default:
        return absl::InternalError(absl::StrCat("moe schedule ", ScheduleName(schedule_), ": ",
                                                op.Name(),
                                                " cannot run on the way to the experts"));
    }
  }
  // Grouped by local expert.
  if (!distributed()) return ExpertDispatcher::CopyRows(Rows(), out, cur, h.R() * row);
  return dispatcher_.DispatchFinish(h, cur, C, out);
}

absl::Status ScheduleExecutor::FromExperts(Direction d, const DispatchHandle& h, const float* rows,
                                           float* out, int C, float* scratch) const {
  const int64_t row = int64_t{C} * kF32;
  // Scratch: [received (A)] [gathered (R)] and, s2, after them the staging of every peer's rows
  // (S_all).
  float* received = scratch;
  float* gathered = scratch + h.A() * C;
  const float* cur = gathered;
  if (distributed()) {
    // Writes the gathered order at scratch + A * C.
    RETURN_IF_ERROR(dispatcher_.CombinePrepare(h, rows, C, scratch).status());
  } else {
    cur = rows;
  }
  bool in_out = false;  // whether `cur` already is `out`
  for (const Op& op : Segment(d, OpKind::kExpert,
                              d == Direction::kForward ? OpKind::kInverseOrder : OpKind::kOrder)) {
    comm::CallTimer timer;
    switch (op.kind) {
      case OpKind::kEspAllReduce:
        if (groups_.expert.esp_size() > 1) {
          // The partial products summed in place (the rows stay as the expert wrote them): in
          // scratch, where the un-regrouped rows already are before the all-to-all back; with no
          // all-to-all (ep 1, R = S rows in routed order) in `out`, where they end.
          float* sum = gathered;
          if (cur != gathered) {
            RETURN_IF_ERROR(ExpertDispatcher::CopyRows(Rows(), out, cur, h.R() * row));
            sum = out;
            in_out = true;
          }
          RETURN_IF_ERROR(groups_.expert.esp->AllReduce(sum, h.R() * C));
          cur = sum;
          Count(op, h.R() * row, timer.Seconds());
        }
        break;
      case OpKind::kEspReduceScatter:
        if (h.esp > 1) {
          std::vector<int64_t> counts(h.peer_rows.size());
          for (size_t q = 0; q < counts.size(); ++q) counts[q] = h.peer_rows[q] * C;
          RETURN_IF_ERROR(groups_.expert.esp->ReduceScatterV(cur, received, counts));
          cur = received;
          Count(op, h.R() * row, timer.Seconds());
        }
        break;
      case OpKind::kAllToAll:
        if (h.ep > 1) {
          RETURN_IF_ERROR(groups_.expert.ep->AllToAllV(cur, Scaled(h.recv_rows, row), out,
                                                       Scaled(h.send_rows, row)));
          cur = out;
          in_out = true;
          Count(op, h.A() * row, timer.Seconds());
        }
        break;
      case OpKind::kFused: {
        // s2: back over ep and all-gathered over tp, staged by (tp peer, ep rank), then each
        // peer's share put at its place in routed order.
        // s2 runs only with tp > 1 (tp 1 runs as deepspeed).
        float* staged = gathered + h.R() * C;  // past the rows still being read
        if (h.ep > 1) {
          RETURN_IF_ERROR(RunFused(op, h, cur, staged, C, /*to_experts=*/false));
        } else {
          // No all-to-all: this peer's rows are `cur` (below the staging); the tp all-gather alone.
          std::vector<int64_t> peer(tp());
          for (int q = 0; q < tp(); ++q) peer[q] = Sum(RowShare(h.all_counts, tp(), q)) * row;
          RETURN_IF_ERROR(groups_.tp->AllGatherV(cur, h.S * row, staged, peer));
          Count(op, h.S * row, timer.Seconds());
        }
        // Staged (q, j, e in j) -> routed order: expert e's rows, peers in order.
        std::vector<int64_t> start(h.all_counts.size() + 1, 0);
        for (size_t e = 0; e < h.all_counts.size(); ++e) start[e + 1] = start[e] + h.all_counts[e];
        const float* src = staged;
        for (int q = 0; q < tp(); ++q) {
          for (size_t e = 0; e < h.all_counts.size(); ++e) {
            const int64_t c = h.all_counts[e];
            const int64_t lo = ShareBegin(c, tp(), q), hi = ShareBegin(c, tp(), q + 1);
            RETURN_IF_ERROR(ExpertDispatcher::CopyRows(Rows(), out + (start[e] + lo) * C, src,
                                                       (hi - lo) * row));
            src += (hi - lo) * C;
          }
        }
        cur = out;
        in_out = true;
        break;
      }
      default:
        return absl::InternalError(absl::StrCat("moe schedule ", ScheduleName(schedule_), ": ",
                                                op.Name(),
                                                " cannot run on the way back from the experts"));
    }
  }
  if (!in_out) return ExpertDispatcher::CopyRows(Rows(), out, cur, AllRows(h) * row);
  return absl::OkStatus();
}

absl::Status ScheduleExecutor::MpAllGather(const float* local, int64_t count, float* out,
                                           int C) const {
  const int64_t row = int64_t{C} * kF32;
  comm::CallTimer timer;
  if (tp() == 1) return ExpertDispatcher::CopyRows(Rows(), out, local, count * row);
  RETURN_IF_ERROR(groups_.tp->AllGather(local, out, count * row));
  Count(Op{OpKind::kMpAllGather, OpGroup::kTp}, count * row, timer.Seconds());
  return absl::OkStatus();
}

}  // namespace furnace::moe
