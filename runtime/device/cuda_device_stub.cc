// CreateCudaDevice in builds without a CUDA toolkit (FURNACE_ENABLE_CUDA=OFF).
#include "runtime/device/device.h"

namespace furnace::device {

absl::StatusOr<std::unique_ptr<Device>> CreateCudaDevice(int /*ordinal*/) {
  return absl::UnavailableError("built without CUDA");
}

}  // namespace furnace::device
