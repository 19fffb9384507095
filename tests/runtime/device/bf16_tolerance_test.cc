// The stated bf16 tolerances of backend.h (kBf16MatmulTolerance, kBf16AttentionTolerance): every
// output of each bf16 op, run through the emulated bf16 table on device copies, against the same op
// of the fp32 CPU table, at the shapes of a 1B-class MoE (d 2048, f 5632, head width 128), random
// inputs uniform in [-1, 1] (fresh per op), accumulated gradients starting from zero. The test
// prints the measured ||out - ref|| / ||ref|| per output (backend.h quotes them) and requires each
// to be under its bound and above 1e-4 (bf16 rounding did happen). A NaN never passes.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "runtime/device/backend.h"
#include "runtime/device/current_stream.h"
#include "runtime/device/emulated_device.h"

namespace furnace::device {
namespace {

using Buffers = std::vector<std::vector<float>>;
using Ptrs = std::vector<float*>;

std::vector<float> Uniform(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

// ||got - ref|| / ||ref|| in double; infinity when either holds a NaN or an infinity, so a NaN can
// never be within a bound.
double RelativeError(const std::vector<float>& got, const std::vector<float>& ref) {
  if (got.size() != ref.size()) return std::numeric_limits<double>::infinity();
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!std::isfinite(got[i]) || !std::isfinite(ref[i])) {
      return std::numeric_limits<double>::infinity();
    }
    const double d = static_cast<double>(got[i]) - ref[i];
    num += d * d;
    den += static_cast<double>(ref[i]) * ref[i];
  }
  return den > 0 ? std::sqrt(num / den) : (num > 0 ? std::numeric_limits<double>::infinity() : 0);
}

bool Within(double error, double bound) { return error <= bound; }  // false for NaN and infinity

class Bf16ToleranceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto dev = CreateEmulatedDevice({.memory_bytes = size_t{2} << 30});
    ASSERT_TRUE(dev.ok()) << dev.status();
    dev_ = std::move(*dev);
    auto s = dev_->CreateStream();
    ASSERT_TRUE(s.ok());
    stream_ = std::move(*s);
  }

  // Runs `op` through the fp32 CPU table on host buffers and through the emulated bf16 table on
  // device copies, and checks the buffers named in `outputs` against `bound`.
  void Measure(const std::string& what, Buffers buffers, const std::vector<int>& outputs,
               double bound, const std::function<void(const Backend&, const Ptrs&)>& op) {
    Buffers ref = buffers;
    Ptrs host;
    for (auto& b : ref) host.push_back(b.data());
    op(CpuBackend(), host);

    Ptrs dev;
    for (auto& b : buffers) {
      auto d = dev_->Allocate(b.size() * sizeof(float));
      ASSERT_TRUE(d.ok()) << d.status();
      ASSERT_TRUE(
          dev_->Copy(*d, b.data(), b.size() * sizeof(float), CopyKind::kHostToDevice, *stream_)
              .ok());
      dev.push_back(static_cast<float*>(*d));
    }
    {
      StreamScope scope(*stream_);
      op(EmulatedBf16Backend(), dev);
    }
    for (size_t i = 0; i < buffers.size(); ++i) {
      ASSERT_TRUE(dev_->Copy(buffers[i].data(), dev[i], buffers[i].size() * sizeof(float),
                             CopyKind::kDeviceToHost, *stream_)
                      .ok());
    }
    ASSERT_TRUE(dev_->SynchronizeStream(*stream_).ok());
    for (float* d : dev) dev_->Free(d);
    for (int i : outputs) {
      const double error = RelativeError(buffers[i], ref[i]);
      std::printf("bf16 tolerance: %-34s output %d: %.2e (bound %.1e)\n", what.c_str(), i, error,
                  bound);
      EXPECT_TRUE(Within(error, bound)) << what << " output " << i << ": " << error;
      EXPECT_GT(error, 1e-4) << what << " output " << i << ": bf16 rounding did not happen";
    }
  }

  std::unique_ptr<EmulatedDevice> dev_;
  std::unique_ptr<Stream> stream_;
};

constexpr int kD = 2048, kF = 5632;

