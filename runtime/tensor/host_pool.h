// HostPool: page-locked host memory (Device::AllocateHost) for offloaded tensors, with its own byte
// accounting and optional budget, apart from the device arena's. A copy thread allocates and
// frees here while the compute thread runs, so everything is behind one mutex.
//
// Ownership: as DeviceArena; each Buffer owns its bytes, the pool (and its Device) must outlive
// them. Errors: ResourceExhausted past the budget (message: requested bytes, tag, in use, budget)
// or when the host allocation fails.
#pragma once

#include <cstdint>

#include "runtime/tensor/budgeted_pool.h"

namespace furnace::tensor {

class HostPool final : public BudgetedPool {
 public:
  // budget_bytes = 0: unlimited. `device` must outlive the pool.
  HostPool(device::Device& device, uint64_t budget_bytes)
      : BudgetedPool(device, Memory::kHost, budget_bytes) {}
};

}  // namespace furnace::tensor
