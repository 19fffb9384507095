// StreamCommunicator (stream_communicator.h): events around each collective, host arguments staged
// through pinned memory and device scratch on the communication stream, marks for the watchdog.
#include "runtime/comm/stream_communicator.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>
#include <utility>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/lsan_interface.h>
#endif

#include "absl/strings/str_cat.h"
#include "runtime/base/status.h"
#include "runtime/comm/collective_checks.h"
#include "runtime/comm/in_flight.h"
#include "runtime/device/current_stream.h"

namespace furnace::comm {
namespace {

constexpr int64_t kScratchAlignment = 256;

int64_t RoundUp(int64_t n) {
  return (n + kScratchAlignment - 1) / kScratchAlignment * kScratchAlignment;
}

}  // namespace

namespace {

// Device scratch of one call, freed in the communication stream's order when it goes out of scope
// (after everything enqueued on the stream that uses it).
class Scratch {
 public:
  Scratch(device::Device& device, device::Stream& stream) : device_(device), stream_(stream) {}
  ~Scratch() { Release(); }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;

  absl::StatusOr<char*> Allocate(int64_t bytes) {
    const device::StreamScope scope(stream_);
    ASSIGN_OR_RETURN(void* p, device_.Allocate(static_cast<size_t>(bytes)));
    data_ = static_cast<char*>(p);
    return data_;
  }
  void Release() {
    if (data_ == nullptr) return;
    const device::StreamScope scope(stream_);
    device_.Free(data_);
    data_ = nullptr;
  }

 private:
  device::Device& device_;
  device::Stream& stream_;
  char* data_ = nullptr;
};

}  // namespace

absl::StatusOr<std::unique_ptr<StreamCommunicator>> StreamCommunicator::Create(
    std::unique_ptr<Communicator> transport, std::unique_ptr<device::Stream> stream,
    device::Device& device, std::shared_ptr<CommWatchdog> watchdog) {
  if (transport == nullptr || stream == nullptr || watchdog == nullptr) {
    return absl::InvalidArgumentError(
        "stream communicator: the transport, the stream and the watchdog are required");
  }
  const std::string what = absl::StrCat("stream communicator ", transport->name(), ": ");
  auto annotate = [&](const absl::Status& s) {
    return absl::Status(s.code(), absl::StrCat(what, s.message()));
  };
  absl::StatusOr<std::unique_ptr<StreamMarker>> marker = CreateStreamMarker(device);
  if (!marker.ok()) return annotate(marker.status());
  absl::StatusOr<std::unique_ptr<device::Event>> ready = device.CreateEvent();
  if (!ready.ok()) return annotate(ready.status());
  absl::StatusOr<std::unique_ptr<device::Event>> done = device.CreateEvent();
  if (!done.ok()) return annotate(done.status());
  return std::unique_ptr<StreamCommunicator>(
      new StreamCommunicator(std::move(transport), std::move(stream), device, std::move(watchdog),
                             std::move(*marker), std::move(*ready), std::move(*done)));
}

StreamCommunicator::StreamCommunicator(std::unique_ptr<Communicator> transport,
                                       std::unique_ptr<device::Stream> stream,
                                       device::Device& device,
                                       std::shared_ptr<CommWatchdog> watchdog,
                                       std::unique_ptr<StreamMarker> marker,
                                       std::unique_ptr<device::Event> ready,
                                       std::unique_ptr<device::Event> done)
    : stream_(std::move(stream)),
      transport_(std::move(transport)),
      device_(device),
      watchdog_(std::move(watchdog)),
      marker_(std::move(marker)),
      ready_(std::move(ready)),
      done_(std::move(done)),
      staging_(std::make_unique<PinnedStaging>(device)) {
  watchdog_->Register(this);
}

StreamCommunicator::~StreamCommunicator() {
  watchdog_->Unregister(this);
  // A call that failed after enqueueing its staging copies left them on C, which may never get to
  // them (behind a collective on a dead peer): their pinned staging is not freed under them, but
  // left to the process (a rank whose communicator failed is on its way out). Waiting for C
  // instead could wait for as long as the peers' timeouts.
  if (staging_in_use_) {
    [[maybe_unused]] PinnedStaging* left = staging_.release();
#if defined(__SANITIZE_ADDRESS__)
    __lsan_ignore_object(left);  // left on purpose: not a leak for LeakSanitizer to report
#endif
  }
}

device::Stream& StreamCommunicator::CallerStream() const {
  return device::CurrentStreamOf(device_);
}

absl::Status StreamCommunicator::RecordError(absl::Status status) {
  std::lock_guard<std::mutex> lock(mu_);
  if (error_.ok()) error_ = std::move(status);
  return error_;
}

void StreamCommunicator::AbortTransport() {
  absl::Status sticky;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (aborted_) return;
    aborted_ = true;
    sticky = error_;
  }
  transport_->Abort(std::string(sticky.message()));
}

