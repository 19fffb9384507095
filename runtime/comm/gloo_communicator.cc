#include "runtime/comm/gloo_communicator.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "gloo/allgather.h"
#include "gloo/allgatherv.h"
#include "gloo/allreduce.h"
#include "gloo/alltoallv.h"
#include "gloo/barrier.h"
#include "gloo/broadcast.h"
#include "gloo/math.h"
#include "gloo/transport/unbound_buffer.h"
#include "runtime/base/status.h"
#include "runtime/comm/collective_checks.h"
#include "runtime/comm/gloo_error.h"
#include "runtime/comm/in_flight.h"
#include "runtime/comm/prefixed_kv_store.h"

namespace furnace::comm {
namespace {

using Clock = std::chrono::steady_clock;
using ReduceFn = void (*)(void*, const void*, const void*, size_t);

// Gloo's collectives use slot prefixes 0x01..0x08 in the top byte; point-to-point messages get
// one of their own, with the user's tag where Gloo puts a collective's tag.
constexpr uint64_t kP2pSlotPrefix = 0x40;
uint64_t P2pSlot(uint32_t tag) { return (kP2pSlotPrefix << 56) | (uint64_t{tag} << 24); }

// Gloo wants a non-null pointer even for an empty buffer.
char empty_buffer[1];
void* OrEmpty(void* ptr) { return ptr != nullptr ? ptr : empty_buffer; }

class GlooCommunicator final : public Communicator {
 public:
  GlooCommunicator(std::shared_ptr<gloo::Context> ctx, std::string name, int rank, int size,
                   std::chrono::milliseconds timeout)
      : ctx_(std::move(ctx)), name_(std::move(name)), rank_(rank), size_(size), timeout_(timeout) {}

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::string& name() const override { return name_; }

  absl::Status AllReduce(float* data, int64_t count) override {
    const ScopedInFlight in_flight("all_reduce", *this);
    const CallTimer timer;
    RETURN_IF_ERROR(AsyncError());
    RETURN_IF_ERROR(CheckArgs("all_reduce", CheckAllReduceArgs(data, count)));
    if (size_ > 1 && count > 0) {
      RETURN_IF_ERROR(RunGloo("all_reduce", -1, [&] {
        gloo::AllreduceOptions opts(ctx_);
        opts.setOutput(data, static_cast<size_t>(count));
        opts.setReduceFunction(static_cast<ReduceFn>(&gloo::sum<float>));
        opts.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
        opts.setTag(next_tag_++);
        opts.setTimeout(timeout_);
        gloo::allreduce(opts);
      }));
    }
    counters_.Add(CollectiveOp::kAllReduce, count * 4, timer.Seconds());
    return absl::OkStatus();
  }

  absl::Status ReduceScatter(const float* in, float* out, int64_t count_per_rank) override {
    const ScopedInFlight in_flight("reduce_scatter", *this);
    RETURN_IF_ERROR(AsyncError());
    RETURN_IF_ERROR(CheckArgs("reduce_scatter", CheckReduceScatterArgs(in, out, count_per_rank)));
    return ReduceScatterImpl(in, out, std::vector<int64_t>(size_, count_per_rank));
  }

  absl::Status ReduceScatterV(const float* in, float* out,
                              const std::vector<int64_t>& counts) override {
    const ScopedInFlight in_flight("reduce_scatter", *this);
    RETURN_IF_ERROR(AsyncError());
    RETURN_IF_ERROR(
        CheckArgs("reduce_scatter", CheckReduceScatterVArgs(in, out, counts, rank_, size_)));
    return ReduceScatterImpl(in, out, counts);
  }

