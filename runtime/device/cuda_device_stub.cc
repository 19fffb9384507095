// CreateCudaDevice and the CUDA device lookups in builds without a CUDA toolkit
// (FURNACE_ENABLE_CUDA=OFF): there is never a CUDA device.
#include "runtime/device/cuda_device.h"
#include "runtime/device/device.h"

namespace furnace::device {

absl::StatusOr<std::unique_ptr<Device>> CreateCudaDevice(int /*ordinal*/) {
  return absl::UnavailableError("built without CUDA");
}

CudaDevice* CudaDeviceOf(Stream& /*stream*/) { return nullptr; }
CudaDevice* LiveCudaDevice(int /*ordinal*/) { return nullptr; }

}  // namespace furnace::device
