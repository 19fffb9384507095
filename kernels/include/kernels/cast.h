// Reduced-precision storage: bf16 (round to nearest even) and fp8 e4m3 with one fp32 scale per
// block of `block` elements (scale = amax / 448; e4m3 has no infinities, saturates at 448).
#pragma once
#include <cstdint>

namespace furnace::kernels::cpu {
void CastF32ToBf16(uint16_t* out, const float* inp, int64_t n);
void CastBf16ToF32(float* out, const uint16_t* inp, int64_t n);
// out[i] = inp[i] rounded to the nearest bf16 (ties to even) and widened back to fp32: the
// operands of the bf16 GEMMs (matmul_bf16.h). out may be inp.
void RoundToBf16(float* out, const float* inp, int64_t n);
// scales has ceil(n / block) entries.
void QuantizeFp8E4M3(uint8_t* out, float* scales, const float* inp, int64_t n, int block);
void DequantizeFp8E4M3(float* out, const uint8_t* inp, const float* scales, int64_t n, int block);
}  // namespace furnace::kernels::cpu
