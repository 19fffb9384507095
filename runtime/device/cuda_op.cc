// CudaOp (cuda_op.h) and the per-thread state behind it: cuBLAS handles per (device, stream) and
// pinned staging chunks per device. Both are thread_local, so no locking: a handle is used by one
// thread on one stream only (cuBLAS's rule for handles and for their workspace), and a staging
// chunk is reused only after the event recorded behind its last upload has completed.
#include "runtime/device/cuda_op.h"

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "kernels/cuda/common.h"
#include "runtime/device/cuda_status.h"
#include "runtime/device/current_stream.h"

namespace furnace::device::cuda_internal {
namespace {

// Pinned host chunks for uploads of one device, reused round-robin once idle. At most kMaxChunks;
// past that an upload waits for a busy chunk (the host is then far ahead of the device).
class Staging {
 public:
  static constexpr size_t kMinChunk = size_t{64} << 10;
  static constexpr size_t kMaxChunks = 16;

  Staging() = default;
  Staging(const Staging&) = delete;
  Staging& operator=(const Staging&) = delete;
  ~Staging() {
    for (Chunk& c : chunks_) Release(c);
  }

  // A chunk of at least `bytes` no copy is reading; the caller records `done` after its copy.
  absl::StatusOr<std::pair<void*, cudaEvent_t>> Acquire(size_t bytes) {
    for (Chunk& c : chunks_) {
      if (c.bytes >= bytes && Idle(c)) return Use(c);
    }
    if (chunks_.size() < kMaxChunks) {
      chunks_.emplace_back();
      absl::Status s = Grow(chunks_.back(), bytes);
      if (!s.ok()) {
        chunks_.pop_back();
        return s;
      }
      return Use(chunks_.back());
    }
    const size_t v = next_victim_++ % chunks_.size();
    Chunk& victim = chunks_[v];
    FURNACE_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(victim.done));
    if (victim.bytes < bytes) {
      Release(victim);
      victim = Chunk{};
      absl::Status s = Grow(victim, bytes);
      if (!s.ok()) {
        // Not left behind as a chunk with no memory and no event: a later Acquire would take it
        // as a victim and wait on a null event.
        chunks_.erase(chunks_.begin() + static_cast<std::ptrdiff_t>(v));
        return s;
      }
    }
    return Use(victim);
  }

 private:
  struct Chunk {
    void* host = nullptr;
    size_t bytes = 0;
    cudaEvent_t done = nullptr;
  };

  static bool Idle(const Chunk& c) {
    const cudaError_t err = cudaEventQuery(c.done);  // never recorded: complete
    if (err == cudaSuccess) return true;
    cudaGetLastError();  // cudaErrorNotReady (or a real error, which the next sync reports)
    return false;
  }
  static absl::Status Grow(Chunk& c, size_t bytes) {
    size_t size = kMinChunk;
    while (size < bytes) size *= 2;
    FURNACE_CUDA_RETURN_IF_ERROR(cudaMallocHost(&c.host, size));
    c.bytes = size;
    cudaError_t err = cudaEventCreateWithFlags(&c.done, cudaEventDisableTiming);
    if (err != cudaSuccess) {
      cudaGetLastError();
      cudaFreeHost(c.host);
      c = Chunk{};
      return CudaStatus(err, "cudaEventCreateWithFlags", __FILE__, __LINE__);
    }
    return absl::OkStatus();
  }
  static std::pair<void*, cudaEvent_t> Use(Chunk& c) { return {c.host, c.done}; }
  static void Release(Chunk& c) {
    if (c.done != nullptr) {
      cudaEventSynchronize(c.done);  // the copy reading the chunk has finished
      cudaEventDestroy(c.done);
    }
    if (c.host != nullptr) cudaFreeHost(c.host);
    cudaGetLastError();
  }

  std::vector<Chunk> chunks_;
  size_t next_victim_ = 0;
};

struct ThreadState {
  std::map<std::pair<int, cudaStream_t>, std::unique_ptr<kernels::cuda::CublasHandle>> handles;
  std::map<int, std::unique_ptr<Staging>> staging;
};

ThreadState& State() {
  thread_local ThreadState state;
  return state;
}

// GPUs whose context holds every kernel (kernels::cuda::PreloadKernels); the primary context lives
// as long as the process, so once per GPU. Ordinals past 63 take the mutex each time.
std::atomic<uint64_t> kernels_loaded{0};
absl::Mutex kernels_mu;

// The kernels' first recorded error on this thread as a Status (and cleared): a failed allocation
// (cuBLAS's workspace, a launch out of memory) is ResourceExhausted, as the device's own
// out-of-memory is, so the trainer and the controller treat it as one; anything else Internal.
absl::Status KernelStatus() {
  kernels::cuda::KernelError error = kernels::cuda::TakeLastKernelError();
  if (error.message.empty()) return absl::OkStatus();
  if (error.out_of_memory) return absl::ResourceExhaustedError(error.message);
  return absl::InternalError(error.message);
}

}  // namespace

