// Causal multi-head self-attention on a fused qkv (MODEL.md: q then k then v, heads contiguous,
// head width hs = C / NH, scale 1/sqrt(hs)). `att` keeps the softmax probabilities for backward.
#pragma once

namespace furnace::kernels::cpu {
template <typename T>
void AttentionForward(T* out,  // (B, T, C)       overwritten
                      T* att,  // (B, NH, T, T)   overwritten (probabilities; upper triangle 0)
                      const T* qkv,  // (B, T, 3C)
                      int B, int Tlen, int C, int NH);
template <typename T>
void AttentionBackward(T* dqkv,        // (B, T, 3C) accumulated
                       const T* dout,  // (B, T, C)
                       const T* qkv,   // (B, T, 3C)
                       const T* att,   // (B, NH, T, T)
                       int B, int Tlen, int C, int NH);
}  // namespace furnace::kernels::cpu
