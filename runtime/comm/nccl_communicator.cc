#include "runtime/comm/nccl_communicator.h"

#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "runtime/base/status.h"
#include "runtime/comm/collective_checks.h"
#include "runtime/comm/nccl_library.h"
#include "runtime/comm/prefixed_kv_store.h"

namespace furnace::comm {
namespace {

using Clock = std::chrono::steady_clock;

constexpr char kUniqueIdKey[] = "nccl_id";
constexpr auto kPollInterval = std::chrono::microseconds(200);
// The longest a communicator's destruction waits for ncclCommFinalize before aborting.
constexpr auto kFinalizeTimeout = std::chrono::seconds(30);

absl::StatusCode CodeOf(ncclResult_t result) {
  switch (result) {
    case ncclInvalidArgument:
    case ncclInvalidUsage:
      return absl::StatusCode::kInvalidArgument;
    case ncclSystemError:
    case ncclRemoteError:
      return absl::StatusCode::kUnavailable;
    default:
      return absl::StatusCode::kInternal;
  }
}

bool Failed(ncclResult_t result) { return result != ncclSuccess && result != ncclInProgress; }

std::vector<int64_t> Offsets(const std::vector<int64_t>& sizes) {
  std::vector<int64_t> offsets(sizes.size(), 0);
  for (size_t i = 1; i < sizes.size(); ++i) offsets[i] = offsets[i - 1] + sizes[i - 1];
  return offsets;
}

// Runs `issue` (which returns the first failure of its NCCL calls) inside one NCCL group.
template <typename Fn>
ncclResult_t Grouped(Fn&& issue) {
  ncclResult_t result = ncclGroupStart();
  if (Failed(result)) return result;
  const ncclResult_t first = issue();
  const ncclResult_t end = ncclGroupEnd();
  return Failed(first) ? first : end;
}

// Polls a nonblocking communicator until its pending operation has left ncclInProgress, calling
// `tick` (if any) about once a second.
ncclResult_t WaitInit(ncclComm_t comm, Clock::time_point deadline, bool& timed_out,
                      const std::function<void()>& tick = nullptr) {
  timed_out = false;
  Clock::time_point next_tick = Clock::now() + std::chrono::seconds(1);
  while (true) {
    ncclResult_t state = ncclSuccess;
    const ncclResult_t result = ncclCommGetAsyncError(comm, &state);
    if (Failed(result)) return result;
    if (state != ncclInProgress) return state;
    const Clock::time_point now = Clock::now();
    if (now >= deadline) {
      timed_out = true;
      return ncclInProgress;
    }
    if (tick && now >= next_tick) {
      tick();
      next_tick = now + std::chrono::seconds(1);
    }
    std::this_thread::sleep_for(kPollInterval);
  }
}

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(ncclComm_t comm, std::string name, int rank, int size,
                   const NcclOptions& options, float* barrier_scratch)
      : name_(std::move(name)),
        rank_(rank),
        size_(size),
        device_(options.device),
        stream_(options.stream),
        timeout_(std::chrono::duration_cast<Clock::duration>(
            std::chrono::duration<double>(options.timeout_s))),
        barrier_scratch_(barrier_scratch),
        comm_(comm) {}

  ~NcclCommunicator() override {
    cudaSetDevice(device_);
    for (const PendingSend& send : sends_) cudaFreeAsync(send.data, stream_);
    bool healthy = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      healthy = error_.ok();
    }
    ncclComm_t comm = nullptr;
    {
      std::lock_guard<std::mutex> lock(comm_mu_);
      comm = std::exchange(comm_, nullptr);
    }
    if (comm != nullptr) {
      // Finalize flushes what is still queued; a failed or slow finalize aborts instead. Slow is
      // kFinalizeTimeout at most: peers that stopped calling (this rank leaves on an error of its
      // own) would otherwise hold its exit for the whole collective timeout.
      bool timed_out = false;
      if (healthy && !Failed(ncclCommFinalize(comm)) &&
          WaitInit(comm, Clock::now() + std::min<Clock::duration>(timeout_, kFinalizeTimeout),
                   timed_out) == ncclSuccess) {
        ncclCommDestroy(comm);
      } else {
        ncclCommAbort(comm);
      }
    }
    // After the destroy or abort: nothing of this communicator is left on the stream to wait for.
    cudaFreeAsync(barrier_scratch_, stream_);
    cudaGetLastError();
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::string& name() const override { return name_; }

