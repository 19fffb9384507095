// CUDA GELU, tanh approximation (see ../gelu.h). Errors: common.h.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace furnace::kernels::cuda {
void GeluForward(float* out, const float* inp, int64_t n, cudaStream_t stream);  // overwritten
void GeluBackward(float* dinp, const float* inp, const float* dout, int64_t n,
                  cudaStream_t stream);  // dinp accumulated
}  // namespace furnace::kernels::cuda
