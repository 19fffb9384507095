// A Communicator for ranks on a discrete device whose transport enqueues its collectives on a
// stream: NCCL on CUDA (nccl_communicator.h, NcclOptions.stream), the emulated device's transport
// elsewhere (emulated_transport.h). Each group has a communication stream of its own, and its
// collectives are ordered with the compute only by events, so compute and communication overlap
// (issue 13: "collectives on their own streams ordered by events"). Written against
// device::Device, so the same code runs on CUDA and on the emulated device.
//
// Per call, with S the calling thread's current stream (device::StreamScope; none: the device's
// default stream) and C the communication stream:
//   1. C waits for an event recorded on S now, so the collective reads its input after the kernels
//      that produce it (enqueued on S before the call);
//   2. host-memory arguments (Device::IsDeviceMemory false: the MoE dispatcher's counts, the
//      trainer's scalar statistics) are copied to device scratch on C, through pinned staging;
//   3. the transport enqueues the collective on C between two marks (stream_marks.h), and the
//      watchdog (comm_watchdog.h) follows it until C passes the second;
//   4. host outputs are copied back to staging on C, and S waits for an event recorded on C now, so
//      kernels enqueued on S after the call see the output, and S may reuse the input;
//   5. a call with host arguments then waits until the collective has completed (its callers read
//      the result on the host at once) and copies the result out; a call on device memory only
//      returns as soon as everything is enqueued.
// So a device buffer handed to a collective is ready in S's order, as for a kernel launched on S,
// and must stay allocated in S's order (a stream-ordered Free on S after the call is fine).
// ScopedOrdering changes steps 1 and 4 for the fused exchange (fused_exchange.h): another stream
// as the producer, and no join until the caller's OrderBefore.
//
// Counters (communicator.h): the bytes the transport counts; as seconds, this call's wall time on
// the host (the enqueue time; for a call with host arguments, until its result is back): this is
// what telemetry gets. stream_counters(): per op, the calls the watchdog has seen complete, their
// bytes, and their stream time (between the marks around the collective on C, waiting for the
// peers included), for benchmarks and logs.
//
// Errors: the transport's (at enqueue; asynchronous ones through AsyncError), the device's (a
// failed event, copy or allocation fails the communicator, and aborts the transport, since the
// peers can no longer be matched), and the watchdog's (a timeout or another communicator's
// asynchronous error: DeadlineExceeded / the transport's code, naming the op and the group). All
// are sticky: every later call returns the first one at once. Abort(reason): Cancelled("aborted:
// <reason>"), the transport aborted.
//
// Ownership: owns the transport and the communication stream (the transport goes first: NCCL may
// flush on the stream); borrows the device, which must outlive this; shares the watchdog with the
// rank's other communicators. Pinned staging grows on demand and is kept (and not freed at all
// after a call failed with its copies possibly still on C); device scratch is allocated and freed
// in C's order per call.
// Thread-safety: one thread at a time for the operations (the thread that drives S); Abort,
// AsyncError, Fail and the counters from any thread.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/comm/comm_watchdog.h"
#include "runtime/comm/communicator.h"
#include "runtime/comm/pinned_staging.h"
#include "runtime/comm/stream_marks.h"
#include "runtime/device/device.h"

namespace furnace::comm {

class StreamCommunicator final : public Communicator {
 public:
  // `transport` enqueues every operation on `stream` (made with it: NcclOptions.stream =
  // stream->native(), CreateEmulatedTransport(..., *stream)). InvalidArgument for a null argument;
  // the device's errors creating the events or the marker.
  static absl::StatusOr<std::unique_ptr<StreamCommunicator>> Create(
      std::unique_ptr<Communicator> transport, std::unique_ptr<device::Stream> stream,
      device::Device& device, std::shared_ptr<CommWatchdog> watchdog);
  ~StreamCommunicator() override;

  int rank() const override { return transport_->rank(); }
  int size() const override { return transport_->size(); }
  const std::string& name() const override { return transport_->name(); }

  absl::Status AllReduce(float* data, int64_t count) override;
  absl::Status ReduceScatter(const float* in, float* out, int64_t count_per_rank) override;
  absl::Status ReduceScatterV(const float* in, float* out,
                              const std::vector<int64_t>& counts) override;
  absl::Status AllGather(const void* in, void* out, int64_t bytes_per_rank) override;
  absl::Status AllGatherV(const void* in, int64_t in_bytes, void* out,
                          const std::vector<int64_t>& recv_bytes) override;
  absl::Status AllToAllV(const void* in, const std::vector<int64_t>& send_bytes, void* out,
                         const std::vector<int64_t>& recv_bytes) override;
  absl::Status Broadcast(void* data, int64_t bytes, int root) override;
  absl::Status Send(const void* data, int64_t bytes, int peer, uint32_t tag) override;
  absl::Status Recv(void* data, int64_t bytes, int peer, uint32_t tag) override;
  // The transport's: a host-side wait (NCCL: until the stream has drained, within its timeout).
  absl::Status WaitSends() override;
  // The transport's, at once (the sends were ordered on C when they were called; the caller's
  // stream does not wait for them; NCCL's host-side wait is only until they are enqueued).
  absl::Status PostSends() override;
  // The transport's host-side barrier, after C has waited for S.
  absl::Status Barrier() override;
  void Abort(const std::string& reason) override;
  absl::Status AsyncError() const override;

