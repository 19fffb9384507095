// The emulated device's transport (emulated_transport.h): argument checks at the call, the host
// communicator's operation enqueued on the stream with translated pointers.
#include "runtime/comm/emulated_transport.h"

#include <atomic>
#include <chrono>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "runtime/base/status.h"
#include "runtime/comm/collective_checks.h"
#include "runtime/comm/stream_communicator.h"

namespace furnace::comm {
namespace {

using SteadyClock = std::chrono::steady_clock;

// What the queued operations share with the transport: the host communicator and the sticky
// asynchronous error.
struct Shared {
  explicit Shared(std::unique_ptr<Communicator> h) : host(std::move(h)) {}
  absl::Status Error() const {
    std::lock_guard<std::mutex> lock(mu);
    return error;
  }
  absl::Status Fail(absl::Status status) {
    std::lock_guard<std::mutex> lock(mu);
    if (error.ok()) error = std::move(status);
    return error;
  }

  const std::unique_ptr<Communicator> host;
  mutable std::mutex mu;
  absl::Status error;  // guarded by mu
};

using HostOp = std::function<absl::Status(Communicator&)>;

class EmulatedTransport final : public Communicator {
 public:
  EmulatedTransport(std::unique_ptr<Communicator> host, device::EmulatedDevice& device,
                    device::Stream& stream, const EmulatedTransportOptions& options)
      : shared_(std::make_shared<Shared>(std::move(host))),
        device_(device),
        stream_(stream),
        timeout_(std::chrono::duration_cast<SteadyClock::duration>(
            std::chrono::duration<double>(options.timeout_s))),
        timeout_s_(options.timeout_s) {}

  int rank() const override { return shared_->host->rank(); }
  int size() const override { return shared_->host->size(); }
  const std::string& name() const override { return shared_->host->name(); }

  absl::Status AllReduce(float* data, int64_t count) override {
    const CallTimer timer;
    constexpr char kOp[] = "all_reduce";
    RETURN_IF_ERROR(Begin());
    RETURN_IF_ERROR(Check(kOp, CheckAllReduceArgs(data, count)));
    RETURN_IF_ERROR(OnDevice(kOp, "data", data, count * 4));
    float* d = T(data);
    RETURN_IF_ERROR(Enqueue([d, count](Communicator& h) { return h.AllReduce(d, count); }));
    counters_.Add(CollectiveOp::kAllReduce, count * 4, timer.Seconds());
    return absl::OkStatus();
  }

  absl::Status ReduceScatter(const float* in, float* out, int64_t count_per_rank) override {
    const CallTimer timer;
    constexpr char kOp[] = "reduce_scatter";
    RETURN_IF_ERROR(Begin());
    RETURN_IF_ERROR(Check(kOp, CheckReduceScatterArgs(in, out, count_per_rank)));
    RETURN_IF_ERROR(OnDevice(kOp, "in", in, count_per_rank * size() * 4));
    RETURN_IF_ERROR(OnDevice(kOp, "out", out, count_per_rank * 4));
    const float* i = T(in);
    float* o = T(out);
    RETURN_IF_ERROR(Enqueue(
        [i, o, count_per_rank](Communicator& h) { return h.ReduceScatter(i, o, count_per_rank); }));
    counters_.Add(CollectiveOp::kReduceScatter, count_per_rank * size() * 4, timer.Seconds());
    return absl::OkStatus();
  }

  absl::Status ReduceScatterV(const float* in, float* out,
                              const std::vector<int64_t>& counts) override {
    const CallTimer timer;
    constexpr char kOp[] = "reduce_scatter";
    RETURN_IF_ERROR(Begin());
    RETURN_IF_ERROR(Check(kOp, CheckReduceScatterVArgs(in, out, counts, rank(), size())));
    RETURN_IF_ERROR(OnDevice(kOp, "in", in, Sum(counts) * 4));
    RETURN_IF_ERROR(OnDevice(kOp, "out", out, counts[rank()] * 4));
    const float* i = T(in);
    float* o = T(out);
    RETURN_IF_ERROR(
        Enqueue([i, o, counts](Communicator& h) { return h.ReduceScatterV(i, o, counts); }));
    counters_.Add(CollectiveOp::kReduceScatter, Sum(counts) * 4, timer.Seconds());
    return absl::OkStatus();
  }

