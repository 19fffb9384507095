#include "runtime/tensor/budgeted_pool.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace furnace::tensor {

BudgetedPool::BudgetedPool(device::Device& device, Memory memory, uint64_t budget_bytes)
    : device_(device), memory_(memory), budget_(budget_bytes) {}

absl::StatusOr<Buffer> BudgetedPool::Allocate(uint64_t bytes, std::string tag) {
  if (bytes == 0) return Buffer(this, nullptr, 0, std::move(tag));
  {
    absl::MutexLock lock(&mu_);
    if (budget_ != 0 && current_ + bytes > budget_) {
      return absl::ResourceExhaustedError(
          absl::StrCat(name(), ": cannot allocate ", bytes, " bytes for '", tag, "': ", current_,
                       " bytes in use of a budget of ", budget_, " (", current_ + bytes - budget_,
                       " bytes over)"));
    }
    // Reserve before the device call so concurrent allocations cannot overshoot the budget.
    current_ += bytes;
    if (current_ > peak_) peak_ = current_;
  }
  absl::StatusOr<void*> data =
      memory_ == Memory::kDevice ? device_.Allocate(bytes) : device_.AllocateHost(bytes);
  if (!data.ok()) {
    absl::MutexLock lock(&mu_);
    current_ -= bytes;
    return absl::Status(data.status().code(),
                        absl::StrCat(name(), ": allocating ", bytes, " bytes for '", tag,
                                     "': ", data.status().message()));
  }
  return Buffer(this, *data, bytes, std::move(tag));
}

void BudgetedPool::Return(void* data, uint64_t bytes) {
  if (data != nullptr) {
    if (memory_ == Memory::kDevice) {
      device_.Free(data);
    } else {
      device_.FreeHost(data);
    }
  }
  absl::MutexLock lock(&mu_);
  current_ -= bytes;
}

uint64_t BudgetedPool::current_bytes() const {
  absl::MutexLock lock(&mu_);
  return current_;
}

uint64_t BudgetedPool::peak_bytes() const {
  absl::MutexLock lock(&mu_);
  return peak_;
}

void BudgetedPool::ResetPeak() {
  absl::MutexLock lock(&mu_);
  peak_ = current_;
}

uint64_t BudgetedPool::budget() const {
  absl::MutexLock lock(&mu_);
  return budget_;
}

void BudgetedPool::set_budget(uint64_t budget_bytes) {
  absl::MutexLock lock(&mu_);
  budget_ = budget_bytes;
}

}  // namespace furnace::tensor