  device::Device& device() const { return device_; }
  device::Stream& stream() const { return *stream_; }
  Communicator& transport() const { return *transport_; }
  const CommCounters& stream_counters() const { return stream_counters_; }

  // C waits for what has been enqueued on `producer` so far.
  absl::Status OrderAfter(device::Stream& producer);
  // `consumer` waits for what has been enqueued on C so far.
  absl::Status OrderBefore(device::Stream& consumer);

  // Makes every later call fail with `status` (unless an error came first) and aborts the
  // transport. The watchdog's way to stop the rank; any thread.
  void Fail(absl::Status status);

  // Until destroyed, the calls of `comm` wait at step 1 for `after`'s point at each call instead of
  // S's (nullptr: for nothing; the owner ordered C itself, e.g. with OrderAfter), and, unless
  // `join`, skip step 4's join (the owner joins with OrderBefore). Used from the thread that
  // drives `comm`; scopes nest.
  class ScopedOrdering {
   public:
    ScopedOrdering(StreamCommunicator& comm, device::Stream* after, bool join);
    ~ScopedOrdering();
    ScopedOrdering(const ScopedOrdering&) = delete;
    ScopedOrdering& operator=(const ScopedOrdering&) = delete;

   private:
    StreamCommunicator& comm_;
    bool saved_custom_;
    device::Stream* saved_after_;
    bool saved_join_;
  };

 private:
  friend class CommWatchdog;
  // One buffer of a call: what the collective reads (in) and/or writes (out).
  struct Arg {
    const void* ptr;
    int64_t bytes;
    bool in;
    bool out;
  };
  using EnqueueFn = std::function<absl::Status(const std::vector<void*>& ptrs)>;

  StreamCommunicator(std::unique_ptr<Communicator> transport,
                     std::unique_ptr<device::Stream> stream, device::Device& device,
                     std::shared_ptr<CommWatchdog> watchdog, std::unique_ptr<StreamMarker> marker,
                     std::unique_ptr<device::Event> ready, std::unique_ptr<device::Event> done);

  // Steps 1 to 5 of the header for one collective: `enqueue` gets the args' pointers, host ones
  // replaced by their device scratch.
  absl::Status Run(CollectiveOp op, const char* name, int peer, const std::vector<Arg>& args,
                   const EnqueueFn& enqueue);
  // The sticky error, or the transport's asynchronous one (made sticky).
  absl::Status Sticky();
  // `status` as the sticky error (the first stays), the transport aborted; returns the sticky one.
  absl::Status FailWith(absl::Status status);
  // The two halves of FailWith, for the watchdog: every communicator of the rank shows the error
  // before any transport is aborted (an abort may wait for the device).
  absl::Status RecordError(absl::Status status);
  void AbortTransport();
  // Waits until `end` has passed or the communicator has failed.
  absl::Status WaitFor(StreamMark& end);
  device::Stream& CallerStream() const;
  void AddStreamTime(CollectiveOp op, int64_t bytes, double seconds) {
    stream_counters_.Add(op, bytes, seconds);
  }

  std::unique_ptr<device::Stream> stream_;  // declared before transport_: destroyed after it
  std::unique_ptr<Communicator> transport_;
  device::Device& device_;
  const std::shared_ptr<CommWatchdog> watchdog_;
  const std::unique_ptr<StreamMarker> marker_;
  const std::unique_ptr<device::Event> ready_, done_;
  std::unique_ptr<PinnedStaging> staging_;  // pinned host staging of host arguments
  // The operations' thread only: staging copies were enqueued on C and C may not have run them
  // (a call failed before its result was back); the destructor then leaves the staging allocated.
  bool staging_in_use_ = false;
  CommCounters stream_counters_;

  // Ordering of the calls (ScopedOrdering); the operations' thread only.
  bool custom_ordering_ = false;
  device::Stream* after_ = nullptr;
  bool join_ = true;

  mutable std::mutex mu_;
  absl::Status error_;    // guarded by mu_
  bool aborted_ = false;  // guarded by mu_: the transport has been aborted
};

}  // namespace furnace::comm
