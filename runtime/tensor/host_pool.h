// HostPool: page-locked host memory (Device::AllocateHost) for offloaded tensors, with its own byte
// accounting and optional budget, apart from the device arena's. A copy thread allocates and
// frees here while the compute thread runs, so everything is behind one mutex.
//
// Ownership: as DeviceArena; each Buffer owns its bytes, the pool (and its Device) must outlive
// them. Errors: ResourceExhausted past the budget (message: requested bytes, tag, in use, budget)
// or when the host allocation fails.
#pragma once

#include <cstdint>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "runtime/device/device.h"
#include "runtime/tensor/buffer.h"

namespace furnace::tensor {

class HostPool final : public BufferOwner {
 public:
  // budget_bytes = 0: unlimited.
  HostPool(device::Device& device, uint64_t budget_bytes);
  ~HostPool() override;
  HostPool(const HostPool&) = delete;
  HostPool& operator=(const HostPool&) = delete;

  absl::StatusOr<Buffer> Allocate(uint64_t bytes, std::string tag);

  uint64_t current_bytes() const;
  uint64_t peak_bytes() const;
  void ResetPeak();
  uint64_t budget() const;

 private:
  void Return(void* data, uint64_t bytes) override;

  device::Device& device_;
  mutable absl::Mutex mu_;
  uint64_t budget_ ABSL_GUARDED_BY(mu_);
  uint64_t current_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t peak_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace furnace::tensor
