#include "runtime/device/backend.h"

#include "absl/strings/str_cat.h"
#include "runtime/base/status.h"
#if FURNACE_HAVE_CUDA
#include "runtime/device/cuda_backend.h"
#include "runtime/device/cuda_device.h"
#endif

namespace furnace::device {

const char* KindName(Kind kind) {
  switch (kind) {
    case Kind::kCpu:
      return "cpu";
    case Kind::kCuda:
      return "cuda";
    case Kind::kEmulated:
      return "emulated";
  }
  return "unknown";
}

const char* PrecisionName(Precision precision) {
  switch (precision) {
    case Precision::kFp32:
      return "fp32";
    case Precision::kBf16:
      return "bf16";
  }
  return "unknown";
}

absl::StatusOr<const Backend*> BackendFor(Kind kind, Precision precision) {
  const bool bf16 = precision == Precision::kBf16;
  switch (kind) {
    case Kind::kCpu:
      if (bf16) {
        return absl::InvalidArgumentError(
            "precision bf16: the CPU trains in fp32 (bf16 GEMMs run on a discrete device: cuda, "
            "or the emulated device)");
      }
      return &CpuBackend();
    case Kind::kEmulated:
      return bf16 ? &EmulatedBf16Backend() : &EmulatedBackend();
    case Kind::kCuda:
#if FURNACE_HAVE_CUDA
      return bf16 ? &CudaBf16Backend() : &CudaBackend();
#else
      break;
#endif
  }
  return absl::FailedPreconditionError(
      absl::StrCat("no backend for device kind '", KindName(kind), "' at precision ",
                   PrecisionName(precision), ": this build has no CUDA (FURNACE_ENABLE_CUDA=OFF)"));
}

absl::StatusOr<const Backend*> BackendFor(const Device& device, Precision precision) {
  absl::StatusOr<const Backend*> backend = BackendFor(device.kind(), precision);
  if (!backend.ok()) {
    return absl::Status(backend.status().code(),
                        absl::StrCat("device '", device.name(), "': ", backend.status().message()));
  }
#if FURNACE_HAVE_CUDA
  // Before the rank's first collective can be in flight (cuda_backend.h).
  if (dynamic_cast<const CudaDevice*>(&device) != nullptr) RETURN_IF_ERROR(LoadCudaKernels(device));
#endif
  return backend;
}

}  // namespace furnace::device
