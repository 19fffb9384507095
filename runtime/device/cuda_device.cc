// The CUDA device: memory from CUDA's stream-ordered allocator (cudaMallocAsync / cudaFreeAsync on
// the calling thread's current stream, else the device's default stream, from the device's default
// pool with its release threshold raised so freed bytes stay cached instead of going back to the
// driver at each synchronisation: the allocator is as cheap as a caching allocator and never
// synchronises the device, which a plain cudaFree does), page-locked host memory, real streams and
// events, and cudaMemcpyAsync/cudaMemsetAsync enqueued on the caller's stream. Every method that
// enqueues or allocates first makes this device current on the calling thread (the current device
// is per-thread state in CUDA), so one Device may be used from several threads.
//
// CUDA facts this relies on (CUDA runtime API reference, 12.x/13.0):
//  - A failing runtime call also sets the per-thread "last error" that cudaGetLastError returns
//    and cudaPeekAtLastError peeks; the kernels check launches with the latter, so every failure
//    handled here is cleared once it became a Status (cuda_status.h).
//  - cudaMemPoolTrimTo cannot release what backs allocations freed asynchronously whose
//    completion the host has not yet observed: an out-of-memory retry synchronises the device
//    first, then trims, then tries once more.
//  - cudaPointerGetAttributes on an unregistered host pointer succeeds with
//    cudaMemoryTypeUnregistered (since CUDA 11); `device` names the GPU a device pointer was
//    allocated on, which IsDeviceMemory compares with this device's ordinal.
//  - Stream-ordered allocation needs cudaDevAttrMemoryPoolsSupported (every GPU since Pascal on a
//    recent driver); CreateCudaDevice refuses a GPU without it (Unavailable).
#include "runtime/device/cuda_device.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "runtime/device/cuda_status.h"
#include "runtime/device/current_stream.h"
#include "runtime/device/device.h"

namespace furnace::device {
namespace {

#define CUDA_CALL(call) FURNACE_CUDA_RETURN_IF_ERROR(call)

class CudaDeviceImpl;

class CudaStream final : public Stream {
 public:
  CudaStream(CudaDeviceImpl* owner, int ordinal, cudaStream_t stream)
      : owner_(owner), ordinal_(ordinal), stream_(stream) {}
  ~CudaStream() override {
    // Work still queued completes first; the stream's resources go when it has (cudaStreamDestroy
    // returns at once).
    cudaSetDevice(ordinal_);
    cudaStreamDestroy(stream_);
    cudaGetLastError();
  }
  void* native() override { return stream_; }
  CudaDeviceImpl* owner() const { return owner_; }
  int ordinal() const { return ordinal_; }
  cudaStream_t stream() const { return stream_; }

 private:
  CudaDeviceImpl* owner_;
  int ordinal_;
  cudaStream_t stream_;
};

class CudaEvent final : public Event {
 public:
  CudaEvent(int ordinal, cudaEvent_t event) : ordinal_(ordinal), event_(event) {}
  ~CudaEvent() override {
    cudaSetDevice(ordinal_);
    cudaEventDestroy(event_);
    cudaGetLastError();
  }
  int ordinal() const { return ordinal_; }
  cudaEvent_t event() const { return event_; }

 private:
  int ordinal_;
  cudaEvent_t event_;
};

cudaMemcpyKind ToCuda(CopyKind kind) {
  switch (kind) {
    case CopyKind::kHostToDevice:
      return cudaMemcpyHostToDevice;
    case CopyKind::kDeviceToHost:
      return cudaMemcpyDeviceToHost;
    case CopyKind::kDeviceToDevice:
      return cudaMemcpyDeviceToDevice;
    case CopyKind::kHostToHost:
      return cudaMemcpyHostToHost;
  }
  return cudaMemcpyDefault;
}

// The live devices, oldest first (LiveCudaDevice).
absl::Mutex registry_mu(absl::kConstInit);
std::vector<CudaDeviceImpl*>& Registry() ABSL_EXCLUSIVE_LOCKS_REQUIRED(registry_mu) {
  static auto* devices = new std::vector<CudaDeviceImpl*>();
  return *devices;
}

class CudaDeviceImpl final : public CudaDevice {
 public:
  CudaDeviceImpl(int ordinal, std::string name, size_t total_memory, cudaStream_t default_stream)
      : ordinal_(ordinal),
        name_(std::move(name)),
        total_memory_(total_memory),
        default_stream_(std::make_unique<CudaStream>(this, ordinal, default_stream)) {
    absl::MutexLock lock(&registry_mu);
    Registry().push_back(this);
  }
  ~CudaDeviceImpl() override {
    absl::MutexLock lock(&registry_mu);
    auto& r = Registry();
    r.erase(std::remove(r.begin(), r.end(), this), r.end());
  }

  Kind kind() const override { return Kind::kCuda; }
  std::string name() const override { return name_; }
  size_t total_memory() const override { return total_memory_; }
  int ordinal() const override { return ordinal_; }

