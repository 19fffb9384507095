// What a worker slot offers: its device kind and memory, reported when the agent registers so the
// controller can place ranks by device kind (resources.device). A CPU slot offers the host's
// physical memory; a CUDA slot offers the memory of GPU number `slot` (CUDA parts exist only in
// builds that found a CUDA toolkit; elsewhere asking for cuda is a clear error); an emulated slot
// offers an emulated discrete device (runtime/device/emulated_device.h: the CPU kernels behind
// device memory and streams) of kEmulatedDeviceMemory bytes unless --device-memory says otherwise.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace furnace::worker {

// The emulated device's capacity when the worker names none (virtual: only written pages cost RAM).
inline constexpr uint64_t kEmulatedDeviceMemory = uint64_t{4} << 30;

struct DeviceInfo {
  std::string kind;     // cpu | cuda | emulated
  std::string name;     // e.g. "NVIDIA H200" or "cpu"
  uint64_t memory = 0;  // bytes
};

// kind: cpu | cuda | emulated | auto (cuda when a GPU for this slot is visible, else cpu).
absl::StatusOr<DeviceInfo> ProbeDevice(const std::string& kind, uint32_t slot);

// The CUDA half; defined in cuda/device_probe_cuda.cc, or as Unavailable without CUDA.
absl::StatusOr<DeviceInfo> ProbeCudaDevice(uint32_t slot);

}  // namespace furnace::worker
