// LocalGroup: shared slots + a generation-counted barrier (see the header for the protocol).
#include "runtime/comm/local_communicator.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <mutex>
#include <numeric>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "runtime/base/status.h"
#include "runtime/comm/collective_checks.h"
#include "runtime/comm/in_flight.h"

namespace furnace::comm {
namespace {

using SteadyClock = std::chrono::steady_clock;
using Bytes = std::vector<std::byte>;

// The collectives as the members must agree on them (ReduceScatter and ReduceScatterV are one
// CollectiveOp for the counters but must not meet each other).
enum class Kind {
  kAllReduce,
  kReduceScatter,
  kReduceScatterV,
  kAllGather,
  kAllGatherV,
  kAllToAll,
  kBroadcast,
  kBarrier
};

struct KindInfo {
  CollectiveOp op;
  const char* name;
};

KindInfo Info(Kind kind) {
  switch (kind) {
    case Kind::kAllReduce:
      return {CollectiveOp::kAllReduce, "all_reduce"};
    case Kind::kReduceScatter:
      return {CollectiveOp::kReduceScatter, "reduce_scatter"};
    case Kind::kReduceScatterV:
      return {CollectiveOp::kReduceScatter, "reduce_scatter_v"};
    case Kind::kAllGather:
      return {CollectiveOp::kAllGather, "all_gather"};
    case Kind::kAllGatherV:
      return {CollectiveOp::kAllGather, "all_gather_v"};
    case Kind::kAllToAll:
      return {CollectiveOp::kAllToAll, "all_to_all_v"};
    case Kind::kBroadcast:
      return {CollectiveOp::kBroadcast, "broadcast"};
    case Kind::kBarrier:
      return {CollectiveOp::kBarrier, "barrier"};
  }
  return {CollectiveOp::kBarrier, "unknown"};
}

// One member's arguments to the collective in progress.
struct Slot {
  Kind kind = Kind::kBarrier;
  const void* in = nullptr;
  int64_t n = 0;  // floats (all_reduce, reduce_scatter per rank) or bytes (gathers, broadcast)
  int root = 0;
  const std::vector<int64_t>* sizes = nullptr;       // counts, recv_bytes, or send_bytes
  const std::vector<int64_t>* recv_sizes = nullptr;  // all_to_all recv_bytes
};

int64_t Sum(const std::vector<int64_t>& v, size_t end) {
  return std::accumulate(v.begin(), v.begin() + end, int64_t{0});
}

// result = sum over ranks, in rank order, of `count` floats at element offset(r) of rank r's input.
void SumInRankOrder(const std::vector<Slot>& slots, int64_t count,
                    const std::function<int64_t(int)>& offset, Bytes* result) {
  std::vector<float> acc(count, 0.0f);
  for (size_t r = 0; r < slots.size(); ++r) {
    const float* in = static_cast<const float*>(slots[r].in) + offset(static_cast<int>(r));
    for (int64_t i = 0; i < count; ++i) acc[i] = r == 0 ? in[i] : acc[i] + in[i];
  }
  result->resize(count * sizeof(float));
  if (count > 0) std::memcpy(result->data(), acc.data(), result->size());
}

void Append(Bytes* result, const void* src, int64_t bytes) {
  if (bytes <= 0) return;
  const auto* p = static_cast<const std::byte*>(src);
  result->insert(result->end(), p, p + bytes);
}

}  // namespace

struct LocalGroup::State {
  State(int size, LocalGroupOptions options)
      : size(std::max(size, 0)),
        name(std::move(options.name)),
        timeout_s(options.timeout_s),
        timeout(std::chrono::duration_cast<SteadyClock::duration>(
            std::chrono::duration<double>(options.timeout_s))),
        taken(this->size, false),
        slots(this->size),
        present(this->size, false) {}

  // Records `status` as the group's error unless one came first, wakes every member, and returns
  // the group's error. Requires mu.
  absl::Status Fail(absl::Status status) {
    if (error.ok()) error = std::move(status);
    cv.notify_all();
    return error;
  }

  void CompleteBarrier() {
    arrived = 0;
    ++generation;
    present.assign(size, false);
    cv.notify_all();
  }

  // Posts `slot` and waits for every member, for the group's error, or until `deadline`.
  absl::Status EnterBarrier(std::unique_lock<std::mutex>& lock, int rank, const Slot& slot,
                            SteadyClock::time_point deadline, const std::string& where) {
    if (!error.ok()) return error;
    slots[rank] = slot;
    present[rank] = true;
    const uint64_t gen = generation;
    if (++arrived == size) {
      CompleteBarrier();
      return absl::OkStatus();
    }
    const bool woken =
        cv.wait_until(lock, deadline, [&] { return generation != gen || !error.ok(); });
    if (generation != gen) return absl::OkStatus();
    if (woken) return error;
    std::vector<int> missing;
    for (int r = 0; r < size; ++r) {
      if (!present[r]) missing.push_back(r);
    }
    return Fail(absl::DeadlineExceededError(absl::StrCat(where, ": timed out after ", timeout_s,
                                                         " s waiting for rank(s) ",
                                                         absl::StrJoin(missing, ", "))));
  }

