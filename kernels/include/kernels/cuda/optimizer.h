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
// device memory), which one block then adds in a fixed tree, so a run gives the same bits every
// time (the gradient norm, and a resume from a checkpoint, reproduce). 1,024 blocks of 256
// threads fill an H100's or H200's 132 SMs (2,048 threads each): 256 blocks left three quarters
// of the threads that keep loads in flight idle, on a pass over every gradient each step.
inline constexpr int kSumOfSquaresPartials = 1024;
void SumOfSquares(double* out, double* partials, const float* x, int64_t n, bool accumulate,
                  cudaStream_t stream);
void Scale(float* x, float s, int64_t n, cudaStream_t stream);
}  // namespace furnace::kernels::cuda
