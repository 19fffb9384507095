// Causal multi-head self-attention on a fused qkv (MODEL.md: q then k then v, heads contiguous,
// head width hs = C / NH, scale 1/sqrt(hs)). `att` keeps the softmax probabilities for backward.
//
// The RowStats pair (model.attention_probs: recomputed) keeps, instead of the (T, T)
// probabilities, two numbers per query row: its largest score m and the reciprocal r of its
// exponential sum, so P[i][j] = exp(S[i][j] - m_i) * r_i for j <= i. Backward rebuilds each block
// of P from Q, K and those (FlashAttention's trade: (B, NH, T, 2) saved instead of (B, NH, T, T),
// for one more S = Q K^T product in backward). The CPU kernels rebuild P with the very operations
// the forward ran, so the RowStats pair's out and dqkv are bit-identical to the pair above.
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

// The probabilities alone, as AttentionForward writes them (the same operations, bit for bit),
// without the output: how the adaptive memory planner rebuilds a dropped `att` in backward.
template <typename T>
void AttentionProbs(T* att,        // (B, NH, T, T)   overwritten (probabilities; upper triangle 0)
                    const T* qkv,  // (B, T, 3C)
                    int B, int Tlen, int C, int NH);

template <typename T>
void AttentionForwardRowStats(T* out,        // (B, T, C)        overwritten
                              T* stats,      // (B, NH, T, 2)    overwritten: (m, r) per row
                              const T* qkv,  // (B, T, 3C)
                              int B, int Tlen, int C, int NH);
template <typename T>
void AttentionBackwardRowStats(T* dqkv,         // (B, T, 3C) accumulated
                               const T* dout,   // (B, T, C)
                               const T* qkv,    // (B, T, 3C)
                               const T* stats,  // (B, NH, T, 2)
                               int B, int Tlen, int C, int NH);
}  // namespace furnace::kernels::cpu
