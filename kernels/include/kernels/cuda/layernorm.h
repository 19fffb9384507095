// CUDA LayerNorm (see ../layernorm.h for the contract). Errors: common.h. Deterministic.
#pragma once
#include <cuda_runtime.h>

namespace furnace::kernels::cuda {
void LayerNormForward(float* out,           // (N, C)  overwritten
                      float* mean,          // (N)     overwritten
                      float* rstd,          // (N)     overwritten
                      const float* inp,     // (N, C)
                      const float* weight,  // (C)
                      const float* bias,    // (C)
                      int N, int C, float eps, cudaStream_t stream);
void LayerNormBackward(float* dinp,          // (N, C) accumulated
                       float* dweight,       // (C)    accumulated
                       float* dbias,         // (C)    accumulated
                       const float* dout,    // (N, C)
                       const float* inp,     // (N, C)
                       const float* weight,  // (C)
                       const float* mean,    // (N)
                       const float* rstd,    // (N)
                       int N, int C, cudaStream_t stream);
}  // namespace furnace::kernels::cuda
