// Reduced-precision storage of stashed activations: bf16 (round to nearest even) or fp8 e4m3 with
// one fp32 scale per block of kFp8Block elements (scale = block amax / 448), through the backend's
// cast kernels (kernels/include/kernels/cast.h). Decode restores fp32; the values are the rounded
// ones, so a compressed tensor is NOT bit-exact and only the tags below may be compressed.
//
// Tolerance (per element x of a tensor, x' = Decode(Encode(x)); ErrorBound computes it):
//   bf16: |x' - x| <= 2^-8 |x| (8 significant bits, half an ulp), + 2^-133 for fp32 subnormals;
//   fp8:  |x' - x| <= (2^-4 |x| + 2^-10 s) (1 + 2^-20), s = the block's scale: 4 significant
//         bits for values that stay normal in e4m3, and half the subnormal step 2^-9 (scaled by s)
//         for those below 2^-6 s; the factor covers the fp32 roundings of x / s and of code * s.
// Representable values round-trip exactly: any bf16 value through bf16; through fp8, any block
// whose values are e4m3 codes times a power of two that maps its amax to 448 exactly.
//
// The whitelist (IsCompressible; producer "layers.<l>.<suffix>"), and why each is safe: each is
// read in backward only by a weight-gradient GEMM (a linear function of it, so an element error of
// e moves the gradient by at most e times the matching upstream gradient, nothing divides by it)
// or by the GELU derivative (Lipschitz: |gelu''| < 0.6 everywhere, so an input error e moves
// gelu' by less than 0.6 e):
//   moe.expert_input  (R, C) : read only by dW1 = xin^T dpre.                 bf16, fp8
//   moe.expert_hidden (R, f) : GELU output, read only by dW2 = h^T deo.        bf16, fp8
//   moe.expert_pre    (R, f) : GELU input, read only by gelu'(pre).            bf16
//   mlp.hidden        (N, F) : the dense GELU output, read only by dW2.         bf16, fp8
//   mlp.pre           (N, F) : the dense GELU input, read only by gelu'(pre).  bf16
// (fp8 is kept off the GELU inputs: 2^-4 relative error moves the derivative by up to 4% of |x|.)
// Never on the list: top-k indices (integers), gates and router probabilities (softmax / top-k
// backward multiply and normalise by them, and they steer routing), LayerNorm mean and rstd (rstd
// scales a whole row's gradient), LN outputs and residual streams (LayerNorm backward subtracts
// the mean from them: cancellation amplifies a relative error), attention probabilities and qkv
// (the softmax backward and QK^T compound the error), the expert output (it feeds the gate
// gradient, hence routing).
//
// Thread-safety: pure functions. Errors: CheckCompressible says FailedPrecondition naming the
// tensor, its dtype and the codec when the pair is not allowed.
#pragma once

#include <cstdint>
#include <string_view>

#include "absl/status/status.h"
#include "runtime/device/backend.h"
#include "runtime/tensor/dtype.h"

namespace furnace::memory {

enum class Codec { kBf16, kFp8E4M3 };
const char* CodecName(Codec codec);

inline constexpr int kFp8Block = 128;

// Whether `producer` ("layers.1.moe.expert_hidden") may be stored in `codec` (whitelist above).
bool IsCompressible(std::string_view producer, Codec codec);
absl::Status CheckCompressible(std::string_view producer, tensor::DType dtype, Codec codec);

// Bytes of the encoding of n floats (fp8: the block scales first, then one byte per element).
uint64_t EncodedBytes(Codec codec, int64_t n);
// out: EncodedBytes(codec, n) bytes, 4-byte aligned.
void Encode(const device::Backend& ops, Codec codec, const float* in, int64_t n, void* out);
void Decode(const device::Backend& ops, Codec codec, const void* in, int64_t n, float* out);

// The stated bound on |x' - x| for an element x whose fp8 block has scale `fp8_scale`
// (block amax / 448; ignored for bf16).
double ErrorBound(Codec codec, float x, float fp8_scale);

}  // namespace furnace::memory