  absl::Status AllGather(const void* in, void* out, int64_t bytes_per_rank) override {
    const CallTimer timer;
    constexpr char kOp[] = "all_gather";
    RETURN_IF_ERROR(Begin());
    RETURN_IF_ERROR(Check(kOp, CheckAllGatherArgs(in, out, bytes_per_rank)));
    RETURN_IF_ERROR(OnDevice(kOp, "in", in, bytes_per_rank));
    RETURN_IF_ERROR(OnDevice(kOp, "out", out, bytes_per_rank * size()));
    const void* i = T(in);
    void* o = T(out);
    RETURN_IF_ERROR(Enqueue(
        [i, o, bytes_per_rank](Communicator& h) { return h.AllGather(i, o, bytes_per_rank); }));
    counters_.Add(CollectiveOp::kAllGather, bytes_per_rank, timer.Seconds());
    return absl::OkStatus();
  }

  absl::Status AllGatherV(const void* in, int64_t in_bytes, void* out,
                          const std::vector<int64_t>& recv_bytes) override {
    const CallTimer timer;
    constexpr char kOp[] = "all_gather";
    RETURN_IF_ERROR(Begin());
    RETURN_IF_ERROR(Check(kOp, CheckAllGatherVArgs(in, in_bytes, out, recv_bytes, rank(), size())));
    RETURN_IF_ERROR(OnDevice(kOp, "in", in, in_bytes));
    RETURN_IF_ERROR(OnDevice(kOp, "out", out, Sum(recv_bytes)));
    const void* i = T(in);
    void* o = T(out);
    RETURN_IF_ERROR(Enqueue([i, in_bytes, o, recv_bytes](Communicator& h) {
      return h.AllGatherV(i, in_bytes, o, recv_bytes);
    }));
    counters_.Add(CollectiveOp::kAllGather, in_bytes, timer.Seconds());
    return absl::OkStatus();
  }

  absl::Status AllToAllV(const void* in, const std::vector<int64_t>& send_bytes, void* out,
                         const std::vector<int64_t>& recv_bytes) override {
    const CallTimer timer;
    constexpr char kOp[] = "all_to_all";
    RETURN_IF_ERROR(Begin());
    RETURN_IF_ERROR(
        Check(kOp, CheckAllToAllVArgs(in, send_bytes, out, recv_bytes, rank(), size())));
    RETURN_IF_ERROR(OnDevice(kOp, "in", in, Sum(send_bytes)));
    RETURN_IF_ERROR(OnDevice(kOp, "out", out, Sum(recv_bytes)));
    const void* i = T(in);
    void* o = T(out);
    RETURN_IF_ERROR(Enqueue([i, send_bytes, o, recv_bytes](Communicator& h) {
      return h.AllToAllV(i, send_bytes, o, recv_bytes);
    }));
    counters_.Add(CollectiveOp::kAllToAll, Sum(send_bytes), timer.Seconds());
    return absl::OkStatus();
  }

  absl::Status Broadcast(void* data, int64_t bytes, int root) override {
    const CallTimer timer;
    constexpr char kOp[] = "broadcast";
    RETURN_IF_ERROR(Begin());
    RETURN_IF_ERROR(Check(kOp, CheckBroadcastArgs(data, bytes, root, size())));
    RETURN_IF_ERROR(OnDevice(kOp, "data", data, bytes));
    void* d = T(data);
    RETURN_IF_ERROR(
        Enqueue([d, bytes, root](Communicator& h) { return h.Broadcast(d, bytes, root); }));
    counters_.Add(CollectiveOp::kBroadcast, bytes, timer.Seconds());
    return absl::OkStatus();
  }

  absl::Status Send(const void* data, int64_t bytes, int peer, uint32_t tag) override {
    const CallTimer timer;
    constexpr char kOp[] = "send";
    RETURN_IF_ERROR(Begin());
    RETURN_IF_ERROR(Check(kOp, CheckPointToPointArgs(data, bytes, peer, size())));
    RETURN_IF_ERROR(OnDevice(kOp, "data", data, bytes));
    const void* d = T(data);
    RETURN_IF_ERROR(
        Enqueue([d, bytes, peer, tag](Communicator& h) { return h.Send(d, bytes, peer, tag); },
                SendsDone::kNotHere));
    sends_outstanding_ = true;
    counters_.Add(CollectiveOp::kSend, bytes, timer.Seconds());
    return absl::OkStatus();
  }