absl::Status StreamCommunicator::FailWith(absl::Status status) {
  absl::Status sticky = RecordError(std::move(status));
  AbortTransport();
  return sticky;
}

void StreamCommunicator::Fail(absl::Status status) { FailWith(std::move(status)).IgnoreError(); }

void StreamCommunicator::Abort(const std::string& reason) {
  Fail(absl::CancelledError(absl::StrCat("aborted: ", reason)));
}

absl::Status StreamCommunicator::AsyncError() const {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!error_.ok()) return error_;
  }
  return transport_->AsyncError();
}

absl::Status StreamCommunicator::Sticky() {
  absl::Status status = AsyncError();
  if (!status.ok()) return FailWith(std::move(status));
  return absl::OkStatus();
}

absl::Status StreamCommunicator::OrderAfter(device::Stream& producer) {
  RETURN_IF_ERROR(Sticky());
  if (&producer == stream_.get()) return absl::OkStatus();
  absl::Status status = device_.RecordEvent(*ready_, producer);
  if (status.ok()) status = device_.WaitEvent(*stream_, *ready_);
  if (!status.ok()) return FailWith(std::move(status));
  return absl::OkStatus();
}

absl::Status StreamCommunicator::OrderBefore(device::Stream& consumer) {
  // No sticky check: joining only orders the streams, and a caller unwinding after a failure
  // still needs its stream to wait for what was enqueued on this one.
  if (&consumer == stream_.get()) return absl::OkStatus();
  RETURN_IF_ERROR(device_.RecordEvent(*done_, *stream_));
  return device_.WaitEvent(consumer, *done_);
}

absl::Status StreamCommunicator::WaitFor(StreamMark& end) {
  auto pause = std::chrono::microseconds(10);
  while (true) {
    absl::StatusOr<bool> passed = end.Passed();
    if (!passed.ok()) return FailWith(passed.status());
    if (*passed) return Sticky();
    RETURN_IF_ERROR(Sticky());
    std::this_thread::sleep_for(pause);
    pause = std::min<std::chrono::microseconds>(pause * 2, std::chrono::milliseconds(1));
  }
}

