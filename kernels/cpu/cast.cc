// bf16 and fp8 e4m3 (the OCP "e4m3fn" variant: bias 7, no infinities, S.1111.111 is NaN, largest
// finite 448). Both round to nearest, ties to even. fp8 is stored with one fp32 scale per block,
// scale = amax / 448 so the block's largest magnitude maps to 448; an all-zero block gets scale 1.
// Values that round above 448 saturate to +-448 (never to the NaN code).
#include "kernels/cast.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

namespace furnace::kernels::cpu {
namespace {
constexpr float kFp8Max = 448.0f;
constexpr uint8_t kFp8MaxCode = 0x7E;  // exponent 15, mantissa 110: 448
constexpr uint8_t kFp8NaN = 0x7F;

uint16_t F32ToBf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  if ((bits & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((bits >> 16) | 0x0040u);
  const uint32_t rounding = 0x7FFFu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding) >> 16);
}

float Bf16ToF32(uint16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

// x is already divided by the block scale. Exact arithmetic except the final rounding: frexp and
// scaling by powers of two are exact, so (mantissa - 1) * 8 is exact before nearbyint (which
// rounds half to even in the default rounding mode).
uint8_t EncodeE4M3(float x) {
  if (std::isnan(x)) return kFp8NaN;
  const uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
  const float a = std::fabs(x);
  if (a >= kFp8Max) return sign | kFp8MaxCode;
  int e;
  const float frac = std::frexp(a, &e);  // a = frac * 2^e, frac in [0.5, 1)
  const int exp = e - 1;                 // a = (2 * frac) * 2^exp
  uint32_t code;
  if (a == 0.0f || exp < -6) {
    // Subnormal: a = m * 2^-9, m in [0, 8); m == 8 is the smallest normal, code 0x08, so the
    // integer m is the code either way.
    code = static_cast<uint32_t>(std::nearbyint(std::ldexp(a, 9)));
  } else {
    const float mant = std::nearbyint((2.0f * frac - 1.0f) * 8.0f);              // 0..8
    code = (static_cast<uint32_t>(exp + 7) << 3) + static_cast<uint32_t>(mant);  // 8 carries
  }
  return sign | static_cast<uint8_t>(std::min<uint32_t>(code, kFp8MaxCode));
}

float DecodeE4M3(uint8_t c) {
  const float sign = (c & 0x80) ? -1.0f : 1.0f;
  const int exp = (c >> 3) & 0xF;
  const int mant = c & 0x7;
  if (exp == 0xF && mant == 0x7) return std::nanf("");
  if (exp == 0) return sign * std::ldexp(static_cast<float>(mant), -9);
  return sign * std::ldexp(1.0f + mant / 8.0f, exp - 7);
}
}  // namespace

void CastF32ToBf16(uint16_t* out, const float* inp, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = F32ToBf16(inp[i]);
}

void CastBf16ToF32(float* out, const uint16_t* inp, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = Bf16ToF32(inp[i]);
}

void RoundToBf16(float* out, const float* inp, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = Bf16ToF32(F32ToBf16(inp[i]));
}

void QuantizeFp8E4M3(uint8_t* out, float* scales, const float* inp, int64_t n, int block) {
  for (int64_t b0 = 0, blk = 0; b0 < n; b0 += block, ++blk) {
    const int64_t b1 = std::min<int64_t>(n, b0 + block);
    float amax = 0.0f;
    for (int64_t i = b0; i < b1; ++i) amax = std::max(amax, std::fabs(inp[i]));
    // At least the smallest subnormal: below amax ~ 3e-43, amax / 448 rounds to 0 (0 / 0 = NaN).
    const float scale =
        amax > 0.0f ? std::max(amax / kFp8Max, std::numeric_limits<float>::denorm_min()) : 1.0f;
    scales[blk] = scale;
    // Divided, not multiplied by 1 / scale: for a block of tiny values (amax below ~1.5e-36) the
    // scale is subnormal and its reciprocal overflows, which would make 0 * inf = NaN.
    for (int64_t i = b0; i < b1; ++i) out[i] = EncodeE4M3(inp[i] / scale);
  }
}

void DequantizeFp8E4M3(float* out, const uint8_t* inp, const float* scales, int64_t n, int block) {
  for (int64_t i = 0; i < n; ++i) out[i] = DecodeE4M3(inp[i]) * scales[i / block];
}

}  // namespace furnace::kernels::cpu
