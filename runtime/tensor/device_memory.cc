#include "runtime/tensor/device_memory.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace furnace::tensor {

absl::StatusOr<DeviceMemory> DeviceMemory::Allocate(device::Device& device, uint64_t bytes,
                                                    std::string_view what) {
  DeviceMemory m;
  if (bytes == 0) return m;
  absl::StatusOr<void*> data = device.Allocate(bytes);
  if (!data.ok()) {
    return absl::Status(
        data.status().code(),
        absl::StrCat("device '", device.name(), "': allocating ", bytes, " bytes for the ",
                     std::string(what), ": ", data.status().message()));
  }
  m.device_ = &device;
  m.data_ = *data;
  m.bytes_ = bytes;
  return m;
}

}  // namespace furnace::tensor