  absl::Status AllGather(const void* in, void* out, int64_t bytes_per_rank) override {
    const ScopedInFlight in_flight("all_gather", *this);
    const CallTimer timer;
    RETURN_IF_ERROR(AsyncError());
    RETURN_IF_ERROR(CheckArgs("all_gather", CheckAllGatherArgs(in, out, bytes_per_rank)));
    if (bytes_per_rank > 0) {
      if (size_ == 1) {
        std::memcpy(out, in, bytes_per_rank);
      } else {
        RETURN_IF_ERROR(RunGloo("all_gather", -1, [&] {
          gloo::AllgatherOptions opts(ctx_);
          opts.setInput(const_cast<uint8_t*>(static_cast<const uint8_t*>(in)), bytes_per_rank);
          opts.setOutput(static_cast<uint8_t*>(out), bytes_per_rank * size_);
          opts.setTag(next_tag_++);
          opts.setTimeout(timeout_);
          gloo::allgather(opts);
        }));
      }
    }
    counters_.Add(CollectiveOp::kAllGather, bytes_per_rank, timer.Seconds());
    return absl::OkStatus();
  }

  absl::Status AllGatherV(const void* in, int64_t in_bytes, void* out,
                          const std::vector<int64_t>& recv_bytes) override {
    const ScopedInFlight in_flight("all_gather", *this);
    const CallTimer timer;
    RETURN_IF_ERROR(AsyncError());
    RETURN_IF_ERROR(
        CheckArgs("all_gather", CheckAllGatherVArgs(in, in_bytes, out, recv_bytes, rank_, size_)));
    const int64_t total = Sum(recv_bytes);
    if (total > 0) {
      if (size_ == 1) {
        std::memcpy(out, in, in_bytes);
      } else {
        RETURN_IF_ERROR(RunGloo("all_gather", -1, [&] {
          gloo::AllgathervOptions opts(ctx_);
          opts.setInput(static_cast<uint8_t*>(OrEmpty(const_cast<void*>(in))), in_bytes);
          opts.setOutput(static_cast<uint8_t*>(out),
                         std::vector<size_t>(recv_bytes.begin(), recv_bytes.end()));
          opts.setTag(next_tag_++);
          opts.setTimeout(timeout_);
          gloo::allgatherv(opts);
        }));
      }
    }
    counters_.Add(CollectiveOp::kAllGather, in_bytes, timer.Seconds());
    return absl::OkStatus();
  }

  absl::Status AllToAllV(const void* in, const std::vector<int64_t>& send_bytes, void* out,
                         const std::vector<int64_t>& recv_bytes) override {
    const ScopedInFlight in_flight("all_to_all", *this);
    const CallTimer timer;
    RETURN_IF_ERROR(AsyncError());
    RETURN_IF_ERROR(
        CheckArgs("all_to_all", CheckAllToAllVArgs(in, send_bytes, out, recv_bytes, rank_, size_)));
    const int64_t sent = Sum(send_bytes);
    RETURN_IF_ERROR(AllToAllBytes("all_to_all", in, send_bytes, out, recv_bytes));
    counters_.Add(CollectiveOp::kAllToAll, sent, timer.Seconds());
    return absl::OkStatus();
  }

  absl::Status Broadcast(void* data, int64_t bytes, int root) override {
    const ScopedInFlight in_flight("broadcast", *this);
    const CallTimer timer;
    RETURN_IF_ERROR(AsyncError());
    RETURN_IF_ERROR(CheckArgs("broadcast", CheckBroadcastArgs(data, bytes, root, size_)));
    if (size_ > 1 && bytes > 0) {
      RETURN_IF_ERROR(RunGloo("broadcast", root, [&] {
        gloo::BroadcastOptions opts(ctx_);
        opts.setOutput(static_cast<uint8_t*>(data), bytes);
        opts.setRoot(root);
        opts.setTag(next_tag_++);
        opts.setTimeout(timeout_);
        gloo::broadcast(opts);
      }));
    }
    counters_.Add(CollectiveOp::kBroadcast, bytes, timer.Seconds());
    return absl::OkStatus();
  }