  absl::Status Recv(void* data, int64_t bytes, int peer, uint32_t tag) override {
    const CallTimer timer;
    constexpr char kOp[] = "recv";
    RETURN_IF_ERROR(Begin());
    RETURN_IF_ERROR(Check(kOp, CheckPointToPointArgs(data, bytes, peer, size())));
    RETURN_IF_ERROR(OnDevice(kOp, "data", data, bytes));
    void* d = T(data);
    RETURN_IF_ERROR(
        Enqueue([d, bytes, peer, tag](Communicator& h) { return h.Recv(d, bytes, peer, tag); },
                SendsDone::kAfter));
    counters_.Add(CollectiveOp::kRecv, bytes, timer.Seconds());
    return absl::OkStatus();
  }

  // The host transport's own, in stream order (behind the Sends it posts).
  absl::Status PostSends() override {
    RETURN_IF_ERROR(Begin());
    return Enqueue([](Communicator& h) { return h.PostSends(); });
  }

  absl::Status WaitSends() override {
    RETURN_IF_ERROR(Begin());
    RETURN_IF_ERROR(Enqueue([](Communicator& h) { return h.WaitSends(); }, SendsDone::kNotHere));
    sends_outstanding_ = false;
    return WaitForStream("wait_sends");
  }

  absl::Status Barrier() override {
    const CallTimer timer;
    RETURN_IF_ERROR(Begin());
    RETURN_IF_ERROR(Enqueue([](Communicator& h) { return h.Barrier(); }));
    RETURN_IF_ERROR(WaitForStream("barrier"));
    counters_.Add(CollectiveOp::kBarrier, 0, timer.Seconds());
    return absl::OkStatus();
  }

  void Abort(const std::string& reason) override {
    shared_->Fail(absl::CancelledError(absl::StrCat("aborted: ", reason))).IgnoreError();
    shared_->host->Abort(reason);
  }

  absl::Status AsyncError() const override {
    RETURN_IF_ERROR(shared_->Error());
    return shared_->host->AsyncError();
  }

 private:
  std::string What(const char* op) const {
    return absl::StrFormat("emulated %s on %s (rank %d of %d)", op, name(), rank(), size());
  }

  // The sticky error, or the host communicator's (a peer's failure), made sticky here.
  absl::Status Begin() {
    absl::Status status = AsyncError();
    if (!status.ok()) return shared_->Fail(std::move(status));
    return absl::OkStatus();
  }

  absl::Status Check(const char* op, const absl::Status& args) {
    if (args.ok()) return args;
    return shared_->Fail(absl::InvalidArgumentError(
        absl::StrCat(What(op), ": invalid arguments: ", args.message())));
  }

  // Every buffer the operation touches must be this device's memory, as it must be for NCCL.
  absl::Status OnDevice(const char* op, const char* which, const void* ptr, int64_t bytes) {
    if (bytes <= 0 || device_.Owns(ptr, static_cast<size_t>(bytes))) return absl::OkStatus();
    return shared_->Fail(absl::InvalidArgumentError(
        absl::StrFormat("%s: %s (%p, %d bytes) is not memory of device %s", What(op), which, ptr,
                        bytes, device_.name())));
  }

  template <typename P>
  P* T(P* ptr) const {
    return static_cast<P*>(device_.Translate(ptr));
  }

  // Where, in the stream's order, the sends enqueued since the last such point are waited for
  // (header: NCCL posts its held sends in one group with the next Recv, or alone before any other
  // operation, and that stream operation ends once they are delivered).
  enum class SendsDone { kBefore, kAfter, kNotHere };