  absl::Status AllReduce(float* data, int64_t count) override {
    const CallTimer timer;
    RETURN_IF_ERROR(Begin("all_reduce"));
    RETURN_IF_ERROR(CheckArgs("all_reduce", CheckAllReduceArgs(data, count)));
    if (count > 0) {
      RETURN_IF_ERROR(Enqueue("all_reduce", [&](ncclComm_t comm) {
        return ncclAllReduce(data, data, count, ncclFloat32, ncclSum, comm, stream_);
      }));
    }
    counters_.Add(CollectiveOp::kAllReduce, count * 4, timer.Seconds());
    return absl::OkStatus();
  }

  absl::Status ReduceScatter(const float* in, float* out, int64_t count_per_rank) override {
    const CallTimer timer;
    RETURN_IF_ERROR(Begin("reduce_scatter"));
    RETURN_IF_ERROR(CheckArgs("reduce_scatter", CheckReduceScatterArgs(in, out, count_per_rank)));
    if (count_per_rank > 0) {
      RETURN_IF_ERROR(Enqueue("reduce_scatter", [&](ncclComm_t comm) {
        return ncclReduceScatter(in, out, count_per_rank, ncclFloat32, ncclSum, comm, stream_);
      }));
    }
    counters_.Add(CollectiveOp::kReduceScatter, count_per_rank * size_ * 4, timer.Seconds());
    return absl::OkStatus();
  }

  // Pads every chunk to the largest count, reduce-scatters, and copies this rank's part out.
  absl::Status ReduceScatterV(const float* in, float* out,
                              const std::vector<int64_t>& counts) override {
    const CallTimer timer;
    RETURN_IF_ERROR(Begin("reduce_scatter"));
    RETURN_IF_ERROR(
        CheckArgs("reduce_scatter", CheckReduceScatterVArgs(in, out, counts, rank_, size_)));
    const int64_t total = Sum(counts);
    const int64_t widest = *std::max_element(counts.begin(), counts.end());
    if (widest > 0) {
      const std::vector<int64_t> offsets = Offsets(counts);
      float* padded = nullptr;  // (size * widest) padded input, then (widest) output
      const size_t padded_bytes = static_cast<size_t>(size_ * widest) * sizeof(float);
      RETURN_IF_ERROR(Cuda("reduce_scatter", cudaMallocAsync(reinterpret_cast<void**>(&padded),
                                                             padded_bytes + widest * 4, stream_)));
      absl::Status status =
          Cuda("reduce_scatter", cudaMemsetAsync(padded, 0, padded_bytes, stream_));
      for (int r = 0; r < size_ && status.ok(); ++r) {
        if (counts[r] == 0) continue;
        status = Cuda("reduce_scatter",
                      cudaMemcpyAsync(padded + r * widest, in + offsets[r], counts[r] * 4,
                                      cudaMemcpyDeviceToDevice, stream_));
      }
      if (status.ok()) {
        status = Enqueue("reduce_scatter", [&](ncclComm_t comm) {
          return ncclReduceScatter(padded, padded + size_ * widest, widest, ncclFloat32, ncclSum,
                                   comm, stream_);
        });
      }
      if (status.ok() && counts[rank_] > 0) {
        status =
            Cuda("reduce_scatter", cudaMemcpyAsync(out, padded + size_ * widest, counts[rank_] * 4,
                                                   cudaMemcpyDeviceToDevice, stream_));
      }
      cudaFreeAsync(padded, stream_);
      RETURN_IF_ERROR(status);
    }
    counters_.Add(CollectiveOp::kReduceScatter, total * 4, timer.Seconds());
    return absl::OkStatus();
  }

