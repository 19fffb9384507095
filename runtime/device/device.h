// Device: where tensors live and how bytes move. A CPU implementation (plain memory, synchronous
// copies: streams and events exist so callers are written once), a CUDA implementation
// (cudaMalloc, cudaMemcpyAsync on real streams, events) and an emulated discrete device (memory the
// host cannot read, asynchronous streams on worker threads: emulated_device.h) share this
// interface, so the memory planner and the model behave the same on all of them.
//
// Stream/event contract (as NCCL/DeepEP): an operation is enqueued on a stream; RecordEvent marks
// the point a later WaitEvent (on another stream) or SynchronizeEvent (host) waits for.
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

  // Raw device memory. DeviceArena sits on top and enforces the job's byte budget.
  virtual absl::StatusOr<void*> Allocate(size_t bytes) = 0;
  virtual void Free(void* ptr) = 0;
  // Page-locked host memory for offloads (plain malloc on CPU).
  virtual absl::StatusOr<void*> AllocateHost(size_t bytes) = 0;
  virtual void FreeHost(void* ptr) = 0;

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

// The CPU device (always available).
std::unique_ptr<Device> CreateCpuDevice();
// GPU number `ordinal`; Unavailable in builds without CUDA or on machines without a GPU.
absl::StatusOr<std::unique_ptr<Device>> CreateCudaDevice(int ordinal);

}  // namespace furnace::device