absl::Status StreamCommunicator::Run(CollectiveOp op, const char* name, int peer,
                                     const std::vector<Arg>& args, const EnqueueFn& enqueue) {
  const CallTimer timer;
  RETURN_IF_ERROR(Sticky());
  device::Stream& caller = CallerStream();
  device::Stream* const producer = custom_ordering_ ? after_ : &caller;
  const bool join = custom_ordering_ ? join_ : true;
  auto device_failure = [&](const absl::Status& s) {
    return FailWith(
        absl::Status(s.code(), absl::StrCat(name, " on ", this->name(), " (rank ", rank(), " of ",
                                            size(), "): ", s.message())));
  };

  // 1. The producer's point.
  if (producer != nullptr && producer != stream_.get()) {
    absl::Status s = device_.RecordEvent(*ready_, *producer);
    if (s.ok()) s = device_.WaitEvent(*stream_, *ready_);
    if (!s.ok()) return device_failure(s);
  }

  // 2. Host arguments to device scratch, on C.
  std::vector<void*> ptrs(args.size());
  std::vector<int64_t> offsets(args.size(), -1);
  int64_t staged = 0;
  for (size_t k = 0; k < args.size(); ++k) {
    ptrs[k] = const_cast<void*>(args[k].ptr);
    if (args[k].ptr != nullptr && args[k].bytes > 0 && !device_.IsDeviceMemory(args[k].ptr)) {
      offsets[k] = staged;
      staged += RoundUp(args[k].bytes);
    }
  }
  Scratch scratch(device_, *stream_);
  char* pinned = nullptr;
  if (staged > 0) {
    absl::StatusOr<char*> p = staging_->Reserve(staged);
    if (!p.ok()) return device_failure(p.status());
    pinned = *p;
    absl::StatusOr<char*> d = scratch.Allocate(staged);
    if (!d.ok()) return device_failure(d.status());
    staging_in_use_ = true;  // until the result is back (step 5); see the destructor
    for (size_t k = 0; k < args.size(); ++k) {
      if (offsets[k] < 0) continue;
      ptrs[k] = *d + offsets[k];
      if (!args[k].in) continue;
      std::memcpy(pinned + offsets[k], args[k].ptr, static_cast<size_t>(args[k].bytes));
      absl::Status s =
          device_.Copy(ptrs[k], pinned + offsets[k], static_cast<size_t>(args[k].bytes),
                       device::CopyKind::kHostToDevice, *stream_);
      if (!s.ok()) return device_failure(s);
    }
  }

  // 3. The collective between two marks.
  absl::StatusOr<std::unique_ptr<StreamMark>> start = marker_->Mark(*stream_);
  if (!start.ok()) return device_failure(start.status());
  // From here the collective may be on C (even when the enqueue failed midway): a failure still
  // joins S to C, or S would free and reuse the caller's buffers while C reads or writes them.
  const auto joined_failure = [&](const absl::Status& s) {
    absl::Status failed = device_failure(s);
    if (join) OrderBefore(caller).IgnoreError();
    return failed;
  };
  const int64_t before = transport_->counters().bytes(op);
  if (absl::Status s = enqueue(ptrs); !s.ok()) {
    absl::Status failed = FailWith(std::move(s));
    if (join) OrderBefore(caller).IgnoreError();
    return failed;
  }
  const int64_t bytes = transport_->counters().bytes(op) - before;

  // 4. Host outputs back to staging, the scratch freed in C's order, the end mark, the join.
  for (size_t k = 0; k < args.size(); ++k) {
    if (offsets[k] < 0 || !args[k].out) continue;
    absl::Status s = device_.Copy(pinned + offsets[k], ptrs[k], static_cast<size_t>(args[k].bytes),
                                  device::CopyKind::kDeviceToHost, *stream_);
    if (!s.ok()) return joined_failure(s);
  }
  scratch.Release();
  absl::StatusOr<std::unique_ptr<StreamMark>> end = marker_->Mark(*stream_);
  if (!end.ok()) return joined_failure(end.status());
  std::shared_ptr<StreamMark> end_mark = std::move(*end);
  watchdog_->Track(this, op, name, peer, bytes, std::move(*start), end_mark);
  if (join) {
    absl::Status s = device_.RecordEvent(*done_, *stream_);
    if (s.ok()) s = device_.WaitEvent(caller, *done_);
    if (!s.ok()) return device_failure(s);
  }

  // 5. A call with host arguments returns with its result.
  if (staged > 0) {
    RETURN_IF_ERROR(WaitFor(*end_mark));
    staging_in_use_ = false;  // C has passed the copies
    for (size_t k = 0; k < args.size(); ++k) {
      if (offsets[k] < 0 || !args[k].out) continue;
      std::memcpy(const_cast<void*>(args[k].ptr), pinned + offsets[k],
                  static_cast<size_t>(args[k].bytes));
    }
  }
  counters_.Add(op, bytes, timer.Seconds());
  return absl::OkStatus();
}

absl::Status StreamCommunicator::AllReduce(float* data, int64_t count) {
  return Run(CollectiveOp::kAllReduce, "all_reduce", -1, {{data, count * 4, true, true}},
             [&](const std::vector<void*>& p) {
               return transport_->AllReduce(static_cast<float*>(p[0]), count);
             });
}

absl::Status StreamCommunicator::ReduceScatter(const float* in, float* out,
                                               int64_t count_per_rank) {
  return Run(
      CollectiveOp::kReduceScatter, "reduce_scatter", -1,
      {{in, count_per_rank * size() * 4, true, false}, {out, count_per_rank * 4, false, true}},
      [&](const std::vector<void*>& p) {
        return transport_->ReduceScatter(static_cast<const float*>(p[0]), static_cast<float*>(p[1]),
                                         count_per_rank);
      });
}

absl::Status StreamCommunicator::ReduceScatterV(const float* in, float* out,
                                                const std::vector<int64_t>& counts) {
  const int64_t mine = rank() < static_cast<int>(counts.size()) ? counts[rank()] : 0;
  return Run(CollectiveOp::kReduceScatter, "reduce_scatter", -1,
             {{in, Sum(counts) * 4, true, false}, {out, mine * 4, false, true}},
             [&](const std::vector<void*>& p) {
               return transport_->ReduceScatterV(static_cast<const float*>(p[0]),
                                                 static_cast<float*>(p[1]), counts);
             });
}