  absl::Status AllGather(const void* in, void* out, int64_t bytes_per_rank) override {
    const CallTimer timer;
    RETURN_IF_ERROR(Begin("all_gather"));
    RETURN_IF_ERROR(CheckArgs("all_gather", CheckAllGatherArgs(in, out, bytes_per_rank)));
    if (bytes_per_rank > 0) {
      RETURN_IF_ERROR(Enqueue("all_gather", [&](ncclComm_t comm) {
        return ncclAllGather(in, out, bytes_per_rank, ncclUint8, comm, stream_);
      }));
    }
    counters_.Add(CollectiveOp::kAllGather, bytes_per_rank, timer.Seconds());
    return absl::OkStatus();
  }

  // One broadcast per rank with something to contribute, in one group.
  absl::Status AllGatherV(const void* in, int64_t in_bytes, void* out,
                          const std::vector<int64_t>& recv_bytes) override {
    const CallTimer timer;
    RETURN_IF_ERROR(Begin("all_gather"));
    RETURN_IF_ERROR(
        CheckArgs("all_gather", CheckAllGatherVArgs(in, in_bytes, out, recv_bytes, rank_, size_)));
    if (Sum(recv_bytes) > 0) {
      const std::vector<int64_t> offsets = Offsets(recv_bytes);
      char* base = static_cast<char*>(out);
      RETURN_IF_ERROR(Enqueue("all_gather", [&](ncclComm_t comm) {
        return Grouped([&] {
          for (int r = 0; r < size_; ++r) {
            if (recv_bytes[r] == 0) continue;
            const void* send = r == rank_ ? in : base + offsets[r];
            const ncclResult_t result =
                ncclBroadcast(send, base + offsets[r], recv_bytes[r], ncclUint8, r, comm, stream_);
            if (Failed(result)) return result;
          }
          return ncclSuccess;
        });
      }));
    }
    counters_.Add(CollectiveOp::kAllGather, in_bytes, timer.Seconds());
    return absl::OkStatus();
  }

  absl::Status AllToAllV(const void* in, const std::vector<int64_t>& send_bytes, void* out,
                         const std::vector<int64_t>& recv_bytes) override {
    const CallTimer timer;
    RETURN_IF_ERROR(Begin("all_to_all"));
    RETURN_IF_ERROR(
        CheckArgs("all_to_all", CheckAllToAllVArgs(in, send_bytes, out, recv_bytes, rank_, size_)));
    const int64_t sent = Sum(send_bytes);
    const std::vector<int64_t> send_offsets = Offsets(send_bytes);
    const std::vector<int64_t> recv_offsets = Offsets(recv_bytes);
    const char* src = static_cast<const char*>(in);
    char* dst = static_cast<char*>(out);
    if (send_bytes[rank_] > 0) {
      RETURN_IF_ERROR(Cuda("all_to_all",
                           cudaMemcpyAsync(dst + recv_offsets[rank_], src + send_offsets[rank_],
                                           send_bytes[rank_], cudaMemcpyDeviceToDevice, stream_)));
    }
    RETURN_IF_ERROR(Enqueue("all_to_all", [&](ncclComm_t comm) {
      return Grouped([&] {
        for (int r = 0; r < size_; ++r) {
          if (r == rank_) continue;
          if (send_bytes[r] > 0) {
            const ncclResult_t result =
                ncclSend(src + send_offsets[r], send_bytes[r], ncclUint8, r, comm, stream_);
            if (Failed(result)) return result;
          }
          if (recv_bytes[r] > 0) {
            const ncclResult_t result =
                ncclRecv(dst + recv_offsets[r], recv_bytes[r], ncclUint8, r, comm, stream_);
            if (Failed(result)) return result;
          }
        }
        return ncclSuccess;
      });
    }));
    counters_.Add(CollectiveOp::kAllToAll, sent, timer.Seconds());
    return absl::OkStatus();
  }

