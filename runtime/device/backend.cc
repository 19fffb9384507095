#include "runtime/device/backend.h"

#include "absl/strings/str_cat.h"

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
  if (precision == Precision::kBf16) {
    if (kind == Kind::kCpu) {
      return absl::UnimplementedError(
          "precision bf16: the CPU trains in fp32 (bf16 GEMMs run on a discrete device: cuda, or "
          "the emulated device)");
    }
    return absl::UnimplementedError(
        absl::StrCat("no bf16 backend for device kind '", KindName(kind), "' in this build"));
  }
  switch (kind) {
    case Kind::kCpu:
      return &CpuBackend();
    case Kind::kEmulated:
      return &EmulatedBackend();
    case Kind::kCuda:
      break;  // The CUDA table comes with the GPU training path.
  }
  return absl::UnimplementedError(absl::StrCat(
      "no backend for device kind '", KindName(kind),
      "': this build runs the model and the optimizer only on the CPU backend (kernels::cpu)"));
}

absl::StatusOr<const Backend*> BackendFor(const Device& device, Precision precision) {
  absl::StatusOr<const Backend*> backend = BackendFor(device.kind(), precision);
  if (!backend.ok()) {
    return absl::Status(backend.status().code(),
                        absl::StrCat("device '", device.name(), "': ", backend.status().message()));
  }
  return backend;
}

}  // namespace furnace::device
