#include "runtime/tensor/budgeted_pool.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace furnace::tensor {

BudgetedPool::BudgetedPool(device::Device& device, Memory memory, uint64_t budget_bytes)
    : device_(device), memory_(memory), budget_(budget_bytes) {}

BudgetedPool::~BudgetedPool() {
  absl::MutexLock lock(&mu_);
  for (auto& [size, blocks] : kept_) {
    for (void* p : blocks) device_.FreeHost(p);
  }
}

uint64_t BudgetedPool::SizeClass(uint64_t bytes) {
  constexpr uint64_t kMin = 4096;
  if (bytes <= kMin) return kMin;
  uint64_t power = kMin;
  while (power * 2 <= bytes) power *= 2;
  const uint64_t step = power / 8;
  return (bytes + step - 1) / step * step;
}

absl::StatusOr<Buffer> BudgetedPool::Allocate(uint64_t bytes, std::string tag) {
  if (bytes == 0) return Buffer(this, nullptr, 0, std::move(tag));
  // Far past any memory (and past where the size classes' arithmetic stays in 64 bits).
  constexpr uint64_t kMaxBytes = uint64_t{1} << 62;
  if (bytes > kMaxBytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat(name(), ": cannot allocate ", bytes, " bytes for '", tag, "'"));
  }
  const bool host = memory_ == Memory::kHost;
  const uint64_t block = host ? SizeClass(bytes) : bytes;
  std::vector<void*> evicted;  // kept blocks to give back before a new one is made
  // The peaks are raised only once the allocation has its memory, to the levels then (a failed
  // one does not count towards them, nor so towards the pinned cap; a ResetPeak meanwhile holds).
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
    if (host) {
      blocks_in_use_ += block;
      auto kept = kept_.find(block);
      if (kept != kept_.end() && !kept->second.empty()) {
        void* data = kept->second.back();
        kept->second.pop_back();
        kept_bytes_ -= block;
        NotePeaksLocked();
        return Buffer(this, data, bytes, std::move(tag));
      }
      // A new block: kept ones of other classes go first, as far as the pinned total would pass
      // the cap (the blocks in use, this one included, count towards it); classes that stopped
      // recurring do not stay forever.
      evicted = TakeKeptLocked(std::max({budget_, peak_blocks_, blocks_in_use_}));
    }
  }
  for (void* p : evicted) device_.FreeHost(p);
  absl::StatusOr<void*> data = host ? device_.AllocateHost(block) : device_.Allocate(bytes);
  if (!data.ok() && host) {
    // Kept blocks of other sizes may be what the host lacks: give them all back, try once more.
    {
      absl::MutexLock lock(&mu_);
      evicted = TakeKeptLocked(0);
    }
    if (!evicted.empty()) {
      for (void* p : evicted) device_.FreeHost(p);
      data = device_.AllocateHost(block);
    }
  }
  absl::MutexLock lock(&mu_);
  if (!data.ok()) {
    current_ -= bytes;
    if (host) blocks_in_use_ -= block;
    return absl::Status(data.status().code(),
                        absl::StrCat(name(), ": allocating ", bytes, " bytes for '", tag,
                                     "': ", data.status().message()));
  }
  NotePeaksLocked();
  return Buffer(this, *data, bytes, std::move(tag));
}

void BudgetedPool::NotePeaksLocked() {
  peak_ = std::max(peak_, current_);
  peak_blocks_ = std::max(peak_blocks_, blocks_in_use_);  // 0 for device memory
}

void BudgetedPool::Return(void* data, uint64_t bytes) {
  if (memory_ == Memory::kDevice) {
    if (data != nullptr) device_.Free(data);
    absl::MutexLock lock(&mu_);
    current_ -= bytes;
    return;
  }
  const uint64_t block = SizeClass(bytes);
  {
    absl::MutexLock lock(&mu_);
    current_ -= bytes;
    if (data == nullptr) return;
    blocks_in_use_ -= block;
    if (blocks_in_use_ + kept_bytes_ + block <= std::max(budget_, peak_blocks_)) {
      kept_[block].push_back(data);
      kept_bytes_ += block;
      return;
    }
  }
  device_.FreeHost(data);
}

std::vector<void*> BudgetedPool::TakeKeptLocked(uint64_t cap) {
  std::vector<void*> taken;
  for (auto it = kept_.rbegin(); it != kept_.rend() && blocks_in_use_ + kept_bytes_ > cap; ++it) {
    while (!it->second.empty() && blocks_in_use_ + kept_bytes_ > cap) {
      taken.push_back(it->second.back());
      it->second.pop_back();
      kept_bytes_ -= it->first;
    }
  }
  return taken;
}

uint64_t BudgetedPool::cached_bytes() const {
  absl::MutexLock lock(&mu_);
  return kept_bytes_;
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