  // Waits for every member; not interruptible (see the header).
  void ExitBarrier(std::unique_lock<std::mutex>& lock) {
    const uint64_t gen = generation;
    if (++arrived == size) {
      CompleteBarrier();
      return;
    }
    cv.wait(lock, [&] { return generation != gen; });
  }

  const int size;
  const std::string name;
  const double timeout_s;
  const SteadyClock::duration timeout;

  std::mutex mu;
  std::condition_variable cv;
  std::vector<bool> taken;
  std::vector<Slot> slots;    // written at the entry barrier, read between the two barriers
  std::vector<bool> present;  // arrived at the current entry barrier
  int arrived = 0;
  uint64_t generation = 0;                                                // barriers completed
  absl::Status error;                                                     // sticky, group-wide
  std::map<std::tuple<int, int, uint32_t>, std::deque<Bytes>> mailboxes;  // (src, dst, tag)
};

namespace {

class LocalCommunicator final : public Communicator {
 public:
  LocalCommunicator(std::shared_ptr<LocalGroup::State> state, int rank)
      : state_(std::move(state)), rank_(rank) {}

  int rank() const override { return rank_; }
  int size() const override { return state_->size; }
  const std::string& name() const override { return state_->name; }

  absl::Status AllReduce(float* data, int64_t count) override {
    RETURN_IF_ERROR(CheckArgs("all_reduce", CheckAllReduceArgs(data, count)));
    return Collective({.kind = Kind::kAllReduce, .in = data, .n = count}, data, count * 4,
                      [&](const std::vector<Slot>& slots, Bytes* result) {
                        SumInRankOrder(
                            slots, count, [](int) { return 0; }, result);
                      });
  }

  absl::Status ReduceScatter(const float* in, float* out, int64_t count_per_rank) override {
    RETURN_IF_ERROR(CheckArgs("reduce_scatter", CheckReduceScatterArgs(in, out, count_per_rank)));
    return Collective({.kind = Kind::kReduceScatter, .in = in, .n = count_per_rank}, out,
                      size() * count_per_rank * 4,
                      [&](const std::vector<Slot>& slots, Bytes* result) {
                        const int64_t offset = rank_ * count_per_rank;
                        SumInRankOrder(
                            slots, count_per_rank, [&](int) { return offset; }, result);
                      });
  }

  absl::Status ReduceScatterV(const float* in, float* out,
                              const std::vector<int64_t>& counts) override {
    RETURN_IF_ERROR(
        CheckArgs("reduce_scatter_v", CheckReduceScatterVArgs(in, out, counts, rank_, size())));
    const int64_t total = counts.size() == static_cast<size_t>(size()) ? Sum(counts, size()) : 0;
    return Collective({.kind = Kind::kReduceScatterV, .in = in, .sizes = &counts}, out, total * 4,
                      [&](const std::vector<Slot>& slots, Bytes* result) {
                        const int64_t offset = Sum(counts, rank_);
                        SumInRankOrder(
                            slots, counts[rank_], [&](int) { return offset; }, result);
                      });
  }

  absl::Status AllGather(const void* in, void* out, int64_t bytes_per_rank) override {
    RETURN_IF_ERROR(CheckArgs("all_gather", CheckAllGatherArgs(in, out, bytes_per_rank)));
    return Collective({.kind = Kind::kAllGather, .in = in, .n = bytes_per_rank}, out,
                      bytes_per_rank, [&](const std::vector<Slot>& slots, Bytes* result) {
                        for (const Slot& s : slots) Append(result, s.in, bytes_per_rank);
                      });
  }

  absl::Status AllGatherV(const void* in, int64_t in_bytes, void* out,
                          const std::vector<int64_t>& recv_bytes) override {
    RETURN_IF_ERROR(CheckArgs("all_gather_v",
                              CheckAllGatherVArgs(in, in_bytes, out, recv_bytes, rank_, size())));
    return Collective({.kind = Kind::kAllGatherV, .in = in, .n = in_bytes, .sizes = &recv_bytes},
                      out, in_bytes, [&](const std::vector<Slot>& slots, Bytes* result) {
                        for (const Slot& s : slots) Append(result, s.in, s.n);
                      });
  }

