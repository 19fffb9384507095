// DeviceMemory: one allocation of a device's memory outside every budget, for what lives as long
// as the model or the trainer: the model's flat parameter and gradient arrays, the optimizer's
// moments, the trainer's pipeline and gradient-bucket buffers. (Activations go through the
// DeviceArena and its budget instead; offloads through the HostPool.)
//
// Ownership: move-only; owns its bytes and frees them on destruction through Device::Free, which
// is stream-ordered (device.h: on the destroying thread's current stream). The device must outlive
// it. Thread-safety: a value type; the bytes are the caller's to synchronise.
// Errors: Allocate returns the device's ResourceExhausted, naming what the memory was for.
#pragma once

#include <cstdint>
#include <string_view>
#include <utility>

#include "absl/status/statusor.h"
#include "runtime/device/device.h"

namespace furnace::tensor {

class DeviceMemory {
 public:
  DeviceMemory() = default;
  // `bytes` of `device`'s memory (uninitialised; 0 bytes: empty, no allocation). `what` names it
  // in the error ("parameters").
  static absl::StatusOr<DeviceMemory> Allocate(device::Device& device, uint64_t bytes,
                                               std::string_view what);
  ~DeviceMemory() { Reset(); }
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;
  DeviceMemory(DeviceMemory&& other) noexcept { *this = std::move(other); }
  DeviceMemory& operator=(DeviceMemory&& other) noexcept {
    if (this != &other) {
      Reset();
      device_ = std::exchange(other.device_, nullptr);
      data_ = std::exchange(other.data_, nullptr);
      bytes_ = std::exchange(other.bytes_, 0);
    }
    return *this;
  }

  void Reset() {
    if (device_ != nullptr && data_ != nullptr) device_->Free(data_);
    device_ = nullptr;
    data_ = nullptr;
    bytes_ = 0;
  }
  void* data() const { return data_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }
  uint64_t bytes() const { return bytes_; }

 private:
  device::Device* device_ = nullptr;
  void* data_ = nullptr;
  uint64_t bytes_ = 0;
};

}  // namespace furnace::tensor
