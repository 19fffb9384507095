// Device: where tensors live and how bytes move. A CPU implementation (plain memory, synchronous
// copies: streams and events exist so callers are written once), a CUDA implementation
// (cudaMalloc, cudaMemcpyAsync on real streams, events) and an emulated discrete device (memory the
// host cannot read, asynchronous streams on worker threads: emulated_device.h) share this
// interface, so the memory planner and the model behave the same on all of them.
//
// Stream/event contract (as NCCL/DeepEP): an operation is enqueued on a stream; RecordEvent marks
// the point a later WaitEvent (on another stream) or SynchronizeEvent (host) waits for. Work that
// names no stream (the backend's ops, Free) goes to the calling thread's current stream
// (current_stream.h: StreamScope), or to default_stream() when the thread has none.
//
// Memory is stream-ordered, as CUDA's stream-ordered allocator (cudaMallocAsync / cudaFreeAsync):
//  - Allocate: the bytes may be used by work enqueued afterwards on the calling thread's current
//    stream (or the default stream); work on another stream orders itself after that point with an
//    event (a device may make them available at once, which this contract allows).
//  - Free: the bytes return to the device when that stream reaches the point of the call, so the
//    work already enqueued on it that reads or writes them runs first; work on other streams that
//    uses them must be ordered before that point by events (or have been waited for).
// So the host may free a kernel's scratch as soon as it has enqueued the kernel, as a DeviceArena
// Buffer does when it goes out of scope.
// Host code may dereference memory of the CPU device only; on a discrete device (emulated, CUDA)
// bytes move between host and device through Copy (IsDeviceMemory tells which side a pointer is).
// Thread-safety: a Device may be used from several threads; a Stream from one at a time.
// Errors: Unavailable when the device cannot be used (no driver/GPU), ResourceExhausted when raw
// allocation fails, Internal with the driver's message otherwise.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace furnace::device {

enum class Kind { kCpu, kCuda, kEmulated };

class Stream {
 public:
  virtual ~Stream() = default;
  virtual void* native() = 0;  // cudaStream_t for CUDA, nullptr for the CPU and emulated devices
};

class Event {
 public:
  virtual ~Event() = default;
};

enum class CopyKind { kHostToDevice, kDeviceToHost, kDeviceToDevice, kHostToHost };

class Device {
 public:
  virtual ~Device() = default;
  virtual Kind kind() const = 0;
  virtual std::string name() const = 0;
  virtual size_t total_memory() const = 0;  // bytes the hardware has (0 if unknown)

  // Raw device memory, stream-ordered (see above). DeviceArena sits on top and enforces the job's
  // byte budget.
  virtual absl::StatusOr<void*> Allocate(size_t bytes) = 0;
  virtual void Free(void* ptr) = 0;
  // Page-locked host memory for offloads (plain malloc on CPU). FreeHost is not stream-ordered:
  // every copy enqueued on the block must have run before it is freed (a stream synchronize or an
  // event recorded after them).
  virtual absl::StatusOr<void*> AllocateHost(size_t bytes) = 0;
  virtual void FreeHost(void* ptr) = 0;

  // True when `ptr` is memory host code may not dereference: this device's own memory on a
  // discrete device (emulated, CUDA). Always false on the CPU device, whose memory is host memory.
  virtual bool IsDeviceMemory(const void* ptr) const = 0;

  // The stream used by work that names none when the calling thread has no current stream (as
  // CUDA's default stream; on CUDA a non-blocking stream of its own, so it does not serialise with
  // every other stream). Lives as long as the device.
  virtual Stream& default_stream() = 0;
  virtual absl::StatusOr<std::unique_ptr<Stream>> CreateStream() = 0;
  virtual absl::StatusOr<std::unique_ptr<Event>> CreateEvent() = 0;
  virtual absl::Status Copy(void* dst, const void* src, size_t bytes, CopyKind kind,
                            Stream& stream) = 0;
  virtual absl::Status Memset(void* dst, int value, size_t bytes, Stream& stream) = 0;
  virtual absl::Status RecordEvent(Event& event, Stream& stream) = 0;
  virtual absl::Status WaitEvent(Stream& stream, Event& event) = 0;  // stream waits for event
  virtual absl::Status SynchronizeEvent(Event& event) = 0;           // host waits
  virtual absl::Status SynchronizeStream(Stream& stream) = 0;
};

// Whether host code may read and write this device's memory directly (the CPU device), so a caller
// may skip a staging copy; elsewhere every byte goes through Copy.
inline bool HostAddressable(const Device& device) { return device.kind() == Kind::kCpu; }

// The CPU device (always available).
std::unique_ptr<Device> CreateCpuDevice();
// GPU number `ordinal`; Unavailable in builds without CUDA or on machines without a GPU.
absl::StatusOr<std::unique_ptr<Device>> CreateCudaDevice(int ordinal);

}  // namespace furnace::device
