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

absl::StatusOr<const Backend*> BackendFor(Kind kind) {
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

absl::StatusOr<const Backend*> BackendFor(const Device& device) {
  absl::StatusOr<const Backend*> backend = BackendFor(device.kind());
  if (!backend.ok()) {
    return absl::Status(backend.status().code(),
                        absl::StrCat("device '", device.name(), "': ", backend.status().message()));
  }
  return backend;
}

}  // namespace furnace::device