absl::Status LoadKernelsOnce(int ordinal) {
  const uint64_t bit = ordinal < 64 ? uint64_t{1} << ordinal : 0;
  if (bit != 0 && (kernels_loaded.load(std::memory_order_acquire) & bit) != 0) {
    return absl::OkStatus();
  }
  absl::MutexLock lock(&kernels_mu);
  if (bit != 0 && (kernels_loaded.load(std::memory_order_acquire) & bit) != 0) {
    return absl::OkStatus();
  }
  const std::string error = kernels::cuda::PreloadKernels();
  if (!error.empty()) return absl::InternalError(error);
  if (bit != 0) kernels_loaded.fetch_or(bit, std::memory_order_release);
  return absl::OkStatus();
}

CudaOp::CudaOp(const char* op, std::initializer_list<const void*> pointers) : op_(op) {
  if (Stream* current = CurrentStream(); current != nullptr) {
    if (CudaDevice* d = CudaDeviceOf(*current); d != nullptr) {
      device_ = d;
      stream_ = static_cast<cudaStream_t>(current->native());
    }
  }
  bool any_pointer = false;
  if (device_ == nullptr) {
    for (const void* p : pointers) {
      if (p == nullptr) continue;
      any_pointer = true;
      cudaPointerAttributes attributes{};
      if (cudaPointerGetAttributes(&attributes, p) == cudaSuccess &&
          attributes.type == cudaMemoryTypeDevice) {
        device_ = LiveCudaDevice(attributes.device);
      } else {
        cudaGetLastError();
      }
      break;
    }
    if (device_ != nullptr) stream_ = static_cast<cudaStream_t>(device_->default_stream().native());
  }
  if (device_ == nullptr && !any_pointer) {
    // No stream and no memory named (an empty op with null pointers): nothing to run or report.
    ok_ = false;
    return;
  }
  if (device_ == nullptr) {
    std::fprintf(stderr,
                 "cuda backend: %s called with neither a CUDA current stream nor a live CUDA "
                 "device's memory as its first pointer\n",
                 op);
    std::abort();
  }
  int current = -1;
  if (cudaGetDevice(&current) != cudaSuccess || current != device_->ordinal()) {
    cudaGetLastError();
    if (cudaSetDevice(device_->ordinal()) != cudaSuccess) {
      cudaGetLastError();
      Fail(absl::InternalError("cudaSetDevice failed"));
    }
  }
  // Normally done already (BackendFor of the device); else before this op's first launch.
  if (ok_) {
    if (absl::Status loaded = LoadKernelsOnce(device_->ordinal()); !loaded.ok()) Fail(loaded);
  }
}

CudaOp::~CudaOp() {
  if (device_ == nullptr) return;
  for (void* p : scratch_) device_->Free(p);
  if (absl::Status error = KernelStatus(); !error.ok()) Fail(error);
}

void CudaOp::Fail(absl::Status status) {
  ok_ = false;
  if (device_ == nullptr) return;
  device_->SetStickyError(
      absl::Status(status.code(), absl::StrCat("cuda backend: ", op_, ": ", status.message())));
}

cublasHandle_t CudaOp::cublas() {
  if (!ok_) return nullptr;
  auto& slot = State().handles[{device_->ordinal(), stream_}];
  if (slot == nullptr) slot = std::make_unique<kernels::cuda::CublasHandle>();
  if (slot->get() == nullptr) {
    const absl::Status why = KernelStatus();
    slot.reset();  // try again next time
    Fail(absl::Status(why.ok() ? absl::StatusCode::kInternal : why.code(),
                      absl::StrCat("no cuBLAS handle: ", why.message())));
    return nullptr;
  }
  return slot->get();
}

void* CudaOp::Scratch(size_t bytes) {
  if (!ok_ || bytes == 0) return nullptr;
  absl::StatusOr<void*> p = device_->Allocate(bytes);
  if (!p.ok()) {
    Fail(p.status());
    return nullptr;
  }
  scratch_.push_back(*p);
  return *p;
}

void* CudaOp::Upload(const void* host, size_t bytes) {
  if (!ok_ || bytes == 0) return nullptr;
  void* dev = Scratch(bytes);
  if (dev == nullptr) return nullptr;
  auto& staging = State().staging[device_->ordinal()];
  if (staging == nullptr) staging = std::make_unique<Staging>();
  auto chunk = staging->Acquire(bytes);
  if (!chunk.ok()) {
    Fail(chunk.status());
    return nullptr;
  }
  std::memcpy(chunk->first, host, bytes);
  cudaError_t err = cudaMemcpyAsync(dev, chunk->first, bytes, cudaMemcpyHostToDevice, stream_);
  if (err == cudaSuccess) err = cudaEventRecord(chunk->second, stream_);
  if (err != cudaSuccess) {
    cudaGetLastError();
    Fail(CudaStatus(err, "upload (cudaMemcpyAsync from pinned staging)", __FILE__, __LINE__));
    return nullptr;
  }
  return dev;
}

bool CudaOp::Synchronize() {
  if (device_ == nullptr) return false;
  if (absl::Status launch = KernelStatus(); !launch.ok()) Fail(launch);
  const cudaError_t err = cudaStreamSynchronize(stream_);
  if (err != cudaSuccess) {
    cudaGetLastError();
    Fail(CudaStatus(err, "cudaStreamSynchronize", __FILE__, __LINE__));
  }
  // An earlier op's failure too (its outputs, this op's inputs, are undefined): the host scalar is
  // then NaN, as the emulated table gives, so the trainer refuses the step instead of applying it.
  return ok_ && device_->sticky_error().ok();
}

}  // namespace furnace::device::cuda_internal
