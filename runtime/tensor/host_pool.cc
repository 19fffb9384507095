#include "runtime/tensor/host_pool.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace furnace::tensor {

HostPool::HostPool(device::Device& device, uint64_t budget_bytes)
    : device_(device), budget_(budget_bytes) {}

HostPool::~HostPool() = default;

absl::StatusOr<Buffer> HostPool::Allocate(uint64_t bytes, std::string tag) {
  if (bytes == 0) return Buffer(this, nullptr, 0, std::move(tag));
  {
    absl::MutexLock lock(&mu_);
    if (budget_ != 0 && current_ + bytes > budget_) {
      return absl::ResourceExhaustedError(
          absl::StrCat("host pool: cannot allocate ", bytes, " bytes for '", tag, "': ", current_,
                       " bytes in use of a budget of ", budget_, " (", current_ + bytes - budget_,
                       " bytes over)"));
    }
    // Reserve before the device call so concurrent allocations cannot overshoot the budget.
    current_ += bytes;
    if (current_ > peak_) peak_ = current_;
  }
  absl::StatusOr<void*> data = device_.AllocateHost(bytes);
  if (!data.ok()) {
    absl::MutexLock lock(&mu_);
    current_ -= bytes;
    return absl::Status(data.status().code(),
                        absl::StrCat("host pool: allocating ", bytes, " bytes for '", tag,
                                     "': ", data.status().message()));
  }
  return Buffer(this, *data, bytes, std::move(tag));
}

void HostPool::Return(void* data, uint64_t bytes) {
  if (data != nullptr) device_.FreeHost(data);
  absl::MutexLock lock(&mu_);
  current_ -= bytes;
}

uint64_t HostPool::current_bytes() const {
  absl::MutexLock lock(&mu_);
  return current_;
}

uint64_t HostPool::peak_bytes() const {
  absl::MutexLock lock(&mu_);
  return peak_;
}

void HostPool::ResetPeak() {
  absl::MutexLock lock(&mu_);
  peak_ = current_;
}

uint64_t HostPool::budget() const {
  absl::MutexLock lock(&mu_);
  return budget_;
}

}  // namespace furnace::tensor
