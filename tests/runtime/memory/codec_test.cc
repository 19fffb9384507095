#include "runtime/memory/codec.h"

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace furnace::memory {
namespace {

const device::Backend& Ops() { return device::CpuBackend(); }

std::vector<float> RoundTrip(Codec codec, const std::vector<float>& x,
                             std::vector<uint32_t>* encoded = nullptr) {
  const int64_t n = static_cast<int64_t>(x.size());
  std::vector<uint32_t> buf((EncodedBytes(codec, n) + 3) / 4);  // 4-byte aligned
  Encode(Ops(), codec, x.data(), n, buf.data());
  std::vector<float> out(x.size(), std::nanf(""));
  Decode(Ops(), codec, buf.data(), n, out.data());
  if (encoded != nullptr) *encoded = buf;
  return out;
}

// Activations of several magnitudes, including exact zeros and tiny values.
std::vector<float> Activations(int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-20, 12);
  std::vector<float> x(n);
  for (int i = 0; i < n; ++i) {
    x[i] = i % 97 == 0 ? 0.0f : std::ldexp(normal(rng), exponent(rng));
  }
  return x;
}

TEST(CodecTest, EncodedSizes) {
  EXPECT_EQ(EncodedBytes(Codec::kBf16, 1000), 2000u);
  EXPECT_EQ(EncodedBytes(Codec::kFp8E4M3, 1000), 1000u + 4 * 8);  // ceil(1000 / 128) = 8 scales
  EXPECT_EQ(EncodedBytes(Codec::kFp8E4M3, 256), 256u + 4 * 2);
}

TEST(CodecTest, Bf16StaysWithinItsBoundAndKeepsRepresentableValues) {
  const std::vector<float> x = Activations(4099, 1);
  const std::vector<float> y = RoundTrip(Codec::kBf16, x);
  for (size_t i = 0; i < x.size(); ++i) {
    ASSERT_LE(std::fabs(static_cast<double>(y[i]) - x[i]), ErrorBound(Codec::kBf16, x[i], 0))
        << "x[" << i << "] = " << x[i];
  }
  // 8 significant bits: exact.
  const std::vector<float> exact = {0.0f,
                                    1.0f,
                                    -1.5f,
                                    255.0f,
                                    0.0078125f,
                                    65280.0f,
                                    std::ldexp(129.0f, -100),
                                    std::ldexp(-255.0f, 50)};
  EXPECT_EQ(RoundTrip(Codec::kBf16, exact), exact);
  // Ties round to even: 1 + 2^-8 is halfway between 1 and 1 + 2^-7.
  EXPECT_EQ(RoundTrip(Codec::kBf16, {1.0f + std::ldexp(1.0f, -8)})[0], 1.0f);
  EXPECT_EQ(RoundTrip(Codec::kBf16, {1.0f + 3 * std::ldexp(1.0f, -8)})[0],
            1.0f + std::ldexp(1.0f, -6));
}

TEST(CodecTest, Fp8StaysWithinItsBoundPerBlock) {
  const int n = 1000;  // not a multiple of the block: the last block is short
  const std::vector<float> x = Activations(n, 2);
  std::vector<uint32_t> encoded;
  const std::vector<float> y = RoundTrip(Codec::kFp8E4M3, x, &encoded);
  const float* scales = reinterpret_cast<const float*>(encoded.data());
  for (int i = 0; i < n; ++i) {
    const int b = i / kFp8Block;
    float amax = 0;
    for (int j = b * kFp8Block; j < std::min(n, (b + 1) * kFp8Block); ++j) {
      amax = std::max(amax, std::fabs(x[j]));
    }
    ASSERT_EQ(scales[b], amax / 448.0f) << "block " << b;
    ASSERT_LE(std::fabs(static_cast<double>(y[i]) - x[i]),
              ErrorBound(Codec::kFp8E4M3, x[i], scales[b]))
        << "x[" << i << "] = " << x[i] << " block scale " << scales[b];
  }
}

TEST(CodecTest, Fp8KeepsE4M3ValuesTimesAPowerOfTwo) {
  // amax 448 * 2^-3 gives scale 2^-3 exactly; every value is an e4m3 code times 2^-3.
  std::vector<float> x = {448.0f, -224.0f, 1.5f, 0.125f, -0.0f, 3.5f, 240.0f, 0.001953125f};
  for (float& v : x) v = std::ldexp(v, -3);
  const std::vector<float> y = RoundTrip(Codec::kFp8E4M3, x);
  for (size_t i = 0; i < x.size(); ++i) EXPECT_EQ(y[i], x[i]) << i;
  // An all-zero block decodes to zeros (scale 1).
  EXPECT_EQ(RoundTrip(Codec::kFp8E4M3, std::vector<float>(5, 0.0f)), std::vector<float>(5, 0.0f));
}

TEST(CodecTest, OnlyTheWhitelistMayBeCompressed) {
  for (const char* name :
       {"layers.1.moe.expert_input", "layers.1.moe.expert_hidden", "layers.12.mlp.hidden"}) {
    EXPECT_TRUE(IsCompressible(name, Codec::kBf16)) << name;
    EXPECT_TRUE(IsCompressible(name, Codec::kFp8E4M3)) << name;
  }
  for (const char* name : {"layers.3.moe.expert_pre", "layers.0.mlp.pre"}) {
    EXPECT_TRUE(IsCompressible(name, Codec::kBf16)) << name;
    EXPECT_FALSE(IsCompressible(name, Codec::kFp8E4M3)) << name;  // GELU input: bf16 only
  }
  for (const char* name :
       {"layers.1.moe.topk_indices", "layers.1.moe.gates", "layers.1.moe.router_probs",
        "layers.1.ln2.rstd", "layers.1.ln2.mean", "layers.1.ln2.out",
        "layers.1.moe.combined_output", "layers.1.moe.residual", "layers.0.attn.probs", "lnf.out",
        "moe.expert_hidden", "layers.x.moe.expert_hidden", "layers..moe.expert_hidden",
        "layers.1.moe.expert_hidden.compressed", "xlayers.1.moe.expert_hidden"}) {
    EXPECT_FALSE(IsCompressible(name, Codec::kBf16)) << name;
    EXPECT_FALSE(IsCompressible(name, Codec::kFp8E4M3)) << name;
  }
  EXPECT_TRUE(
      CheckCompressible("layers.1.moe.expert_hidden", tensor::DType::kF32, Codec::kFp8E4M3).ok());
  const absl::Status gates =
      CheckCompressible("layers.1.moe.gates", tensor::DType::kF32, Codec::kBf16);
  EXPECT_EQ(gates.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(gates.message(), ::testing::HasSubstr("'layers.1.moe.gates'"));
  EXPECT_THAT(gates.message(), ::testing::HasSubstr("bf16"));
  EXPECT_EQ(
      CheckCompressible("layers.1.moe.expert_hidden", tensor::DType::kI32, Codec::kBf16).code(),
      absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace furnace::memory
