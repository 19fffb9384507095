// Token + position embedding: out[b,t,:] = wte[tokens[b,t],:] + wpe[t,:].
#pragma once
#include <cstdint>

namespace furnace::kernels::cpu {
template <typename T>
void EmbeddingForward(T* out,                 // (B, T, C)  overwritten
                      const int32_t* tokens,  // (B, T)
                      const T* wte,           // (V, C)
                      const T* wpe,           // (T, C)
                      int B, int Tlen, int C);
template <typename T>
void EmbeddingBackward(T* dwte,                // (V, C)  accumulated
                       T* dwpe,                // (T, C)  accumulated
                       const T* dout,          // (B, T, C)
                       const int32_t* tokens,  // (B, T)
                       int B, int Tlen, int C);
}  // namespace furnace::kernels::cpu