absl::Status StreamCommunicator::AllGather(const void* in, void* out, int64_t bytes_per_rank) {
  return Run(CollectiveOp::kAllGather, "all_gather", -1,
             {{in, bytes_per_rank, true, false}, {out, bytes_per_rank * size(), false, true}},
             [&](const std::vector<void*>& p) {
               return transport_->AllGather(p[0], p[1], bytes_per_rank);
             });
}

absl::Status StreamCommunicator::AllGatherV(const void* in, int64_t in_bytes, void* out,
                                            const std::vector<int64_t>& recv_bytes) {
  return Run(CollectiveOp::kAllGather, "all_gather", -1,
             {{in, in_bytes, true, false}, {out, Sum(recv_bytes), false, true}},
             [&](const std::vector<void*>& p) {
               return transport_->AllGatherV(p[0], in_bytes, p[1], recv_bytes);
             });
}

absl::Status StreamCommunicator::AllToAllV(const void* in, const std::vector<int64_t>& send_bytes,
                                           void* out, const std::vector<int64_t>& recv_bytes) {
  return Run(CollectiveOp::kAllToAll, "all_to_all", -1,
             {{in, Sum(send_bytes), true, false}, {out, Sum(recv_bytes), false, true}},
             [&](const std::vector<void*>& p) {
               return transport_->AllToAllV(p[0], send_bytes, p[1], recv_bytes);
             });
}

absl::Status StreamCommunicator::Broadcast(void* data, int64_t bytes, int root) {
  const bool is_root = rank() == root;
  return Run(CollectiveOp::kBroadcast, "broadcast", -1, {{data, bytes, is_root, !is_root}},
             [&](const std::vector<void*>& p) { return transport_->Broadcast(p[0], bytes, root); });
}

absl::Status StreamCommunicator::Send(const void* data, int64_t bytes, int peer, uint32_t tag) {
  return Run(CollectiveOp::kSend, "send", peer, {{data, bytes, true, false}},
             [&](const std::vector<void*>& p) { return transport_->Send(p[0], bytes, peer, tag); });
}

absl::Status StreamCommunicator::Recv(void* data, int64_t bytes, int peer, uint32_t tag) {
  return Run(CollectiveOp::kRecv, "recv", peer, {{data, bytes, false, true}},
             [&](const std::vector<void*>& p) { return transport_->Recv(p[0], bytes, peer, tag); });
}

absl::Status StreamCommunicator::WaitSends() {
  RETURN_IF_ERROR(Sticky());
  const ScopedInFlight in_flight("wait_sends", *this);
  if (absl::Status s = transport_->WaitSends(); !s.ok()) return FailWith(std::move(s));
  return Sticky();
}

absl::Status StreamCommunicator::PostSends() {
  RETURN_IF_ERROR(Sticky());
  // NCCL enqueues the held sends on C now: between two marks the watchdog follows, so a send a
  // late or dead peer never receives is reported as this call (in flight while the host posts
  // it, outstanding while C runs it), not as the next call queued behind it.
  const ScopedInFlight in_flight("post_sends", *this);
  const auto failed = [&](const absl::Status& s) {
    return FailWith(
        absl::Status(s.code(), absl::StrCat("post_sends on ", name(), ": ", s.message())));
  };
  absl::StatusOr<std::unique_ptr<StreamMark>> start = marker_->Mark(*stream_);
  if (!start.ok()) return failed(start.status());
  if (absl::Status s = transport_->PostSends(); !s.ok()) return FailWith(std::move(s));
  absl::StatusOr<std::unique_ptr<StreamMark>> end = marker_->Mark(*stream_);
  if (!end.ok()) return failed(end.status());
  watchdog_->Track(this, CollectiveOp::kSend, "post_sends", -1, 0, std::move(*start),
                   std::move(*end), /*counted=*/false);
  return Sticky();
}

absl::Status StreamCommunicator::Barrier() {
  const ScopedInFlight in_flight("barrier", *this);
  return Run(CollectiveOp::kBarrier, "barrier", -1, {},
             [&](const std::vector<void*>&) { return transport_->Barrier(); });
}

StreamCommunicator::ScopedOrdering::ScopedOrdering(StreamCommunicator& comm, device::Stream* after,
                                                   bool join)
    : comm_(comm),
      saved_custom_(comm.custom_ordering_),
      saved_after_(comm.after_),
      saved_join_(comm.join_) {
  comm_.custom_ordering_ = true;
  comm_.after_ = after;
  comm_.join_ = join;
}

StreamCommunicator::ScopedOrdering::~ScopedOrdering() {
  comm_.custom_ordering_ = saved_custom_;
  comm_.after_ = saved_after_;
  comm_.join_ = saved_join_;
}

}  // namespace furnace::comm