  absl::Status Broadcast(void* data, int64_t bytes, int root) override {
    const CallTimer timer;
    RETURN_IF_ERROR(Begin("broadcast"));
    RETURN_IF_ERROR(CheckArgs("broadcast", CheckBroadcastArgs(data, bytes, root, size_)));
    if (bytes > 0) {
      RETURN_IF_ERROR(Enqueue("broadcast", [&](ncclComm_t comm) {
        return ncclBroadcast(data, data, bytes, ncclUint8, root, comm, stream_);
      }));
    }
    counters_.Add(CollectiveOp::kBroadcast, bytes, timer.Seconds());
    return absl::OkStatus();
  }

  absl::Status Send(const void* data, int64_t bytes, int peer, uint32_t /*tag*/) override {
    const CallTimer timer;
    RETURN_IF_ERROR(Begin("send", /*flush=*/false));
    RETURN_IF_ERROR(CheckArgs("send", CheckPointToPointArgs(data, bytes, peer, size_)));
    if (bytes > 0) {
      PendingSend send{nullptr, bytes, peer};
      RETURN_IF_ERROR(Cuda("send", cudaMallocAsync(&send.data, bytes, stream_)));
      sends_.push_back(send);  // freed at flush or destruction, even if the copy fails
      RETURN_IF_ERROR(
          Cuda("send", cudaMemcpyAsync(send.data, data, bytes, cudaMemcpyDeviceToDevice, stream_)));
    }
    counters_.Add(CollectiveOp::kSend, bytes, timer.Seconds());
    return absl::OkStatus();
  }

  absl::Status Recv(void* data, int64_t bytes, int peer, uint32_t /*tag*/) override {
    const CallTimer timer;
    RETURN_IF_ERROR(Begin("recv", /*flush=*/false));
    RETURN_IF_ERROR(CheckArgs("recv", CheckPointToPointArgs(data, bytes, peer, size_)));
    RETURN_IF_ERROR(PostSends("recv", [&](ncclComm_t comm) {
      return bytes > 0 ? ncclRecv(data, bytes, ncclUint8, peer, comm, stream_) : ncclSuccess;
    }));
    counters_.Add(CollectiveOp::kRecv, bytes, timer.Seconds());
    return absl::OkStatus();
  }

  absl::Status PostSends() override { return Begin("post_sends"); }

  absl::Status WaitSends() override {
    RETURN_IF_ERROR(Begin("wait_sends"));
    return WaitStream("wait_sends");
  }

  absl::Status Barrier() override {
    const CallTimer timer;
    RETURN_IF_ERROR(Begin("barrier"));
    RETURN_IF_ERROR(Enqueue("barrier", [&](ncclComm_t comm) {
      return ncclAllReduce(barrier_scratch_, barrier_scratch_, 1, ncclFloat32, ncclSum, comm,
                           stream_);
    }));
    RETURN_IF_ERROR(WaitStream("barrier"));
    counters_.Add(CollectiveOp::kBarrier, 0, timer.Seconds());
    return absl::OkStatus();
  }

  void Abort(const std::string& reason) override {
    Fail(absl::CancelledError(absl::StrCat("aborted: ", reason))).IgnoreError();
  }

