// CUDA token permutation by expert and the weighted combine (see ../permute.h). The plan is made
// on the host (cpu::MakeDispatchPlan) and its slot/token/offsets arrays copied to the device;
// DeviceDispatchPlan names those copies. Every op here is a gather (no atomics): deterministic.
// Errors: common.h.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace furnace::kernels::cuda {

struct DeviceDispatchPlan {
  int N = 0, E = 0, k = 0;
  int64_t rows = 0;                  // S = offsets[E] (host copy of the value)
  const int64_t* slot = nullptr;     // (N * k) device: permuted row or -1 when dropped
  const int32_t* token = nullptr;    // (S) device: source token of each permuted row
  const int64_t* offsets = nullptr;  // (E + 1) device (unused by these ops; kept for callers)
};

// out (S, C) overwritten with rows of inp (N, C).
void PermuteForward(float* out, const float* inp, const DeviceDispatchPlan& plan, int C,
                    cudaStream_t stream);
// dinp (N, C) accumulated from dout (S, C).
void PermuteBackward(float* dinp, const float* dout, const DeviceDispatchPlan& plan, int C,
                     cudaStream_t stream);
// out (N, C) overwritten: out[n] = sum_j gates[n,j] * expert_out[slot[n,j]] over kept choices.
void UnpermuteForward(float* out, const float* expert_out, const float* gates,
                      const DeviceDispatchPlan& plan, int C, cudaStream_t stream);
// dexpert_out (S, C) accumulated; dgates (N, k) accumulated (0 for dropped choices).
void UnpermuteBackward(float* dexpert_out, float* dgates, const float* dout,
                       const float* expert_out, const float* gates, const DeviceDispatchPlan& plan,
                       int C, cudaStream_t stream);
}  // namespace furnace::kernels::cuda