  absl::Status Send(const void* data, int64_t bytes, int peer, uint32_t tag) override {
    const ScopedInFlight in_flight("send", *this, peer);
    const CallTimer timer;
    RETURN_IF_ERROR(AsyncError());
    RETURN_IF_ERROR(CheckArgs("send", CheckPointToPointArgs(data, bytes, peer, size_)));
    std::vector<char> copy(static_cast<const char*>(data),
                           static_cast<const char*>(data) + (bytes > 0 ? bytes : 0));
    if (peer == rank_) {
      self_messages_[tag].push_back(std::move(copy));
    } else {
      PendingSend send;
      send.data = std::move(copy);
      send.peer = peer;
      RETURN_IF_ERROR(RunGloo("send", peer, [&] {
        send.buffer = ctx_->createUnboundBuffer(OrEmpty(send.data.data()), bytes);
        send.buffer->send(peer, P2pSlot(tag), 0, bytes);
      }));
      std::lock_guard<std::mutex> lock(mu_);
      sends_.push_back(std::move(send));
    }
    counters_.Add(CollectiveOp::kSend, bytes, timer.Seconds());
    return absl::OkStatus();
  }

  absl::Status Recv(void* data, int64_t bytes, int peer, uint32_t tag) override {
    const ScopedInFlight in_flight("recv", *this, peer);
    const CallTimer timer;
    RETURN_IF_ERROR(AsyncError());
    RETURN_IF_ERROR(CheckArgs("recv", CheckPointToPointArgs(data, bytes, peer, size_)));
    if (peer == rank_) {
      RETURN_IF_ERROR(RecvFromSelf(data, bytes, tag));
    } else {
      std::unique_ptr<gloo::transport::UnboundBuffer> buffer;
      RETURN_IF_ERROR(RunGloo("recv", peer, [&] {
        buffer = ctx_->createUnboundBuffer(OrEmpty(data), bytes);
        buffer->recv(peer, P2pSlot(tag), 0, bytes);
      }));
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (!error_.ok()) return error_;
        blocked_recv_ = buffer.get();  // Abort releases it from here on
      }
      bool completed = false;
      absl::Status status =
          GuardGloo(What("recv", peer), [&] { completed = buffer->waitRecv(timeout_); });
      {
        std::lock_guard<std::mutex> lock(mu_);
        blocked_recv_ = nullptr;
      }
      if (!status.ok()) return Fail(status);
      if (!completed) return AsyncError();  // only Abort makes waitRecv return false
    }
    counters_.Add(CollectiveOp::kRecv, bytes, timer.Seconds());
    return absl::OkStatus();
  }

  absl::Status PostSends() override { return AsyncError(); }  // posted at Send