  // Runs `op` on the host communicator when the stream gets there, unless the transport has
  // failed by then (an aborted or failed NCCL communicator runs nothing either); with the host's
  // WaitSends before or after it while sends are outstanding.
  absl::Status Enqueue(HostOp op, SendsDone sends = SendsDone::kBefore) {
    std::shared_ptr<Shared> shared = shared_;
    const bool wait_before = sends_outstanding_ && sends == SendsDone::kBefore;
    const bool wait_after = sends_outstanding_ && sends == SendsDone::kAfter;
    if (sends != SendsDone::kNotHere) sends_outstanding_ = false;
    absl::Status launched =
        device_.Launch(stream_, [shared, op = std::move(op), wait_before, wait_after] {
          if (!shared->Error().ok()) return;
          absl::Status status = wait_before ? shared->host->WaitSends() : absl::OkStatus();
          if (status.ok()) status = op(*shared->host);
          if (status.ok() && wait_after) status = shared->host->WaitSends();
          if (!status.ok()) shared->Fail(std::move(status)).IgnoreError();
        });
    if (!launched.ok()) return shared_->Fail(std::move(launched));
    return absl::OkStatus();
  }

  // Blocks until the stream has run everything enqueued so far, the transport fails, or timeout_s.
  absl::Status WaitForStream(const char* op) {
    auto reached = std::make_shared<std::atomic<bool>>(false);
    absl::Status launched = device_.Launch(stream_, [reached] { reached->store(true); });
    if (!launched.ok()) return shared_->Fail(std::move(launched));
    const SteadyClock::time_point deadline = SteadyClock::now() + timeout_;
    auto pause = std::chrono::microseconds(20);
    while (!reached->load()) {
      RETURN_IF_ERROR(shared_->Error());
      if (SteadyClock::now() >= deadline) {
        absl::Status timed_out = shared_->Fail(absl::DeadlineExceededError(absl::StrFormat(
            "%s: not done on its stream after %.3f s (a peer is gone or stalled, or the stream "
            "waits for work that does not complete)",
            What(op), timeout_s_)));
        shared_->host->Abort(std::string(timed_out.message()));
        return timed_out;
      }
      std::this_thread::sleep_for(pause);
      pause = std::min<std::chrono::microseconds>(pause * 2, std::chrono::milliseconds(1));
    }
    return shared_->Error();
  }

  const std::shared_ptr<Shared> shared_;
  device::EmulatedDevice& device_;
  device::Stream& stream_;
  const SteadyClock::duration timeout_;
  const double timeout_s_;
  // Sends enqueued since the last operation that waits for them (the operations' thread only).
  bool sends_outstanding_ = false;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Communicator>> CreateEmulatedTransport(
    std::unique_ptr<Communicator> host, device::EmulatedDevice& device, device::Stream& stream,
    EmulatedTransportOptions options) {
  if (host == nullptr)
    return absl::InvalidArgumentError("emulated transport: no host communicator");
  if (device::EmulatedDeviceOf(stream) != &device) {
    return absl::InvalidArgumentError(absl::StrCat("emulated transport for ", host->name(),
                                                   ": the stream is not a stream of ",
                                                   device.name()));
  }
  if (!(options.timeout_s > 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("emulated transport for ", host->name(), ": timeout_s must be > 0"));
  }
  return std::unique_ptr<Communicator>(
      new EmulatedTransport(std::move(host), device, stream, options));
}

absl::StatusOr<std::unique_ptr<Communicator>> CreateEmulatedStreamCommunicator(
    std::unique_ptr<Communicator> host, device::EmulatedDevice& device,
    std::shared_ptr<CommWatchdog> watchdog, EmulatedTransportOptions options) {
  if (host == nullptr || watchdog == nullptr) {
    return absl::InvalidArgumentError(
        "emulated stream communicator: needs a host communicator and a watchdog");
  }
  ASSIGN_OR_RETURN(std::unique_ptr<device::Stream> stream, device.CreateStream());
  ASSIGN_OR_RETURN(std::unique_ptr<Communicator> transport,
                   CreateEmulatedTransport(std::move(host), device, *stream, options));
  ASSIGN_OR_RETURN(std::unique_ptr<StreamCommunicator> comm,
                   StreamCommunicator::Create(std::move(transport), std::move(stream), device,
                                              std::move(watchdog)));
  return std::unique_ptr<Communicator>(std::move(comm));
}

}  // namespace furnace::comm
