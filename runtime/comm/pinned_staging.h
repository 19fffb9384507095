// PinnedStaging: one buffer of page-locked host memory (Device::AllocateHost) that a communicator
// stages host<->device copies through, grown to the largest request seen (at least doubling, so a
// run settles after a few calls) and kept until destruction. Used by the staged communicator
// (device_staging.h) and the stream-ordered one's host arguments (stream_communicator.h).
// Ownership: owns the buffer; borrows the device, which must outlive it. Not thread-safe: the
// communicator's calling thread only. A copy that reads or writes the buffer must have completed
// before the next Reserve (which may free it).
#pragma once

#include <algorithm>
#include <cstdint>

#include "absl/status/statusor.h"
#include "runtime/base/status.h"
#include "runtime/device/device.h"

namespace furnace::comm {

class PinnedStaging {
 public:
  explicit PinnedStaging(device::Device& device) : device_(device) {}
  ~PinnedStaging() {
    if (data_ != nullptr) device_.FreeHost(data_);
  }
  PinnedStaging(const PinnedStaging&) = delete;
  PinnedStaging& operator=(const PinnedStaging&) = delete;

  // At least `bytes` of pinned host memory; the device's allocation error otherwise.
  absl::StatusOr<char*> Reserve(int64_t bytes) {
    if (bytes <= capacity_) return data_;
    const int64_t want = std::max<int64_t>(bytes, 2 * capacity_);
    if (data_ != nullptr) device_.FreeHost(data_);
    data_ = nullptr;
    capacity_ = 0;
    ASSIGN_OR_RETURN(void* p, device_.AllocateHost(static_cast<size_t>(want)));
    data_ = static_cast<char*>(p);
    capacity_ = want;
    return data_;
  }

 private:
  device::Device& device_;
  char* data_ = nullptr;
  int64_t capacity_ = 0;
};

}  // namespace furnace::comm
