// Permutation by expert and the weighted combine, all gathers: each output row is written by one
// block, so no atomics and the results are deterministic (a token routed to k experts gathers
// its k gradient rows in choice order).
#include "common.cuh"
#include "kernels/cuda/permute.h"

namespace furnace::kernels::cuda {
namespace {

constexpr int kBlock = 256;

__global__ void PermuteForwardKernel(float* out, const float* inp, const int32_t* token, int C) {
  int64_t s = blockIdx.x;
  const float* src = inp + int64_t{token[s]} * C;
  float* dst = out + s * C;
  for (int c = threadIdx.x; c < C; c += blockDim.x) dst[c] = src[c];
}

__global__ void PermuteBackwardKernel(float* dinp, const float* dout, const int64_t* slot, int k,
                                      int C) {
  int64_t n = blockIdx.x;
  float* dst = dinp + n * C;
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    float acc = dst[c];
    for (int j = 0; j < k; ++j) {
      int64_t s = slot[n * k + j];
      if (s >= 0) acc += dout[s * C + c];
    }
    dst[c] = acc;
  }
}

__global__ void UnpermuteForwardKernel(float* out, const float* expert_out, const float* gates,
                                       const int64_t* slot, int k, int C) {
  int64_t n = blockIdx.x;
  float* dst = out + n * C;
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    float acc = 0.0f;
    for (int j = 0; j < k; ++j) {
      int64_t s = slot[n * k + j];
      if (s >= 0) acc += gates[n * k + j] * expert_out[s * C + c];
    }
    dst[c] = acc;
  }
}

__global__ void UnpermuteBackwardKernel(float* dexpert_out, float* dgates, const float* dout,
                                        const float* expert_out, const float* gates,
                                        const int64_t* slot, int k, int C) {
  __shared__ float shared[32];
  int64_t n = blockIdx.x;
  const float* dy = dout + n * C;
  for (int j = 0; j < k; ++j) {
    int64_t s = slot[n * k + j];
    if (s < 0) continue;  // dropped: no expert row, gate gradient 0
    float g = gates[n * k + j];
    const float* y = expert_out + s * C;
    float* dy_e = dexpert_out + s * C;
    float dot = 0.0f;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
      dy_e[c] += g * dy[c];
      dot += dy[c] * y[c];
    }
    dot = internal::BlockSum(dot, shared);
    if (threadIdx.x == 0) dgates[n * k + j] += dot;
  }
}

FURNACE_PRELOAD_KERNELS(PermuteForwardKernel, PermuteBackwardKernel, UnpermuteForwardKernel,
                        UnpermuteBackwardKernel);

}  // namespace

void PermuteForward(float* out, const float* inp, const DeviceDispatchPlan& plan, int C,
                    cudaStream_t stream) {
  if (plan.rows <= 0 || C <= 0) return;
  PermuteForwardKernel<<<static_cast<unsigned>(plan.rows), kBlock, 0, stream>>>(out, inp,
                                                                                plan.token, C);
  FURNACE_CHECK_LAUNCH("PermuteForward");
}

void PermuteBackward(float* dinp, const float* dout, const DeviceDispatchPlan& plan, int C,
                     cudaStream_t stream) {
  if (plan.N <= 0 || C <= 0) return;
  PermuteBackwardKernel<<<plan.N, kBlock, 0, stream>>>(dinp, dout, plan.slot, plan.k, C);
  FURNACE_CHECK_LAUNCH("PermuteBackward");
}

void UnpermuteForward(float* out, const float* expert_out, const float* gates,
                      const DeviceDispatchPlan& plan, int C, cudaStream_t stream) {
  if (plan.N <= 0 || C <= 0) return;
  UnpermuteForwardKernel<<<plan.N, kBlock, 0, stream>>>(out, expert_out, gates, plan.slot, plan.k,
                                                        C);
  FURNACE_CHECK_LAUNCH("UnpermuteForward");
}

void UnpermuteBackward(float* dexpert_out, float* dgates, const float* dout,
                       const float* expert_out, const float* gates, const DeviceDispatchPlan& plan,
                       int C, cudaStream_t stream) {
  if (plan.N <= 0 || C <= 0) return;
  UnpermuteBackwardKernel<<<plan.N, kBlock, 0, stream>>>(dexpert_out, dgates, dout, expert_out,
                                                         gates, plan.slot, plan.k, C);
  FURNACE_CHECK_LAUNCH("UnpermuteBackward");
}

}  // namespace furnace::kernels::cuda