  absl::Status AsyncError() const override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!error_.ok()) return error_;
    }
    std::lock_guard<std::mutex> lock(comm_mu_);
    if (comm_ == nullptr) return absl::OkStatus();
    ncclResult_t state = ncclSuccess;
    const ncclResult_t result = ncclCommGetAsyncError(comm_, &state);
    if (Failed(result)) return NcclStatusLocked("async error", result);
    if (Failed(state)) return NcclStatusLocked("async error", state);
    return absl::OkStatus();
  }

 private:
  struct PendingSend {
    void* data;  // stream-ordered device copy of the payload
    int64_t bytes;
    int peer;
  };

  std::string What(const char* op) const {
    return absl::StrFormat("nccl %s on %s (rank %d of %d)", op, name_, rank_, size_);
  }

  absl::Status Invalid(const char* op, const std::string& detail) const {
    return absl::InvalidArgumentError(absl::StrCat(What(op), ": invalid arguments: ", detail));
  }

  absl::Status NcclStatusLocked(const char* op, ncclResult_t result) const {
    const char* last = comm_ != nullptr ? ncclGetLastError(comm_) : "";
    return absl::Status(CodeOf(result),
                        absl::StrFormat("%s: %s%s%s", What(op), ncclGetErrorString(result),
                                        *last != '\0' ? ": " : "", last));
  }

  // A failed CUDA call as this op's sticky error. The runtime's per-thread last error is cleared
  // (cuda_status.h): left set, the next kernel launch check on this thread (kernels/cuda) would
  // report it as that kernel's failure.
  absl::Status Cuda(const char* op, cudaError_t err) {
    if (err == cudaSuccess) return absl::OkStatus();
    cudaGetLastError();
    const absl::StatusCode code = err == cudaErrorMemoryAllocation
                                      ? absl::StatusCode::kResourceExhausted
                                      : absl::StatusCode::kInternal;
    return Fail(absl::Status(code, absl::StrFormat("%s: %s (%s)", What(op), cudaGetErrorString(err),
                                                   cudaGetErrorName(err))));
  }

  // OK, or `args` (a collective_checks.h verdict) as this op's sticky InvalidArgument error.
  absl::Status CheckArgs(const char* op, const absl::Status& args) {
    if (args.ok()) return args;
    return Fail(Invalid(op, std::string(args.message())));
  }

  // Every op starts here: the sticky error, NCCL's asynchronous one, the device, and (except for
  // Send and Recv, which post them themselves) the queued sends.
  absl::Status Begin(const char* op, bool flush = true) {
    absl::Status status = AsyncError();
    if (!status.ok()) return Fail(status);
    RETURN_IF_ERROR(Cuda(op, cudaSetDevice(device_)));
    if (flush && !sends_.empty()) {
      RETURN_IF_ERROR(PostSends(op, [](ncclComm_t) { return ncclSuccess; }));
    }
    return absl::OkStatus();
  }

  // Posts the queued sends and `also` in one group, then frees the send copies (stream-ordered).
  template <typename Fn>
  absl::Status PostSends(const char* op, Fn&& also) {
    absl::Status status = Enqueue(op, [&](ncclComm_t comm) {
      return Grouped([&] {
        for (const PendingSend& send : sends_) {
          const ncclResult_t result =
              ncclSend(send.data, send.bytes, ncclUint8, send.peer, comm, stream_);
          if (Failed(result)) return result;
        }
        return also(comm);
      });
    });
    for (const PendingSend& send : sends_) cudaFreeAsync(send.data, stream_);
    sends_.clear();
    return status;
  }

  // Issues `issue(comm)` and waits (at most the timeout) until NCCL has enqueued it.
  template <typename Fn>
  absl::Status Enqueue(const char* op, Fn&& issue) {
    absl::Status status;
    {
      std::lock_guard<std::mutex> lock(comm_mu_);
      if (comm_ == nullptr) return AsyncErrorOrAborted();
      const ncclResult_t result = issue(comm_);
      if (Failed(result)) status = NcclStatusLocked(op, result);
    }
    if (!status.ok()) return Fail(status);
    return Poll(op, /*stream_too=*/false);
  }

  // Waits until the stream has drained (stream_too) or the communicator is no longer enqueueing.
  absl::Status WaitStream(const char* op) { return Poll(op, /*stream_too=*/true); }

  absl::Status Poll(const char* op, bool stream_too) {
    const Clock::time_point deadline = Clock::now() + timeout_;
    while (true) {
      ncclResult_t state = ncclSuccess;
      absl::Status status;
      {
        std::lock_guard<std::mutex> lock(comm_mu_);
        if (comm_ == nullptr) return AsyncErrorOrAborted();
        const ncclResult_t result = ncclCommGetAsyncError(comm_, &state);
        if (Failed(result)) status = NcclStatusLocked(op, result);
        if (Failed(state)) status = NcclStatusLocked(op, state);
      }
      if (!status.ok()) return Fail(status);
      if (state == ncclSuccess) {
        if (!stream_too) return absl::OkStatus();
        const cudaError_t query = cudaStreamQuery(stream_);
        if (query == cudaSuccess) return absl::OkStatus();
        if (query != cudaErrorNotReady) return Cuda(op, query);
        cudaGetLastError();  // not ready is left as the thread's last error too: see Cuda()
      }
      if (Clock::now() >= deadline) {
        return Fail(absl::DeadlineExceededError(
            absl::StrFormat("%s: not done after %.3f s (a peer is gone or stalled)", What(op),
                            std::chrono::duration<double>(timeout_).count())));
      }
      std::this_thread::sleep_for(kPollInterval);
    }
  }

  absl::Status AsyncErrorOrAborted() const {
    std::lock_guard<std::mutex> lock(mu_);
    return error_.ok() ? absl::InternalError(absl::StrCat(What("op"), ": communicator is gone"))
                       : error_;
  }

  // Records `status` unless an error came first, aborts the communicator (which releases kernels
  // of it still waiting on the stream), and returns the sticky error.
  absl::Status Fail(absl::Status status) {
    absl::Status sticky;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (error_.ok()) error_ = std::move(status);
      sticky = error_;
    }
    // Taken out under the lock, aborted outside it: the abort may wait for the device (it frees
    // memory) behind another communicator's stuck kernel, and the watchdog's AsyncError must not
    // wait on this lock meanwhile (it is what aborts that other communicator).
    ncclComm_t comm = nullptr;
    {
      std::lock_guard<std::mutex> lock(comm_mu_);
      comm = std::exchange(comm_, nullptr);
    }
    if (comm != nullptr) ncclCommAbort(comm);
    return sticky;
  }

  const std::string name_;
  const int rank_;
  const int size_;
  const int device_;
  cudaStream_t const stream_;
  const Clock::duration timeout_;
  float* const barrier_scratch_;  // owned, 1 float of device memory

  std::vector<PendingSend> sends_;  // compute thread only; owned device copies

  mutable std::mutex mu_;
  absl::Status error_;  // guarded by mu_

  // Held for every (nonblocking, short) NCCL call and to take comm_ out; not across an abort or a
  // finalize (they may wait for the device), so destruction does not wait for an abort running on
  // another thread: the watchdog, the only one, is unregistered before (~StreamCommunicator).
  mutable std::mutex comm_mu_;
  ncclComm_t comm_;  // guarded by comm_mu_; null once aborted
};

