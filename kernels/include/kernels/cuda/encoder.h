// CUDA token + position embedding (see ../encoder.h for the contract). Errors: common.h.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace furnace::kernels::cuda {
void EmbeddingForward(float* out,             // (B, T, C)  overwritten
                      const int32_t* tokens,  // (B, T)
                      const float* wte,       // (V, C)
                      const float* wpe,       // (T, C)
                      int B, int Tlen, int C, cudaStream_t stream);
// Device bytes of EmbeddingBackward's workspace for B * T tokens (a stable sort of the positions by
// token); asks CUB, so the device must be current. 0 for no tokens or more than 2^31 - 1.
size_t EmbeddingBackwardWorkspaceBytes(int B, int Tlen);
// Deterministic, in the CPU kernel's order of additions (results equal the CPU oracle's bit for
// bit): a token's dwte row gets its dout rows added in position order, dwpe its rows in batch
// order; no atomics. `workspace`: EmbeddingBackwardWorkspaceBytes(B, Tlen) bytes, 256-aligned.
void EmbeddingBackward(float* dwte,            // (V, C)  accumulated
                       float* dwpe,            // (T, C)  accumulated
                       const float* dout,      // (B, T, C)
                       const int32_t* tokens,  // (B, T)  in [0, V)
                       int B, int Tlen, int C, void* workspace, cudaStream_t stream);
}  // namespace furnace::kernels::cuda
