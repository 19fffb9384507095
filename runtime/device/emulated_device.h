// The emulated discrete device: a Device that runs on any CPU but behaves like a GPU, so the GPU
// code paths (stream ordering, copy streams, event waits, pinned pools) run and are tested on
// machines without one (issue 13, item 5).
//
// Memory: one memfd mapped twice. The "device pointers" Allocate hands out lie in a PROT_NONE view,
// so a host dereference faults as it would on a discrete GPU; the device's own stream threads work
// through a second, read-write view of the same pages (Translate). Bytes move between host and
// device only through Device::Copy / Memset on a stream. The memfd is sparse: `memory_bytes` is
// the device's capacity, and only the pages written cost RAM. Allocation is first-fit over the
// region with 256-byte alignment (cudaMalloc's); ResourceExhausted when no hole fits.
//
// Streams: each is a worker thread executing its queue in order. Every operation (Copy, Memset,
// RecordEvent, WaitEvent, and the backend's kernels: Launch) is enqueued and returns at once, as a
// CUDA launch does, so work ordered only by the host's program order races exactly as it does on a
// GPU: a missing WaitEvent between two streams gives a wrong result. Events follow CUDA: a
// WaitEvent or SynchronizeEvent waits for the most recent RecordEvent made before the call; an
// event never recorded is complete. PauseStream/ResumeStream hold a stream's queue, which makes
// such races deterministic in tests.
//
// Host memory (AllocateHost) is plain aligned memory; an asynchronous copy reads or writes it when
// the stream reaches the copy, so it must stay valid until then (as pinned memory with
// cudaMemcpyAsync). The device counts the copies enqueued on each block and not yet run: FreeHost
// of a block with some is the sticky error FailedPrecondition (the block is then freed after the
// last of them), a copy that starts in a block and runs past its end is InvalidArgument. Allocate's
// bytes are usable at once; Free is stream-ordered (device.h): it is enqueued on the calling
// thread's current stream when that is one of this device's (else on the default stream), and the
// bytes go back to the allocator when the stream runs it, so a kernel enqueued before the Free
// still reads its scratch. Work on other streams must be ordered before it by events, as on CUDA.
// allocated_bytes() counts a freed allocation until its stream gets there.
//
// Errors: argument errors found at enqueue (a pointer that is not this device's memory for a
// device side, a stream or event of another device) are returned by the call. An error inside an
// enqueued operation (a kernel given a pointer that is not device memory) is sticky, as a CUDA
// launch error: the operation is skipped and every later Synchronize* returns the first such error.
// Thread-safety: the Device is thread-safe; a Stream is used from one host thread at a time.
// Destroying a stream finishes its queue first (a paused one is resumed); the device must outlive
// its streams and events.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "runtime/device/device.h"

namespace furnace::device {

struct EmulatedDeviceOptions {
  size_t memory_bytes = size_t{1} << 30;  // capacity (virtual until written)
  std::string name = "emulated";
  // Each operation Launch enqueues (a backend kernel) occupies its stream at least this long: a
  // slower device, on which tests see the host run ahead of the stream as it does of a GPU's.
  double min_op_seconds = 0;
};

class EmulatedDevice : public Device {
 public:
  // Holds `stream`'s queue: operations enqueued on it wait until ResumeStream. Tests use it to make
  // an ordering bug deterministic. InvalidArgument for a stream of another device.
  virtual absl::Status PauseStream(Stream& stream) = 0;
  virtual absl::Status ResumeStream(Stream& stream) = 0;

  // Enqueues `op` on `stream` (the backend's kernel launch). `op` runs on the stream's thread and
  // reads device memory through Translate; it must not block on other streams.
  virtual absl::Status Launch(Stream& stream, std::function<void()> op) = 0;

  // True when [ptr, ptr + bytes) lies in this device's memory (the PROT_NONE view).
  virtual bool Owns(const void* ptr, size_t bytes = 1) const = 0;
  // The read-write address of device pointer `ptr` (Owns(ptr)), for the device's own threads.
  // nullptr stays nullptr.
  virtual void* Translate(const void* ptr) const = 0;
  // Records `error` as the sticky error (the first one stays) without running anything.
  virtual void SetStickyError(absl::Status error) = 0;
  // The sticky error; OK when none.
  virtual absl::Status sticky_error() const = 0;
  // Bytes currently allocated.
  virtual size_t allocated_bytes() const = 0;
  // Operations enqueued with Launch so far, on every stream.
  virtual uint64_t launches() const = 0;
};

absl::StatusOr<std::unique_ptr<EmulatedDevice>> CreateEmulatedDevice(
    EmulatedDeviceOptions options = {});

// The emulated device `stream` belongs to; nullptr for a stream of another kind of device.
EmulatedDevice* EmulatedDeviceOf(Stream& stream);
// The live emulated device whose memory holds `ptr`; nullptr when none does.
EmulatedDevice* EmulatedDeviceOwning(const void* ptr);

}  // namespace furnace::device