absl::StatusOr<ncclUniqueId> ShareUniqueId(KvStore& store, const std::string& what, int rank,
                                           const NcclOptions& options) {
  ncclUniqueId id;
  if (rank == 0) {
    const ncclResult_t result = ncclGetUniqueId(&id);
    if (result != ncclSuccess) {
      return absl::Status(CodeOf(result),
                          absl::StrCat(what, ": ncclGetUniqueId: ", ncclGetErrorString(result)));
    }
    RETURN_IF_ERROR(store.Set(kUniqueIdKey, std::string(id.internal, sizeof(id.internal))));
    return id;
  }
  // In slices of at most a second, so the caller's tick runs while rank 0 is not there yet.
  const Clock::time_point deadline =
      Clock::now() +
      std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(options.timeout_s));
  absl::StatusOr<std::vector<std::string>> values;
  while (true) {
    const double left = std::chrono::duration<double>(deadline - Clock::now()).count();
    const double slice = options.on_wait_tick ? std::min(1.0, std::max(left, 0.0)) : left;
    values = store.Get({kUniqueIdKey}, slice);
    if (values.ok() || !absl::IsDeadlineExceeded(values.status()) || slice >= left) break;
    options.on_wait_tick();
  }
  if (!values.ok()) return values.status();
  if ((*values)[0].size() != sizeof(id.internal)) {
    return absl::InternalError(absl::StrFormat("%s: the published NCCL id has %d bytes, want %d",
                                               what, (*values)[0].size(), sizeof(id.internal)));
  }
  std::memcpy(id.internal, (*values)[0].data(), sizeof(id.internal));
  return id;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Communicator>> CreateNcclCommunicator(KvStore& store,
                                                                     const std::string& prefix,
                                                                     const std::string& name,
                                                                     int rank, int size,
                                                                     const NcclOptions& options) {
  const std::string what = absl::StrFormat("nccl communicator %s (rank %d of %d, prefix '%s')",
                                           name, rank, size, prefix);
  if (size < 1 || rank < 0 || rank >= size || !(options.timeout_s > 0)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: bad rank/size or timeout_s %g", what, options.timeout_s));
  }
  // A host without NCCL fails here, before the rendezvous, as what it is (not a peer's fault).
  if (absl::Status nccl = LoadNccl(); !nccl.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(what, ": ", nccl.message()));
  }
  cudaError_t err = cudaSetDevice(options.device);
  if (err != cudaSuccess) {
    return absl::UnavailableError(absl::StrFormat("%s: cudaSetDevice(%d): %s", what, options.device,
                                                  cudaGetErrorString(err)));
  }
  PrefixedKvStore scoped(store, prefix);
  absl::StatusOr<ncclUniqueId> id = ShareUniqueId(scoped, what, rank, options);
  if (!id.ok()) {
    return absl::Status(id.status().code(), absl::StrCat(what, ": ", id.status().message()));
  }

  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // every call returns at once; we poll with a deadline and can abort
  ncclComm_t comm = nullptr;
  ncclResult_t result = ncclCommInitRankConfig(&comm, size, *id, rank, &config);
  bool timed_out = false;
  if (!Failed(result) && comm != nullptr) {
    const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                             std::chrono::duration<double>(options.timeout_s));
    result = WaitInit(comm, deadline, timed_out, options.on_wait_tick);
  }
  if (result != ncclSuccess || comm == nullptr) {
    const std::string last = comm != nullptr ? ncclGetLastError(comm) : "";
    if (comm != nullptr) ncclCommAbort(comm);
    if (timed_out) {
      return absl::DeadlineExceededError(
          absl::StrFormat("%s: peers did not join within %.3f s", what, options.timeout_s));
    }
    return absl::Status(CodeOf(result), absl::StrFormat("%s: ncclCommInitRankConfig: %s %s", what,
                                                        ncclGetErrorString(result), last));
  }

  // Stream-ordered on the communicator's stream (which outlives it: NcclOptions.stream), as
  // everything the barrier does: a plain cudaFree would synchronise the device at destruction,
  // and with it every other group's collective in flight.
  float* barrier_scratch = nullptr;
  err = cudaMallocAsync(reinterpret_cast<void**>(&barrier_scratch), sizeof(float), options.stream);
  if (err == cudaSuccess) err = cudaMemsetAsync(barrier_scratch, 0, sizeof(float), options.stream);
  if (err != cudaSuccess) {
    cudaGetLastError();
    ncclCommAbort(comm);
    if (barrier_scratch != nullptr) cudaFreeAsync(barrier_scratch, options.stream);
    cudaGetLastError();
    return absl::InternalError(absl::StrCat(what, ": ", cudaGetErrorString(err)));
  }
  return std::unique_ptr<Communicator>(
      std::make_unique<NcclCommunicator>(comm, name, rank, size, options, barrier_scratch));
}

}  // namespace furnace::comm
