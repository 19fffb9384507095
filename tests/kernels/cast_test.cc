#include "kernels/cast.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

namespace furnace::kernels::cpu {
namespace {

float FromBits(uint32_t b) {
  float f;
  std::memcpy(&f, &b, sizeof(f));
  return f;
}

uint16_t ToBf16(float f) {
  uint16_t h;
  CastF32ToBf16(&h, &f, 1);
  return h;
}

float Bf16RoundTrip(float f) {
  const uint16_t h = ToBf16(f);
  float out;
  CastBf16ToF32(&out, &h, 1);
  return out;
}

TEST(Bf16, ExactValuesArePreserved) {
  EXPECT_EQ(ToBf16(1.0f), 0x3F80);
  EXPECT_EQ(ToBf16(-2.5f), 0xC020);
  EXPECT_EQ(Bf16RoundTrip(1.0f), 1.0f);
  EXPECT_EQ(Bf16RoundTrip(-2.5f), -2.5f);
  EXPECT_EQ(Bf16RoundTrip(0.0f), 0.0f);
  EXPECT_TRUE(std::signbit(Bf16RoundTrip(-0.0f)));
  EXPECT_EQ(Bf16RoundTrip(std::numeric_limits<float>::infinity()),
            std::numeric_limits<float>::infinity());
}

TEST(Bf16, RoundsToNearestEven) {
  EXPECT_EQ(ToBf16(FromBits(0x3F808000u)), 0x3F80);  // tie, 0x3F80 is even: down
  EXPECT_EQ(ToBf16(FromBits(0x3F818000u)), 0x3F82);  // tie, 0x3F81 is odd: up
  EXPECT_EQ(ToBf16(FromBits(0x3F808001u)), 0x3F81);  // just above the tie: up
  EXPECT_EQ(ToBf16(FromBits(0x3F807FFFu)), 0x3F80);  // just below: down
  EXPECT_EQ(ToBf16(FromBits(0x7F7FFFFFu)), 0x7F80);  // FLT_MAX rounds to +inf
}

TEST(Bf16, NaNStaysNaN) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(std::isnan(Bf16RoundTrip(nan)));
  EXPECT_TRUE(std::isnan(Bf16RoundTrip(FromBits(0x7F800001u))));  // payload only in low bits
  EXPECT_TRUE(std::isnan(Bf16RoundTrip(FromBits(0xFFFFFFFFu))));  // would carry into the sign
}

TEST(Bf16, RoundTripErrorIsHalfAnUlp) {
  std::mt19937_64 rng(90);
  std::uniform_real_distribution<float> mant(-1.0f, 1.0f);
  std::uniform_int_distribution<int> expo(-100, 100);
  constexpr int n = 10000;
  std::vector<float> x(n), y(n);
  std::vector<uint16_t> h(n);
  for (float& v : x) v = std::ldexp(mant(rng), expo(rng));
  CastF32ToBf16(h.data(), x.data(), n);
  CastBf16ToF32(y.data(), h.data(), n);
  for (int i = 0; i < n; ++i) {
    EXPECT_LE(std::fabs(y[i] - x[i]), std::ldexp(std::fabs(x[i]), -8)) << x[i];
  }
}

TEST(Fp8, EveryCodeRoundTripsExactly) {
  // Block of two: 448 pins the scale to 1, the second value is each representable magnitude.
  for (int sign = 0; sign < 2; ++sign) {
    for (int c = 0; c <= 0x7E; ++c) {
      const uint8_t codes[2] = {0x7E, static_cast<uint8_t>(c | (sign << 7))};
      const float one = 1.0f;
      float v[2];
      DequantizeFp8E4M3(v, codes, &one, 2, 2);
      ASSERT_EQ(v[0], 448.0f);
      uint8_t back[2];
      float scale;
      QuantizeFp8E4M3(back, &scale, v, 2, 2);
      EXPECT_EQ(scale, 1.0f);
      if (c == 0) {
        EXPECT_EQ(back[1] & 0x7F, 0) << c;
      } else {
        EXPECT_EQ(back[1], codes[1]) << "code " << c << " value " << v[1];
      }
    }
  }
}

TEST(Fp8, KnownEncodingsAndNearestEven) {
  const float x[] = {448.0f,
                     1.0f,
                     1.0625f,
                     1.1875f,
                     std::ldexp(0.5f, -9),
                     std::ldexp(1.5f, -9),
                     -3.0f,
                     std::ldexp(1.0f, -6),
                     240.0f,
                     0.0f};
  const float expect[] = {
      448.0f, 1.0f, 1.0f, 1.25f, 0.0f, std::ldexp(2.0f, -9), -3.0f, std::ldexp(1.0f, -6),
      240.0f, 0.0f};
  constexpr int n = 10;
  uint8_t q[n];
  float scale, y[n];
  QuantizeFp8E4M3(q, &scale, x, n, n);
  ASSERT_EQ(scale, 1.0f);
  DequantizeFp8E4M3(y, q, &scale, n, n);
  for (int i = 0; i < n; ++i) EXPECT_EQ(y[i], expect[i]) << "input " << x[i];
  EXPECT_EQ(q[0], 0x7E);
  EXPECT_EQ(q[1], 0x38);  // exponent 7 (2^0), mantissa 0
  EXPECT_EQ(q[6], 0xC4);  // -1.5 * 2^1
}

// A block of tiny values has a subnormal scale (amax / 448 below FLT_MIN), whose reciprocal
// overflows: the zeros stay zeros and the values keep their ratios, no NaN.
TEST(Fp8, ABlockOfTinyValuesHasNoNaN) {
  constexpr int n = 4;
  const float x[n] = {1e-37f, 0.0f, -0.5e-37f, 0.0f};
  uint8_t q[n];
  float scale, y[n];
  QuantizeFp8E4M3(q, &scale, x, n, n);
  ASSERT_LT(scale, std::numeric_limits<float>::min());  // subnormal
  DequantizeFp8E4M3(y, q, &scale, n, n);
  for (int i = 0; i < n; ++i) {
    EXPECT_FALSE(std::isnan(y[i])) << "element " << i;
    EXPECT_NEAR(y[i], x[i], 1e-37f / 8) << "element " << i;
  }
  EXPECT_EQ(y[1], 0.0f);
  EXPECT_EQ(y[3], 0.0f);
  // Smaller still: amax / 448 would round to 0 (0 / 0); the scale is the smallest subnormal.
  const float tinier[2] = {1e-44f, 0.0f};
  QuantizeFp8E4M3(q, &scale, tinier, 2, 2);
  EXPECT_GT(scale, 0.0f);
  DequantizeFp8E4M3(y, q, &scale, 2, 2);
  EXPECT_FALSE(std::isnan(y[0]));
  EXPECT_EQ(y[1], 0.0f);
  EXPECT_NEAR(y[0], tinier[0], 1e-44f);
}

TEST(Fp8, RoundTripErrorWithinOneSixteenth) {
  std::mt19937_64 rng(91);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  constexpr int n = 1000, block = 64;
  constexpr int nblocks = (n + block - 1) / block;  // the last block is partial
  std::vector<float> x(n), y(n), scales(nblocks);
  std::vector<uint8_t> q(n);
  for (int i = 0; i < n; ++i) x[i] = dist(rng) * std::ldexp(1.0f, (i / block) - 5);
  QuantizeFp8E4M3(q.data(), scales.data(), x.data(), n, block);
  DequantizeFp8E4M3(y.data(), q.data(), scales.data(), n, block);
  for (int b = 0; b < nblocks; ++b) {
    float amax = 0;
    for (int i = b * block; i < std::min(n, (b + 1) * block); ++i)
      amax = std::max(amax, std::fabs(x[i]));
    EXPECT_FLOAT_EQ(scales[b], amax / 448.0f);
  }
  for (int i = 0; i < n; ++i) {
    const float s = scales[i / block];
    // Half an ulp of a 3-bit mantissa, or half the subnormal step (2^-9) in scaled units.
    const float bound = std::fabs(x[i]) / 16.0f + s * std::ldexp(1.0f, -10);
    EXPECT_LE(std::fabs(y[i] - x[i]), bound * (1 + 1e-6f)) << i;
  }
}

TEST(Fp8, BlockMaximumSaturatesAtTheLargestFiniteCode) {
  // Each one-element block maps its value to +-448 after scaling; float rounding in value/scale
  // may land a hair above 448, which must saturate, never become the NaN code 0x7F.
  std::mt19937_64 rng(92);
  std::uniform_real_distribution<float> mant(0.5f, 1.0f);
  std::uniform_int_distribution<int> expo(-30, 30);
  constexpr int n = 20000;
  std::vector<float> x(n), scales(n), y(n);
  std::vector<uint8_t> q(n);
  for (int i = 0; i < n; ++i) x[i] = std::ldexp(mant(rng), expo(rng)) * (i % 2 ? -1.0f : 1.0f);
  QuantizeFp8E4M3(q.data(), scales.data(), x.data(), n, 1);
  DequantizeFp8E4M3(y.data(), q.data(), scales.data(), n, 1);
  for (int i = 0; i < n; ++i) {
    ASSERT_EQ(q[i] & 0x7F, 0x7E) << x[i];
    EXPECT_NEAR(y[i], x[i], std::fabs(x[i]) * 1e-6f);
  }
}

TEST(Fp8, ZeroBlockHasUnitScaleAndNaNStaysNaN) {
  const float x[6] = {0.0f, 0.0f, 0.0f, 2.0f, std::numeric_limits<float>::quiet_NaN(), -1.0f};
  uint8_t q[6];
  float scales[2], y[6];
  QuantizeFp8E4M3(q, scales, x, 6, 3);
  EXPECT_EQ(scales[0], 1.0f);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(q[i], 0);
  EXPECT_FLOAT_EQ(scales[1], 2.0f / 448.0f);  // NaN does not poison the block's amax
  DequantizeFp8E4M3(y, q, scales, 6, 3);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(y[i], 0.0f);
  EXPECT_FLOAT_EQ(y[3], 2.0f);
  EXPECT_TRUE(std::isnan(y[4]));
  EXPECT_FLOAT_EQ(y[5], -1.0f);
}

}  // namespace
}  // namespace furnace::kernels::cpu