  absl::Status WaitSends() override {
    const ScopedInFlight in_flight("wait_sends", *this);
    RETURN_IF_ERROR(AsyncError());
    const Clock::time_point deadline = Clock::now() + timeout_;
    while (true) {
      gloo::transport::UnboundBuffer* buffer = nullptr;
      int peer = -1;
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (!error_.ok()) return error_;
        if (sends_.empty()) return absl::OkStatus();
        buffer = sends_.front().buffer.get();
        peer = sends_.front().peer;
      }
      // At least 1 ms: Gloo reads a non-positive timeout as "use the context default".
      const auto left =
          std::max(std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()),
                   std::chrono::milliseconds(1));
      bool completed = false;
      RETURN_IF_ERROR(RunGloo("wait_sends", peer, [&] { completed = buffer->waitSend(left); }));
      if (!completed) return AsyncError();
      std::lock_guard<std::mutex> lock(mu_);
      sends_.pop_front();
    }
  }

  absl::Status Barrier() override {
    const ScopedInFlight in_flight("barrier", *this);
    const CallTimer timer;
    RETURN_IF_ERROR(AsyncError());
    if (size_ > 1) {
      RETURN_IF_ERROR(RunGloo("barrier", -1, [&] {
        gloo::BarrierOptions opts(ctx_);
        opts.setTag(next_tag_++);
        opts.setTimeout(timeout_);
        gloo::barrier(opts);
      }));
    }
    counters_.Add(CollectiveOp::kBarrier, 0, timer.Seconds());
    return absl::OkStatus();
  }

  void Abort(const std::string& reason) override {
    std::lock_guard<std::mutex> lock(mu_);
    RecordAndCloseLocked(absl::CancelledError(absl::StrCat("aborted: ", reason)));
    if (blocked_recv_ != nullptr) blocked_recv_->abortWaitRecv();
    for (PendingSend& send : sends_) send.buffer->abortWaitSend();
  }

  absl::Status AsyncError() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return error_;
  }

 private:
  struct PendingSend {
    std::vector<char> data;  // the caller's payload, copied; Gloo sends from here
    std::unique_ptr<gloo::transport::UnboundBuffer> buffer;
    int peer = -1;
  };

  std::string What(const char* op, int peer) const {
    return absl::StrFormat("gloo %s on %s (rank %d of %d%s)", op, name_, rank_, size_,
                           peer >= 0 ? absl::StrFormat(", peer %d", peer) : "");
  }

  absl::Status Invalid(const char* op, const std::string& detail) const {
    return absl::InvalidArgumentError(absl::StrCat(What(op, -1), ": invalid arguments: ", detail));
  }

  // OK, or `args` (a collective_checks.h verdict) as this op's sticky InvalidArgument error.
  absl::Status CheckArgs(const char* op, const absl::Status& args) {
    if (args.ok()) return args;
    return Fail(Invalid(op, std::string(args.message())));
  }

  // Runs a Gloo call; a throw becomes the sticky error. An Abort during the call (which may have
  // made Gloo's waits return early) also fails it.
  template <typename Fn>
  absl::Status RunGloo(const char* op, int peer, Fn&& fn) {
    absl::Status status = GuardGloo(What(op, peer), std::forward<Fn>(fn));
    if (!status.ok()) return Fail(status);
    return AsyncError();
  }

  // Records `status` unless an error came first; returns the sticky error.
  absl::Status Fail(absl::Status status) {
    std::lock_guard<std::mutex> lock(mu_);
    RecordAndCloseLocked(std::move(status));
    return error_;
  }

  void RecordAndCloseLocked(absl::Status status) {
    if (error_.ok()) error_ = std::move(status);
    if (ctx_ != nullptr && !closed_) {
      closed_ = true;
      // Hard-closes every pair: peers blocked on this rank see a reset connection at once.
      GuardGloo("close", [&] { ctx_->closeConnections(); }).IgnoreError();
    }
  }

  // `counts` already checked.
  absl::Status ReduceScatterImpl(const float* in, float* out, const std::vector<int64_t>& counts) {
    const CallTimer timer;
    const int64_t mine = counts[rank_];
    const int64_t total = Sum(counts);
    if (size_ == 1) {
      if (mine > 0) std::memcpy(out, in, mine * sizeof(float));
    } else if (total > 0) {
      // Every rank's chunk for this rank, in rank order; then summed in rank order.
      scratch_.resize(static_cast<size_t>(mine * size_));
      std::vector<int64_t> send_bytes(size_), recv_bytes(size_, mine * 4);
      for (int r = 0; r < size_; ++r) send_bytes[r] = counts[r] * 4;
      RETURN_IF_ERROR(AllToAllBytes("reduce_scatter", in, send_bytes, scratch_.data(), recv_bytes));
      if (mine > 0) std::memcpy(out, scratch_.data(), mine * sizeof(float));
      for (int r = 1; r < size_; ++r) {
        const float* chunk = scratch_.data() + r * mine;
        for (int64_t i = 0; i < mine; ++i) out[i] += chunk[i];
      }
    }
    counters_.Add(CollectiveOp::kReduceScatter, total * 4, timer.Seconds());
    return absl::OkStatus();
  }

  // Gloo's all-to-all-v on bytes; a local copy for a group of one.
  absl::Status AllToAllBytes(const char* op, const void* in, const std::vector<int64_t>& send_bytes,
                             void* out, const std::vector<int64_t>& recv_bytes) {
    if (size_ == 1) {
      if (send_bytes[0] > 0) std::memcpy(out, in, send_bytes[0]);
      return absl::OkStatus();
    }
    return RunGloo(op, -1, [&] {
      gloo::AlltoallvOptions opts(ctx_);
      opts.setInput(static_cast<uint8_t*>(OrEmpty(const_cast<void*>(in))), send_bytes);
      opts.setOutput(static_cast<uint8_t*>(OrEmpty(out)), recv_bytes);
      opts.setTag(next_tag_++);
      opts.setTimeout(timeout_);
      gloo::alltoallv(opts);
    });
  }

  absl::Status RecvFromSelf(void* data, int64_t bytes, uint32_t tag) {
    auto it = self_messages_.find(tag);
    if (it == self_messages_.end() || it->second.empty()) {
      return Fail(absl::FailedPreconditionError(absl::StrCat(
          What("recv", rank_), ": no message with tag ", tag, " was sent to self (would hang)")));
    }
    std::vector<char> message = std::move(it->second.front());
    it->second.pop_front();
    if (static_cast<int64_t>(message.size()) != bytes) {
      return Fail(Invalid("recv", absl::StrFormat("%d bytes expected from self, %d were sent",
                                                  bytes, message.size())));
    }
    if (bytes > 0) std::memcpy(data, message.data(), bytes);
    return absl::OkStatus();
  }

  const std::shared_ptr<gloo::Context> ctx_;  // null for a group of one
  const std::string name_;
  const int rank_;
  const int size_;
  const std::chrono::milliseconds timeout_;

  // Compute thread only.
  uint32_t next_tag_ = 0;
  std::vector<float> scratch_;
  std::map<uint32_t, std::deque<std::vector<char>>> self_messages_;

  mutable std::mutex mu_;
  absl::Status error_;                                      // guarded by mu_
  bool closed_ = false;                                     // guarded by mu_
  std::deque<PendingSend> sends_;                           // guarded by mu_
  gloo::transport::UnboundBuffer* blocked_recv_ = nullptr;  // guarded by mu_
};

}  // namespace

