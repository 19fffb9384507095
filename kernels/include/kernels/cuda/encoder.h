// CUDA token + position embedding (see ../encoder.h for the contract). Errors: common.h.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace furnace::kernels::cuda {
void EmbeddingForward(float* out,             // (B, T, C)  overwritten
                      const int32_t* tokens,  // (B, T)
                      const float* wte,       // (V, C)
                      const float* wpe,       // (T, C)
                      int B, int Tlen, int C, cudaStream_t stream);
// dwte through atomicAdd (repeated tokens: summation order varies run to run); dwpe deterministic.
void EmbeddingBackward(float* dwte,            // (V, C)  accumulated
                       float* dwpe,            // (T, C)  accumulated
                       const float* dout,      // (B, T, C)
                       const int32_t* tokens,  // (B, T)
                       int B, int Tlen, int C, cudaStream_t stream);
}  // namespace furnace::kernels::cuda
