#include "runtime/tensor/arena.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace furnace::tensor {

DeviceArena::DeviceArena(device::Device& device, uint64_t budget_bytes)
    : device_(device), budget_(budget_bytes) {}

DeviceArena::~DeviceArena() = default;

absl::StatusOr<Buffer> DeviceArena::Allocate(uint64_t bytes, std::string tag) {
  if (bytes == 0) return Buffer(this, nullptr, 0, std::move(tag));
  {
    absl::MutexLock lock(&mu_);
    if (budget_ != 0 && current_ + bytes > budget_) {
      return absl::ResourceExhaustedError(
          absl::StrCat("device arena: cannot allocate ", bytes, " bytes for '", tag,
                       "': ", current_, " bytes in use of a budget of ", budget_, " (",
                       current_ + bytes - budget_, " bytes over)"));
    }
    // Reserve before the device call so concurrent allocations cannot overshoot the budget.
    current_ += bytes;
    if (current_ > peak_) peak_ = current_;
  }
  absl::StatusOr<void*> data = device_.Allocate(bytes);
  if (!data.ok()) {
    absl::MutexLock lock(&mu_);
    current_ -= bytes;
    return absl::Status(data.status().code(),
                        absl::StrCat("device arena: allocating ", bytes, " bytes for '", tag,
                                     "': ", data.status().message()));
  }
  return Buffer(this, *data, bytes, std::move(tag));
}

void DeviceArena::Return(void* data, uint64_t bytes) {
  if (data != nullptr) device_.Free(data);
  absl::MutexLock lock(&mu_);
  current_ -= bytes;
}

uint64_t DeviceArena::current_bytes() const {
  absl::MutexLock lock(&mu_);
  return current_;
}

uint64_t DeviceArena::peak_bytes() const {
  absl::MutexLock lock(&mu_);
  return peak_;
}

void DeviceArena::ResetPeak() {
  absl::MutexLock lock(&mu_);
  peak_ = current_;
}

uint64_t DeviceArena::budget() const {
  absl::MutexLock lock(&mu_);
  return budget_;
}

void DeviceArena::set_budget(uint64_t budget_bytes) {
  absl::MutexLock lock(&mu_);
  budget_ = budget_bytes;
}

}  // namespace furnace::tensor