  absl::StatusOr<void*> Allocate(size_t bytes) override {
    CUDA_CALL(cudaSetDevice(ordinal_));
    if (bytes == 0) bytes = 1;  // a unique pointer, as the other devices give
    void* ptr = nullptr;
    const char* call = "cudaMallocAsync";
    cudaError_t err = cudaMallocAsync(&ptr, bytes, OrderingStream());
    if (err == cudaErrorMemoryAllocation) {
      // The pool caches what was freed; once every pending free has completed (a device-wide
      // synchronisation: frees on other streams count), give the cached bytes back to the driver
      // and try once more before reporting out-of-memory. The synchronisation also waits for
      // the NCCL collectives in flight on the communicators' streams; a rank's program enqueues
      // them in the same order as its peers, so each completes once the peers have enqueued
      // theirs, and one that cannot is the watchdog's to abort (which ends the wait).
      cudaGetLastError();
      cudaMemPool_t pool = nullptr;
      if (cudaDeviceSynchronize() == cudaSuccess &&
          cudaDeviceGetDefaultMemPool(&pool, ordinal_) == cudaSuccess) {
        cudaMemPoolTrimTo(pool, 0);
      }
      cudaGetLastError();
      err = cudaMallocAsync(&ptr, bytes, OrderingStream());
      call = "cudaMallocAsync (after synchronising and trimming the pool)";
    }
    if (err != cudaSuccess) {
      cudaGetLastError();  // an allocation failure is not sticky; clear it for later checks
      return CudaStatus(err, call, __FILE__, __LINE__);
    }
    return ptr;
  }
  void Free(void* ptr) override {
    if (ptr == nullptr) return;
    cudaSetDevice(ordinal_);
    if (cudaFreeAsync(ptr, OrderingStream()) != cudaSuccess) cudaGetLastError();
  }
  bool IsDeviceMemory(const void* ptr) const override {
    if (ptr == nullptr) return false;
    cudaPointerAttributes attributes{};
    if (cudaPointerGetAttributes(&attributes, ptr) != cudaSuccess) {
      cudaGetLastError();
      return false;
    }
    // Managed memory is host-addressable, and another GPU's memory is not this device's.
    return attributes.type == cudaMemoryTypeDevice && attributes.device == ordinal_;
  }
  Stream& default_stream() override { return *default_stream_; }
  absl::StatusOr<void*> AllocateHost(size_t bytes) override {
    CUDA_CALL(cudaSetDevice(ordinal_));
    void* ptr = nullptr;
    cudaError_t err = cudaMallocHost(&ptr, bytes == 0 ? 1 : bytes);
    if (err != cudaSuccess) {
      cudaGetLastError();
      return CudaStatus(err, "cudaMallocHost", __FILE__, __LINE__);
    }
    return ptr;
  }
  void FreeHost(void* ptr) override {
    if (ptr != nullptr && cudaFreeHost(ptr) != cudaSuccess) cudaGetLastError();
  }

