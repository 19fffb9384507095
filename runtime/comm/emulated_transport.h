// A device transport for the emulated discrete device: the Communicator contract over the device's
// memory, every operation enqueued on one stream of the device and run there, by the stream's
// thread, through a host communicator (the in-process LocalGroup, or Gloo) on the translated
// pointers. It stands where NCCL stands on a GPU (nccl_communicator.h: "every operation is
// enqueued on the stream given at creation and returns once enqueued"), so the stream-ordered
// communicator (stream_communicator.h), its watchdog (comm_watchdog.h) and the fused exchange on
// two streams (fused_exchange.h) run and are tested on machines without a GPU.
//
// Per call: the arguments are checked at once (collective_checks.h, and every buffer with bytes
// must be this device's memory: InvalidArgument otherwise, as NCCL rejects host memory), the
// operation is enqueued on the stream and the call returns. The stream runs it when it gets there:
// the buffers are read and written then, so they must stay valid until then (stream order, as on
// a GPU). Send copies its payload when the stream runs it (NCCL copies it on the stream too).
// Sends complete in stream order as NCCL's do (nccl_communicator.h: the held sends are posted in
// one group with the next Recv, or alone before any other operation, and the stream operation
// ends once they are delivered): the next Recv runs the host's WaitSends after its receive, any
// other operation (PostSends included) before its own, so the host transport holds no send beyond
// that point (Gloo keeps a copy of each payload until it is waited for).
// Barrier and WaitSends are the host-side sync points: they return once the stream has run them,
// or fail with DeadlineExceeded after timeout_s (a stream held by PauseStream, or a producer it
// waits for, never gets there).
//
// Errors: a failure of the host communicator inside an enqueued operation is this transport's
// sticky asynchronous error (AsyncError(), as ncclCommGetAsyncError): later operations are skipped
// on the stream, and every later call returns it. Abort(reason) records Cancelled("aborted:
// <reason>") and aborts the host communicator, which wakes an operation blocked in it on the
// stream's thread (LocalGroup: at once; Gloo: as far as Gloo allows). Byte counters follow
// communicator.h: the bytes of each call, its enqueue time as its seconds (as NCCL's).
//
// Ownership: owns the host communicator (shared with the operations still queued, so this object
// may go before they run); borrows the device and the stream, which must outlive every operation
// enqueued. Thread-safety: one thread at a time for the operations (the thread that drives the
// stream); Abort and AsyncError from any thread.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "runtime/comm/comm_watchdog.h"
#include "runtime/comm/communicator.h"
#include "runtime/device/emulated_device.h"

namespace furnace::comm {

struct EmulatedTransportOptions {
  double timeout_s = 30;  // Barrier's and WaitSends' host-side wait
};

// InvalidArgument when `stream` is not a stream of `device` or timeout_s is not positive.
absl::StatusOr<std::unique_ptr<Communicator>> CreateEmulatedTransport(
    std::unique_ptr<Communicator> host, device::EmulatedDevice& device, device::Stream& stream,
    EmulatedTransportOptions options = {});

// The communicator of one group for a rank on the emulated device, as rank_groups.cc makes one
// with NCCL for a CUDA rank: a communication stream of the group's own on `device`, this transport
// around `host` on it, and a StreamCommunicator (stream_communicator.h) over both that `watchdog`
// (the rank's, shared by all its groups) follows. So a rank on the emulated device runs its
// collectives exactly the way a CUDA rank does: on their own streams, ordered by events, under the
// watchdog. InvalidArgument for a null host or watchdog; the device's errors.
absl::StatusOr<std::unique_ptr<Communicator>> CreateEmulatedStreamCommunicator(
    std::unique_ptr<Communicator> host, device::EmulatedDevice& device,
    std::shared_ptr<CommWatchdog> watchdog, EmulatedTransportOptions options = {});

}  // namespace furnace::comm