absl::StatusOr<std::unique_ptr<Communicator>> CreateGlooCommunicator(KvStore& store,
                                                                     const std::string& prefix,
                                                                     const std::string& name,
                                                                     int rank, int size,
                                                                     const GlooOptions& options) {
  if (size < 1 || rank < 0 || rank >= size || !(options.timeout_s > 0) ||
      !(options.op_timeout_s >= 0)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("gloo communicator %s: rank %d of %d, timeout_s %g, op_timeout_s %g", name,
                        rank, size, options.timeout_s, options.op_timeout_s));
  }
  std::shared_ptr<gloo::Context> ctx;
  if (size > 1) {
    PrefixedKvStore scoped(store, prefix);
    GlooOptions connect = options;
    connect.rank = rank;
    connect.size = size;
    absl::StatusOr<std::shared_ptr<gloo::Context>> connected = ConnectGloo(scoped, connect);
    if (!connected.ok()) {
      return absl::Status(connected.status().code(),
                          absl::StrFormat("gloo communicator %s (prefix '%s'): %s", name, prefix,
                                          connected.status().message()));
    }
    ctx = *std::move(connected);
  }
  const auto timeout =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::duration<double>(
          options.op_timeout_s > 0 ? options.op_timeout_s : options.timeout_s));
  return std::unique_ptr<Communicator>(std::make_unique<GlooCommunicator>(
      std::move(ctx), name, rank, size, std::max(timeout, std::chrono::milliseconds(1))));
}

}  // namespace furnace::comm