TEST_F(Bf16ToleranceTest, Matmul) {
  constexpr int N = 256;
  uint32_t seed = 1;
  for (auto [C, OC] : {std::pair{kD, kF}, std::pair{kF, kD}}) {
    const std::string shape =
        std::to_string(N) + "x" + std::to_string(C) + "x" + std::to_string(OC);
    Measure("matmul_forward " + shape,
            {std::vector<float>(N * OC), Uniform(N * C, seed++), Uniform(C * OC, seed++),
             Uniform(OC, seed++)},
            {0}, kBf16MatmulTolerance, [&](const Backend& b, const Ptrs& p) {
              b.matmul_forward(p[0], p[1], p[2], p[3], N, C, OC);
            });
    Measure("matmul_backward " + shape,
            {std::vector<float>(N * C), std::vector<float>(C * OC), Uniform(N * OC, seed++),
             Uniform(N * C, seed++), Uniform(C * OC, seed++)},
            {0, 1}, kBf16MatmulTolerance, [&](const Backend& b, const Ptrs& p) {
              b.matmul_backward(p[0], p[1], nullptr, p[2], p[3], p[4], N, C, OC);
            });
  }
}

TEST_F(Bf16ToleranceTest, GroupedMatmulWithSkewedGroups) {
  constexpr int E = 3, C = kD, OC = kF;
  const std::vector<int64_t> offsets = {0, 200, 200, 320};  // 200, 0 and 120 rows
  const int S = 320;
  Measure("grouped_matmul_forward d->f",
          {std::vector<float>(S * OC), Uniform(S * C, 11), Uniform(int64_t{E} * C * OC, 12),
           Uniform(E * OC, 13)},
          {0}, kBf16MatmulTolerance, [&](const Backend& b, const Ptrs& p) {
            b.grouped_matmul_forward(p[0], p[1], p[2], p[3], offsets.data(), E, C, OC);
          });
  // The backward of the second expert GEMM (f -> d): dinp (S, f), dweight (E, f, d).
  Measure("grouped_matmul_backward f->d",
          {std::vector<float>(S * OC), std::vector<float>(int64_t{E} * OC * C), Uniform(S * C, 14),
           Uniform(S * OC, 15), Uniform(int64_t{E} * OC * C, 16)},
          {0, 1}, kBf16MatmulTolerance, [&](const Backend& b, const Ptrs& p) {
            b.grouped_matmul_backward(p[0], p[1], nullptr, p[2], p[3], p[4], offsets.data(), E, OC,
                                      C);
          });
}

TEST_F(Bf16ToleranceTest, Attention) {
  constexpr int B = 1, T = 1024, C = kD, NH = 16;  // head width 128
  const int64_t qkv = int64_t{B} * T * 3 * C, att = int64_t{B} * NH * T * T;
  Buffers fwd = {std::vector<float>(B * T * C), std::vector<float>(att), Uniform(qkv, 21)};
  Measure(
      "attention_forward T1024 C2048 NH16", fwd, {0, 1}, kBf16AttentionTolerance,
      [&](const Backend& b, const Ptrs& p) { b.attention_forward(p[0], p[1], p[2], B, T, C, NH); });
  // The backward from the fp32 probabilities of the same qkv.
  std::vector<float> out(B * T * C), probs(att);
  CpuBackend().attention_forward(out.data(), probs.data(), fwd[2].data(), B, T, C, NH);
  Measure("attention_backward T1024 C2048 NH16",
          {std::vector<float>(qkv), Uniform(B * T * C, 22), fwd[2], probs}, {0},
          kBf16AttentionTolerance, [&](const Backend& b, const Ptrs& p) {
            b.attention_backward(p[0], p[1], p[2], p[3], B, T, C, NH);
          });
}

// The check itself: a NaN, an infinity or a wrong size is never within any bound.
TEST(Bf16ToleranceCheck, NaNNeverPasses) {
  std::vector<float> ref = Uniform(100, 1), got = ref;
  EXPECT_EQ(RelativeError(got, ref), 0.0);
  EXPECT_TRUE(Within(RelativeError(got, ref), kBf16MatmulTolerance));
  got[17] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_FALSE(Within(RelativeError(got, ref), 1e300));
  got[17] = std::numeric_limits<float>::infinity();
  EXPECT_FALSE(Within(RelativeError(got, ref), 1e300));
  got = ref;
  ref[3] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_FALSE(Within(RelativeError(got, ref), 1e300));
  EXPECT_FALSE(Within(RelativeError(std::vector<float>(99), Uniform(100, 1)), 1e300));
  EXPECT_FALSE(Within(std::numeric_limits<double>::quiet_NaN(), 1e300));
}

}  // namespace
}  // namespace furnace::device
