// DeviceArena: every byte of activation memory on a device goes through here, against the job's
// byte budget (DESIGN.md "Tensors and memory"). Exceeding the budget is an out-of-memory error
// with the same consequences as on a GPU, on the CPU backend too, so memory policies behave the
// same on both. Accounting is in requested bytes (the device allocator's rounding is not counted),
// so a model's declared activation bytes can be checked against peak_bytes() exactly.
//
// Ownership: the arena owns nothing but its counters; each Buffer owns its bytes and gives them
// back on destruction. The arena (and its Device) must outlive every Buffer.
// Thread-safety: all methods may be called from any thread (one mutex).
// Errors: Allocate returns ResourceExhausted when the budget would be exceeded (message: requested
// bytes, tag, bytes in use, budget) or when the device itself is out of memory; it never aborts.
#pragma once

#include <cstdint>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "runtime/device/device.h"
#include "runtime/tensor/buffer.h"

namespace furnace::tensor {

class DeviceArena final : public BufferOwner {
 public:
  // budget_bytes = 0: unlimited. `device` must outlive the arena.
  DeviceArena(device::Device& device, uint64_t budget_bytes);
  ~DeviceArena() override;
  DeviceArena(const DeviceArena&) = delete;
  DeviceArena& operator=(const DeviceArena&) = delete;

  // `tag` names the tensor in errors and telemetry ("layers.1.moe.expert_hidden"). A zero-byte
  // request succeeds with a null data pointer and touches neither the device nor the budget.
  absl::StatusOr<Buffer> Allocate(uint64_t bytes, std::string tag);

  uint64_t current_bytes() const;
  uint64_t peak_bytes() const;
  void ResetPeak();  // peak := current
  uint64_t budget() const;
  void set_budget(uint64_t budget_bytes);  // 0 = unlimited; does not free anything
  device::Device& device() const { return device_; }

 private:
  void Return(void* data, uint64_t bytes) override;

  device::Device& device_;
  mutable absl::Mutex mu_;
  uint64_t budget_ ABSL_GUARDED_BY(mu_);
  uint64_t current_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t peak_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace furnace::tensor
