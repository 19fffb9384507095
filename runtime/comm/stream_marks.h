// Points on a device stream that the host can poll without blocking: Mark(stream) enqueues one,
// Passed() says whether the stream has got there, and SecondsSince() gives the stream time between
// two marks. The watchdog of the stream-ordered collectives (comm_watchdog.h) follows every
// collective with a mark after it, and the time between the marks around a collective is its
// stream time (stream_communicator.h).
//
// Why not device::Event: its waits block (WaitEvent, SynchronizeEvent), and a watchdog that must
// notice an operation that never completes cannot block on it. Per device kind:
//   CUDA      a timing cudaEvent recorded on the stream, polled with cudaEventQuery, timed with
//             cudaEventElapsedTime; the events come from a pool and go back to it with the mark.
//   emulated  an operation enqueued on the stream (EmulatedDevice::Launch) that stamps the
//             monotonic clock when the stream's thread runs it.
//   CPU       the CPU device's streams are synchronous: a mark has passed when it is made.
//
// Ownership: a marker borrows its device, which must outlive it and every mark it made; marks are
// independent of the marker (they may outlive it) and of the stream's lifetime once passed.
// Thread-safety: Mark from the thread that drives the stream; Passed and SecondsSince from any
// thread. Errors: the device's (a CUDA failure as device::CudaStatus words; InvalidArgument for a
// stream of another device).
#pragma once

#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "runtime/device/device.h"

namespace furnace::comm {

class StreamMark {
 public:
  virtual ~StreamMark() = default;
  // Whether the stream has passed this mark (everything enqueued before it has completed).
  virtual absl::StatusOr<bool> Passed() = 0;
  // Stream seconds from `earlier` (a mark made before this one on the same stream, by the same
  // marker) to this one. Both must have passed; FailedPrecondition otherwise.
  virtual absl::StatusOr<double> SecondsSince(const StreamMark& earlier) const = 0;
};

class StreamMarker {
 public:
  virtual ~StreamMarker() = default;
  virtual absl::StatusOr<std::unique_ptr<StreamMark>> Mark(device::Stream& stream) = 0;
};

// The marker for `device`'s kind. FailedPrecondition for CUDA in a build without CUDA.
absl::StatusOr<std::unique_ptr<StreamMarker>> CreateStreamMarker(device::Device& device);

}  // namespace furnace::comm
