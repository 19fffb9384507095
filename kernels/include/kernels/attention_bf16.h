// The bf16 arithmetic of attention (runtime/device/backend.h "Precision"): the contract of
// attention.h, with the operands of its four kinds of product rounded to bf16 (cast.h's
// RoundToBf16) and accumulated in fp32; the softmax, its backward and every stored result stay
// fp32. Precisely:
//   forward:  S = scale * bf16(Q) bf16(K)^T;  att = causal softmax(S) (fp32, stored as is);
//             out = bf16(att) bf16(V)
//   backward: dV += bf16(att)^T bf16(dout);  dP = bf16(dout) bf16(V)^T;
//             dS = att * (dP - rowsum(att * dP)) (fp32);
//             dQ += scale * bf16(dS) bf16(K);  dK += scale * bf16(dS)^T bf16(Q)
// The RowStats pair: attention.h's RowStats contract with these roundings (the rebuilt P is the
// forward's fp32 P, rounded where it enters a product), so it is bit-identical to the pair above.
// The CPU oracle of the CUDA bf16 table's attention (same roundings, fp32 sums in another order).
// Float only. Thread-safety: as attention.h.
#pragma once

namespace furnace::kernels::cpu {
void AttentionForwardBf16(float* out,        // (B, T, C)       overwritten
                          float* att,        // (B, NH, T, T)   overwritten (fp32 probabilities)
                          const float* qkv,  // (B, T, 3C)
                          int B, int Tlen, int C, int NH);
void AttentionBackwardBf16(float* dqkv,        // (B, T, 3C) accumulated
                           const float* dout,  // (B, T, C)
                           const float* qkv,   // (B, T, 3C)
                           const float* att,   // (B, NH, T, T)
                           int B, int Tlen, int C, int NH);
// AttentionForwardBf16's att alone, bit for bit (its scores from the bf16-rounded q and k).
void AttentionProbsBf16(float* att,        // (B, NH, T, T)   overwritten
                        const float* qkv,  // (B, T, 3C)
                        int B, int Tlen, int C, int NH);
void AttentionForwardRowStatsBf16(float* out,        // (B, T, C)       overwritten
                                  float* stats,      // (B, NH, T, 2)   overwritten
                                  const float* qkv,  // (B, T, 3C)
                                  int B, int Tlen, int C, int NH);
void AttentionBackwardRowStatsBf16(float* dqkv,         // (B, T, 3C) accumulated
                                   const float* dout,   // (B, T, C)
                                   const float* qkv,    // (B, T, 3C)
                                   const float* stats,  // (B, NH, T, 2)
                                   int B, int Tlen, int C, int NH);
}  // namespace furnace::kernels::cpu
