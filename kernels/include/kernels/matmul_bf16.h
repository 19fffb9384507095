// The bf16 arithmetic of the GEMMs (runtime/device/backend.h "Precision"): the same signatures and
// contracts as the float instances in matmul.h, but every GEMM operand is first rounded to bf16
// (round to nearest, ties to even: cast.h's RoundToBf16) and the product is accumulated in fp32
// into fp32 results, as the tensor cores compute with bf16 operands. Bias adds and bias gradients
// are not products and stay fp32 (the bias is added to, and dbias summed from, unrounded fp32).
//
// This is the CPU oracle of the CUDA bf16 table: the rounding is the same bit for bit, only the
// order of the fp32 accumulation differs. Float only (there is no double bf16).
// Thread-safety: as matmul.h (reentrant; scratch for the rounded operands is per call).
#pragma once
#include <cstdint>

namespace furnace::kernels::cpu {
// out (N, OC) = bf16(inp) (N, C) @ bf16(weight) (C, OC) [+ bias (OC)].
void MatmulForwardBf16(float* out, const float* inp, const float* weight, const float* bias, int N,
                       int C, int OC);
// dinp += bf16(dout) @ bf16(weight)^T; dweight += bf16(inp)^T @ bf16(dout); dbias += sum dout.
void MatmulBackwardBf16(float* dinp, float* dweight, float* dbias, const float* dout,
                        const float* inp, const float* weight, int N, int C, int OC);
// Per expert group, as GroupedMatmulForward / GroupedMatmulBackward (offsets: host, E + 1).
void GroupedMatmulForwardBf16(float* out, const float* inp, const float* weight, const float* bias,
                              const int64_t* offsets, int E, int C, int OC);
void GroupedMatmulBackwardBf16(float* dinp, float* dweight, float* dbias, const float* dout,
                               const float* inp, const float* weight, const int64_t* offsets, int E,
                               int C, int OC);
}  // namespace furnace::kernels::cpu
