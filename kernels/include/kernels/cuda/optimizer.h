// CUDA AdamW and the global-norm helpers (see ../optimizer.h). Errors: common.h.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace furnace::kernels::cuda {
// step is 1-based; hyper-parameters are host scalars (bias corrections computed on the host).
void AdamWUpdate(float* param, const float* grad, float* m, float* v, int64_t n, float lr,
                 float beta1, float beta2, float eps, float weight_decay, int64_t step,
                 cudaStream_t stream);
// The CPU function returns the sum; here it is written to `out` (ONE double of device memory),
// or added to it (accumulate), accumulated in double. Deterministic: a fixed grid of
// kSumOfSquaresPartials blocks writes its partial sums to `partials` (that many doubles of
// device memory), which one thread then adds in order, so a run gives the same bits every time
// (the gradient norm, and a resume from a checkpoint, reproduce).
inline constexpr int kSumOfSquaresPartials = 256;
void SumOfSquares(double* out, double* partials, const float* x, int64_t n, bool accumulate,
                  cudaStream_t stream);
void Scale(float* x, float s, int64_t n, cudaStream_t stream);
}  // namespace furnace::kernels::cuda
