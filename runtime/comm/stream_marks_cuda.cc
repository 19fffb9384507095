// The CUDA marker (stream_marks.h): timing events from a pool, recorded on the stream, polled with
// cudaEventQuery and timed with cudaEventElapsedTime. Built only with CUDA.
#include <cuda_runtime.h>

#include <mutex>
#include <utility>
#include <vector>

#include "runtime/comm/stream_marks_internal.h"
#include "runtime/device/cuda_status.h"

namespace furnace::comm::internal {
namespace {

// Events of one device, reused: a mark gives its event back when it goes away (destroying or
// re-recording an event whose record is still pending is allowed; the pool never sees one that a
// live mark still polls).
class EventPool {
 public:
  explicit EventPool(int ordinal) : ordinal_(ordinal) {}
  ~EventPool() {
    cudaSetDevice(ordinal_);
    for (cudaEvent_t e : free_) cudaEventDestroy(e);
  }
  int ordinal() const { return ordinal_; }
  absl::StatusOr<cudaEvent_t> Take() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!free_.empty()) {
        cudaEvent_t e = free_.back();
        free_.pop_back();
        return e;
      }
    }
    cudaEvent_t e = nullptr;
    FURNACE_CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal_));
    FURNACE_CUDA_RETURN_IF_ERROR(cudaEventCreate(&e));  // timing enabled
    return e;
  }
  void Give(cudaEvent_t e) {
    std::lock_guard<std::mutex> lock(mu_);
    free_.push_back(e);
  }

 private:
  const int ordinal_;
  std::mutex mu_;
  std::vector<cudaEvent_t> free_;  // guarded by mu_
};

class CudaMark final : public StreamMark {
 public:
  CudaMark(std::shared_ptr<EventPool> pool, cudaEvent_t event)
      : pool_(std::move(pool)), event_(event) {}
  ~CudaMark() override { pool_->Give(event_); }

  // Polled from the watchdog's thread, whose current device is not necessarily the stream's, and
  // from the operations' thread (StreamCommunicator::WaitFor). cudaErrorNotReady is also left as
  // the thread's last error (as PyTorch's CUDAEvent::query knows), which the next kernel launch
  // check of that thread (kernels/cuda: cudaPeekAtLastError, TakeLastError) would report as its
  // own failure, making "device not ready" the device's sticky error: cleared here, as every
  // failure that became a Status (cuda_status.h).
  absl::StatusOr<bool> Passed() override {
    FURNACE_CUDA_RETURN_IF_ERROR(cudaSetDevice(pool_->ordinal()));
    const cudaError_t err = cudaEventQuery(event_);
    if (err == cudaSuccess) return true;
    cudaGetLastError();
    if (err == cudaErrorNotReady) return false;
    return device::CudaStatus(err, "cudaEventQuery", __FILE__, __LINE__);
  }
  absl::StatusOr<double> SecondsSince(const StreamMark& earlier) const override {
    const auto* e = dynamic_cast<const CudaMark*>(&earlier);
    if (e == nullptr) return absl::InvalidArgumentError("stream mark: marks of different markers");
    float ms = 0;
    FURNACE_CUDA_RETURN_IF_ERROR(cudaSetDevice(pool_->ordinal()));
    const cudaError_t err = cudaEventElapsedTime(&ms, e->event_, event_);
    if (err == cudaErrorNotReady) {  // the header's FailedPrecondition, not a device error
      cudaGetLastError();            // not left for the next launch check (Passed above)
      return absl::FailedPreconditionError("stream mark: a mark has not passed yet");
    }
    if (err != cudaSuccess) {
      cudaGetLastError();
      return device::CudaStatus(err, "cudaEventElapsedTime", __FILE__, __LINE__);
    }
    return static_cast<double>(ms) * 1e-3;
  }

 private:
  std::shared_ptr<EventPool> pool_;
  cudaEvent_t event_;
};

class CudaMarker final : public StreamMarker {
 public:
  absl::StatusOr<std::unique_ptr<StreamMark>> Mark(device::Stream& stream) override {
    auto native = static_cast<cudaStream_t>(stream.native());
    if (native == nullptr) {
      return absl::InvalidArgumentError("stream marks: not a CUDA stream");
    }
    if (pool_ == nullptr) {
      int ordinal = 0;
      FURNACE_CUDA_RETURN_IF_ERROR(cudaStreamGetDevice(native, &ordinal));
      pool_ = std::make_shared<EventPool>(ordinal);
    }
    absl::StatusOr<cudaEvent_t> event = pool_->Take();
    if (!event.ok()) return event.status();
    auto mark = std::make_unique<CudaMark>(pool_, *event);
    FURNACE_CUDA_RETURN_IF_ERROR(cudaSetDevice(pool_->ordinal()));
    FURNACE_CUDA_RETURN_IF_ERROR(cudaEventRecord(*event, native));
    return std::unique_ptr<StreamMark>(std::move(mark));
  }

 private:
  std::shared_ptr<EventPool> pool_;  // made at the first mark, on the stream's device
};

}  // namespace

absl::StatusOr<std::unique_ptr<StreamMarker>> CreateCudaStreamMarker(device::Device& device) {
  if (device.kind() != device::Kind::kCuda) {
    return absl::InvalidArgumentError("stream marks: not a CUDA device");
  }
  return std::unique_ptr<StreamMarker>(new CudaMarker());
}

}  // namespace furnace::comm::internal
