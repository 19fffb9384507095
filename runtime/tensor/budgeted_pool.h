// BudgetedPool: one byte accountant for memory a Device hands out, against an optional budget.
// DeviceArena (device memory: the activation budget) and HostPool (page-locked host memory for
// offloads) are its two kinds. Accounting is in requested bytes (the allocator's rounding is not
// counted), so a model's declared activation bytes can be checked against peak_bytes() exactly.
//
// Ownership: the pool owns its counters and the host blocks it keeps for reuse (freed with it);
// each Buffer owns its bytes and gives them back on destruction. The pool (and its Device) must
// outlive every Buffer.
// Thread-safety: all methods may be called from any thread (one mutex): a copy thread allocates
// and frees while the compute thread runs.
// Errors: Allocate returns ResourceExhausted when the budget would be exceeded (message: requested
// bytes, tag, bytes in use, budget, overshoot), for a request over 2^62 bytes, or when the device
// itself is out of memory; it never aborts. A failed allocation does not count towards the peaks.
//
// Host memory is cached: page-locked blocks are slow to make and to give back (cudaMallocHost and
// cudaFreeHost take milliseconds per 100 MB, and the free synchronises the device), and offloads
// take one per tensor per micro-batch. A freed block is kept for reuse in its size class (eight per
// power of two, so at most an eighth of a block goes unused). The pinned total, blocks in use and
// kept, stays within max(budget, the peak of blocks in use): a request no kept block serves first
// gives back kept blocks of other classes (largest first) as far as its new block would pass that.
// Everything kept is given back with the pool, or when an allocation fails. Device memory is the
// device's to cache (CUDA's stream-ordered pool).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "runtime/device/device.h"
#include "runtime/tensor/buffer.h"

namespace furnace::tensor {

class BudgetedPool : public BufferOwner {
 public:
  enum class Memory { kDevice, kHost };

  // budget_bytes = 0: unlimited. `device` must outlive the pool.
  BudgetedPool(device::Device& device, Memory memory, uint64_t budget_bytes);
  ~BudgetedPool() override;
  BudgetedPool(const BudgetedPool&) = delete;
  BudgetedPool& operator=(const BudgetedPool&) = delete;

  // `tag` names the tensor in errors and telemetry ("layers.1.moe.expert_hidden"). A zero-byte
  // request succeeds with a null data pointer and touches neither the device nor the budget.
  absl::StatusOr<Buffer> Allocate(uint64_t bytes, std::string tag);

  uint64_t current_bytes() const;
  uint64_t peak_bytes() const;
  void ResetPeak();  // peak := current
  uint64_t budget() const;
  void set_budget(uint64_t budget_bytes);  // 0 = unlimited; does not free anything
  device::Device& device() const { return device_; }
  // Host memory: bytes of freed blocks kept for reuse (0 for device memory).
  uint64_t cached_bytes() const;

  // The size of the block that serves a request of `bytes` (host memory): 4 KiB at least, else
  // `bytes` rounded up to an eighth of its power of two.
  static uint64_t SizeClass(uint64_t bytes);

 private:
  void Return(void* data, uint64_t bytes) override;
  // Takes kept blocks, largest first, until the pinned total (in use and kept) is within `cap`
  // (0: every kept block); the caller gives them back outside the lock.
  std::vector<void*> TakeKeptLocked(uint64_t cap) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Raises the peaks to the levels now: an allocation that has its memory.
  void NotePeaksLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  const char* name() const { return memory_ == Memory::kDevice ? "device arena" : "host pool"; }

  device::Device& device_;
  const Memory memory_;
  mutable absl::Mutex mu_;
  uint64_t budget_ ABSL_GUARDED_BY(mu_);
  uint64_t current_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t peak_ ABSL_GUARDED_BY(mu_) = 0;
  // Host memory: kept blocks by size class, and their bytes; the block bytes in use (requests
  // rounded to their class) and their peak.
  std::map<uint64_t, std::vector<void*>> kept_ ABSL_GUARDED_BY(mu_);
  uint64_t kept_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t blocks_in_use_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t peak_blocks_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace furnace::tensor