  absl::StatusOr<std::unique_ptr<Stream>> CreateStream() override {
    CUDA_CALL(cudaSetDevice(ordinal_));
    cudaStream_t stream = nullptr;
    CUDA_CALL(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    return std::unique_ptr<Stream>(new CudaStream(this, ordinal_, stream));
  }
  absl::StatusOr<std::unique_ptr<Event>> CreateEvent() override {
    CUDA_CALL(cudaSetDevice(ordinal_));
    cudaEvent_t event = nullptr;
    CUDA_CALL(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
    return std::unique_ptr<Event>(new CudaEvent(ordinal_, event));
  }

  absl::Status Copy(void* dst, const void* src, size_t bytes, CopyKind kind,
                    Stream& stream) override {
    auto s = Native(stream);
    if (!s.ok()) return s.status();
    if (bytes == 0) return absl::OkStatus();
    CUDA_CALL(cudaSetDevice(ordinal_));
    CUDA_CALL(cudaMemcpyAsync(dst, src, bytes, ToCuda(kind), *s));
    return absl::OkStatus();
  }
  absl::Status Memset(void* dst, int value, size_t bytes, Stream& stream) override {
    auto s = Native(stream);
    if (!s.ok()) return s.status();
    if (bytes == 0) return absl::OkStatus();
    CUDA_CALL(cudaSetDevice(ordinal_));
    CUDA_CALL(cudaMemsetAsync(dst, value, bytes, *s));
    return absl::OkStatus();
  }
  absl::Status RecordEvent(Event& event, Stream& stream) override {
    auto s = Native(stream);
    if (!s.ok()) return s.status();
    auto e = Native(event);
    if (!e.ok()) return e.status();
    CUDA_CALL(cudaSetDevice(ordinal_));
    CUDA_CALL(cudaEventRecord(*e, *s));
    return absl::OkStatus();
  }
  absl::Status WaitEvent(Stream& stream, Event& event) override {
    auto s = Native(stream);
    if (!s.ok()) return s.status();
    auto e = Native(event);
    if (!e.ok()) return e.status();
    CUDA_CALL(cudaSetDevice(ordinal_));
    CUDA_CALL(cudaStreamWaitEvent(*s, *e, 0));
    return absl::OkStatus();
  }
  absl::Status SynchronizeEvent(Event& event) override {
    auto e = Native(event);
    if (!e.ok()) return e.status();
    CUDA_CALL(cudaEventSynchronize(*e));
    return sticky_error();
  }
  absl::Status SynchronizeStream(Stream& stream) override {
    auto s = Native(stream);
    if (!s.ok()) return s.status();
    CUDA_CALL(cudaStreamSynchronize(*s));
    return sticky_error();
  }

  void SetStickyError(absl::Status error) override {
    if (error.ok()) return;
    absl::MutexLock lock(&mu_);
    if (sticky_.ok()) sticky_ = std::move(error);
  }
  absl::Status sticky_error() const override {
    absl::MutexLock lock(&mu_);
    return sticky_;
  }

 private:
  // Streams and events of another device (or of the CPU device) are refused, not misused.
  absl::StatusOr<cudaStream_t> Native(Stream& stream) const {
    auto* cuda = dynamic_cast<CudaStream*>(&stream);
    if (cuda == nullptr || cuda->ordinal() != ordinal_) {
      return absl::InvalidArgumentError(
          absl::StrFormat("cuda:%d: stream belongs to another device", ordinal_));
    }
    return cuda->stream();
  }
  absl::StatusOr<cudaEvent_t> Native(Event& event) const {
    auto* cuda = dynamic_cast<CudaEvent*>(&event);
    if (cuda == nullptr || cuda->ordinal() != ordinal_) {
      return absl::InvalidArgumentError(
          absl::StrFormat("cuda:%d: event belongs to another device", ordinal_));
    }
    return cuda->event();
  }

  // Where stream-ordered allocations and frees go: the calling thread's current stream when it is
  // one of this device's, else the default stream.
  cudaStream_t OrderingStream() const {
    if (Stream* current = CurrentStream(); current != nullptr) {
      auto* cuda = dynamic_cast<CudaStream*>(current);
      if (cuda != nullptr && cuda->ordinal() == ordinal_) return cuda->stream();
    }
    return default_stream_->stream();
  }

  const int ordinal_;
  const std::string name_;
  const size_t total_memory_;
  std::unique_ptr<CudaStream> default_stream_;
  mutable absl::Mutex mu_;
  absl::Status sticky_ ABSL_GUARDED_BY(mu_);
};

#undef CUDA_CALL

}  // namespace

CudaDevice* CudaDeviceOf(Stream& stream) {
  auto* cuda = dynamic_cast<CudaStream*>(&stream);
  return cuda == nullptr ? nullptr : cuda->owner();
}

CudaDevice* LiveCudaDevice(int ordinal) {
  absl::MutexLock lock(&registry_mu);
  for (CudaDeviceImpl* d : Registry()) {
    if (d->ordinal() == ordinal) return d;
  }
  return nullptr;
}

absl::StatusOr<std::unique_ptr<Device>> CreateCudaDevice(int ordinal) {
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return CudaStatus(err, "cudaGetDeviceCount", __FILE__, __LINE__);
  }
  if (count == 0) return absl::UnavailableError("cuda: no GPU present");
  if (ordinal < 0 || ordinal >= count) {
    return absl::InvalidArgumentError(
        absl::StrFormat("cuda: ordinal %d out of range (%d GPUs)", ordinal, count));
  }
  FURNACE_CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal));
  cudaDeviceProp prop{};
  FURNACE_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, ordinal));
  int pools = 0;
  FURNACE_CUDA_RETURN_IF_ERROR(
      cudaDeviceGetAttribute(&pools, cudaDevAttrMemoryPoolsSupported, ordinal));
  if (pools == 0) {
    return absl::UnavailableError(absl::StrFormat(
        "cuda:%d (%s): no stream-ordered memory pools (cudaDevAttrMemoryPoolsSupported is 0)",
        ordinal, prop.name));
  }
  // Freed bytes stay in the default pool (a caching allocator) rather than going back to the
  // driver at every synchronisation.
  cudaMemPool_t pool = nullptr;
  FURNACE_CUDA_RETURN_IF_ERROR(cudaDeviceGetDefaultMemPool(&pool, ordinal));
  uint64_t threshold = UINT64_MAX;
  FURNACE_CUDA_RETURN_IF_ERROR(
      cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold));
  cudaStream_t stream = nullptr;
  FURNACE_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  return std::unique_ptr<Device>(new CudaDeviceImpl(
      ordinal, absl::StrFormat("cuda:%d (%s)", ordinal, prop.name), prop.totalGlobalMem, stream));
}

}  // namespace furnace::device