  absl::Status AllToAllV(const void* in, const std::vector<int64_t>& send_bytes, void* out,
                         const std::vector<int64_t>& recv_bytes) override {
    RETURN_IF_ERROR(CheckArgs("all_to_all_v",
                              CheckAllToAllVArgs(in, send_bytes, out, recv_bytes, rank_, size())));
    const int64_t sent =
        send_bytes.size() == static_cast<size_t>(size()) ? Sum(send_bytes, size()) : 0;
    return Collective(
        {.kind = Kind::kAllToAll, .in = in, .sizes = &send_bytes, .recv_sizes = &recv_bytes}, out,
        sent, [&](const std::vector<Slot>& slots, Bytes* result) {
          for (const Slot& s : slots) {
            Append(result, static_cast<const std::byte*>(s.in) + Sum(*s.sizes, rank_),
                   (*s.sizes)[rank_]);
          }
        });
  }

  absl::Status Broadcast(void* data, int64_t bytes, int root) override {
    RETURN_IF_ERROR(CheckArgs("broadcast", CheckBroadcastArgs(data, bytes, root, size())));
    return Collective({.kind = Kind::kBroadcast, .in = data, .n = bytes, .root = root}, data, bytes,
                      [&](const std::vector<Slot>& slots, Bytes* result) {
                        Append(result, slots[root].in, bytes);
                      });
  }

  absl::Status Barrier() override {
    return Collective({.kind = Kind::kBarrier}, nullptr, 0,
                      [](const std::vector<Slot>&, Bytes*) {});
  }

  absl::Status Send(const void* data, int64_t bytes, int peer, uint32_t tag) override {
    const CallTimer timer;
    State& s = *state_;
    RETURN_IF_ERROR(CheckArgs("send", CheckPointToPointArgs(data, bytes, peer, s.size)));
    std::lock_guard<std::mutex> lock(s.mu);
    if (!s.error.ok()) return s.error;
    Bytes message;
    Append(&message, data, bytes);
    s.mailboxes[{rank_, peer, tag}].push_back(std::move(message));
    s.cv.notify_all();
    counters_.Add(CollectiveOp::kSend, bytes, timer.Seconds());
    return absl::OkStatus();
  }

  absl::Status Recv(void* data, int64_t bytes, int peer, uint32_t tag) override {
    const ScopedInFlight in_flight("recv", *this, peer);
    const CallTimer timer;
    State& s = *state_;
    const auto deadline = SteadyClock::now() + s.timeout;
    RETURN_IF_ERROR(CheckArgs("recv", CheckPointToPointArgs(data, bytes, peer, s.size)));
    std::unique_lock<std::mutex> lock(s.mu);
    if (!s.error.ok()) return s.error;
    std::deque<Bytes>& box = s.mailboxes[{peer, rank_, tag}];
    const bool woken =
        s.cv.wait_until(lock, deadline, [&] { return !s.error.ok() || !box.empty(); });
    if (!s.error.ok()) return s.error;
    if (!woken) {
      return s.Fail(absl::DeadlineExceededError(
          absl::StrCat(Where("recv"), ": timed out after ", s.timeout_s,
                       " s waiting for a message from rank ", peer, " with tag ", tag)));
    }
    Bytes message = std::move(box.front());
    box.pop_front();
    if (static_cast<int64_t>(message.size()) != bytes) {
      return s.Fail(absl::InvalidArgumentError(
          absl::StrCat(Where("recv"), ": expected ", bytes, " bytes from rank ", peer, " with tag ",
                       tag, ", the message has ", message.size())));
    }
    if (bytes > 0) std::memcpy(data, message.data(), bytes);
    counters_.Add(CollectiveOp::kRecv, bytes, timer.Seconds());
    return absl::OkStatus();
  }

  // Sends are delivered to the mailbox before Send returns.
  absl::Status WaitSends() override { return AsyncError(); }
  absl::Status PostSends() override { return AsyncError(); }  // posted at Send

  void Abort(const std::string& reason) override {
    std::lock_guard<std::mutex> lock(state_->mu);
    state_
        ->Fail(absl::CancelledError(
            absl::StrCat("aborted: ", reason, " (group '", state_->name, "', rank ", rank_, ")")))
        .IgnoreError();
  }

  absl::Status AsyncError() const override {
    std::lock_guard<std::mutex> lock(state_->mu);
    return state_->error;
  }

 private:
  using State = LocalGroup::State;
  using Compute = std::function<void(const std::vector<Slot>&, Bytes*)>;

  std::string Where(const char* op) const {
    return absl::StrCat(op, " on group '", state_->name, "' (rank ", rank_, " of ", state_->size,
                        ")");
  }

  // OK, or `args` (a collective_checks.h verdict: what one member can check alone, before it
  // meets the others) as the group's sticky InvalidArgument error, which wakes every member.
  absl::Status CheckArgs(const char* op, const absl::Status& args) {
    if (args.ok()) return args;
    std::lock_guard<std::mutex> lock(state_->mu);
    return state_->Fail(absl::InvalidArgumentError(
        absl::StrCat(Where(op), ": invalid arguments: ", args.message())));
  }

