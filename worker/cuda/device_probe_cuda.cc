// The CUDA half of the device probe: GPU number `slot` through the CUDA runtime. On a machine
// without a driver or without a GPU it returns Unavailable with the runtime's own words.
#include <cuda_runtime_api.h>

#include "absl/strings/str_cat.h"
#include "worker/device_probe.h"

namespace furnace::worker {

absl::StatusOr<DeviceInfo> ProbeCudaDevice(uint32_t slot) {
  int count = 0;
  if (cudaError_t e = cudaGetDeviceCount(&count); e != cudaSuccess) {
    return absl::UnavailableError(
        absl::StrCat("no usable GPU: cudaGetDeviceCount: ", cudaGetErrorString(e)));
  }
  if (static_cast<int>(slot) >= count) {
    return absl::UnavailableError(
        absl::StrCat("slot ", slot, " has no GPU: this machine has ", count, " GPU(s)"));
  }
  cudaDeviceProp prop;
  if (cudaError_t e = cudaGetDeviceProperties(&prop, static_cast<int>(slot)); e != cudaSuccess) {
    return absl::UnavailableError(
        absl::StrCat("cudaGetDeviceProperties(", slot, "): ", cudaGetErrorString(e)));
  }
  DeviceInfo info;
  info.kind = "cuda";
  info.name = prop.name;
  info.memory = prop.totalGlobalMem;
  return info;
}

}  // namespace furnace::worker
