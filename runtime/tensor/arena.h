// DeviceArena: every byte of activation memory on a device goes through here, against the job's
// byte budget (DESIGN.md "Tensors and memory"). Exceeding the budget is an out-of-memory error
// with the same consequences as on a GPU, on the CPU backend too, so memory policies behave the
// same on both. Accounting is in requested bytes (the device allocator's rounding is not counted),
// so a model's declared activation bytes can be checked against peak_bytes() exactly.
//
// Ownership, thread-safety and errors: see BudgetedPool.
#pragma once

#include <cstdint>

#include "runtime/tensor/budgeted_pool.h"

namespace furnace::tensor {

class DeviceArena final : public BudgetedPool {
 public:
  // budget_bytes = 0: unlimited. `device` must outlive the arena.
  DeviceArena(device::Device& device, uint64_t budget_bytes)
      : BudgetedPool(device, Memory::kDevice, budget_bytes) {}
};

}  // namespace furnace::tensor