  // The protocol of the header: entry barrier, agreement check, compute, exit barrier, copy out.
  absl::Status Collective(const Slot& mine, void* out, int64_t counted_bytes,
                          const Compute& compute) {
    const CallTimer timer;
    State& s = *state_;
    const KindInfo info = Info(mine.kind);
    const ScopedInFlight in_flight(info.name, *this);
    const auto deadline = SteadyClock::now() + s.timeout;
    std::unique_lock<std::mutex> lock(s.mu);
    RETURN_IF_ERROR(s.EnterBarrier(lock, rank_, mine, deadline, Where(info.name)));
    lock.unlock();
    Bytes result;
    absl::Status agreed = CheckAgreement(s.slots);
    // Every member must reach the exit barrier, which nothing interrupts: an exception of the
    // computation (std::bad_alloc for the result) fails this member, not the others' wait.
    try {
      if (agreed.ok()) compute(s.slots, &result);
    } catch (const std::exception& e) {
      agreed = absl::ResourceExhaustedError(
          absl::StrCat(Where(info.name), ": cannot compute the result: ", e.what()));
    }
    lock.lock();
    s.ExitBarrier(lock);
    if (!agreed.ok()) return s.Fail(std::move(agreed));
    lock.unlock();
    if (!result.empty()) std::memcpy(out, result.data(), result.size());
    counters_.Add(info.op, counted_bytes, timer.Seconds());
    return absl::OkStatus();
  }

  // Whether every member's arguments agree. Depends only on the slots, so every member reaches the
  // same verdict.
  absl::Status CheckAgreement(const std::vector<Slot>& slots) const {
    const Slot& first = slots[0];
    const std::string where = absl::StrCat(Info(first.kind).name, " on group '", state_->name, "'");
    auto fail = [&](auto&&... parts) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": ", parts...));
    };
    const int n = state_->size;
    for (int r = 0; r < n; ++r) {
      const Slot& s = slots[r];
      if (s.kind != first.kind) {
        return fail("rank ", r, " called ", Info(s.kind).name, " while rank 0 called ",
                    Info(first.kind).name);
      }
      if (s.n < 0) return fail("rank ", r, " passed a negative size ", s.n);
      if (s.n != first.n && s.kind != Kind::kAllGatherV) {
        return fail("rank ", r, " passed size ", s.n, ", rank 0 ", first.n);
      }
      if (s.root != first.root || s.root < 0 || s.root >= n) {
        return fail("rank ", r, " passed root ", s.root, ", rank 0 ", first.root,
                    "; allowed: the same root in [0, ", n, ")");
      }
      for (const std::vector<int64_t>* v : {s.sizes, s.recv_sizes}) {
        if (v == nullptr) continue;
        if (v->size() != static_cast<size_t>(n)) {
          return fail("rank ", r, " passed ", v->size(), " sizes; allowed: ", n);
        }
        for (int64_t x : *v) {
          if (x < 0) return fail("rank ", r, " passed a negative size ", x);
        }
      }
      if ((s.kind == Kind::kReduceScatterV || s.kind == Kind::kAllGatherV) &&
          *s.sizes != *first.sizes) {
        return fail("rank ", r, " passed sizes {", absl::StrJoin(*s.sizes, ", "), "}, rank 0 {",
                    absl::StrJoin(*first.sizes, ", "), "}");
      }
      if (s.kind == Kind::kAllGatherV && (*s.sizes)[r] != s.n) {
        return fail("rank ", r, " contributes ", s.n, " bytes but recv_bytes[", r,
                    "] = ", (*s.sizes)[r]);
      }
    }
    if (first.kind == Kind::kAllToAll) {
      for (int q = 0; q < n; ++q) {
        for (int r = 0; r < n; ++r) {
          if ((*slots[q].recv_sizes)[r] != (*slots[r].sizes)[q]) {
            return fail("rank ", q, " expects ", (*slots[q].recv_sizes)[r], " bytes from rank ", r,
                        ", which sends ", (*slots[r].sizes)[q]);
          }
        }
      }
    }
    return absl::OkStatus();
  }

  std::shared_ptr<State> state_;
  const int rank_;
};

}  // namespace

LocalGroup::LocalGroup(int size, LocalGroupOptions options)
    : state_(std::make_shared<State>(size, std::move(options))) {}

int LocalGroup::size() const { return state_->size; }

std::unique_ptr<Communicator> LocalGroup::Member(int rank) {
  std::lock_guard<std::mutex> lock(state_->mu);
  if (rank < 0 || rank >= state_->size || state_->taken[rank]) return nullptr;
  state_->taken[rank] = true;
  return std::make_unique<LocalCommunicator>(state_, rank);
}

}  // namespace furnace::comm
