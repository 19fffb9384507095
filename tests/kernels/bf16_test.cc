// The CPU oracle of the bf16 tables (matmul_bf16.h, attention_bf16.h, cast.h's RoundToBf16):
// against a double-precision reference that applies the same roundings (agreement to fp32
// accumulation, ~1e-6), and against the exact double result on the unrounded inputs (a bf16-sized
// difference: it must be there, or nothing was rounded, and small). Outputs that are overwritten
// are poisoned with NaN first; accumulated ones start random.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "kernels/attention.h"
#include "kernels/attention_bf16.h"
#include "kernels/cast.h"
#include "kernels/matmul.h"
#include "kernels/matmul_bf16.h"

namespace furnace::kernels::cpu {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

std::vector<float> Random(size_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

double R(double x) {  // x as fp32, rounded to bf16
  float f = static_cast<float>(x);
  RoundToBf16(&f, &f, 1);
  return f;
}

// ||got - want|| / ||want||; infinity when got has a NaN or an infinity.
double RelErr(const std::vector<float>& got, const std::vector<double>& want) {
  EXPECT_EQ(got.size(), want.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!std::isfinite(got[i])) return std::numeric_limits<double>::infinity();
    num += (got[i] - want[i]) * (got[i] - want[i]);
    den += want[i] * want[i];
  }
  return std::sqrt(num) / std::sqrt(den);
}

// out (N, OC) = init + a (N, C) @ b (C, OC), a and b rounded first when `round`; op(a) may be
// a^T (a stored (C, N)) and op(b) b^T (b stored (OC, C)).
std::vector<double> Gemm(const std::vector<float>& init, const std::vector<float>& a, bool ta,
                         const std::vector<float>& b, bool tb, int N, int C, int OC, bool round) {
  std::vector<double> out(init.begin(), init.end());
  for (int n = 0; n < N; ++n) {
    for (int o = 0; o < OC; ++o) {
      double s = 0;
      for (int c = 0; c < C; ++c) {
        double x = ta ? a[int64_t{c} * N + n] : a[int64_t{n} * C + c];
        double y = tb ? b[int64_t{o} * C + c] : b[int64_t{c} * OC + o];
        s += round ? R(x) * R(y) : x * y;
      }
      out[int64_t{n} * OC + o] += s;
    }
  }
  return out;
}

TEST(Bf16Round, NearestEvenAndSpecialValues) {
  const float tie_down = 1.0f + std::ldexp(1.0f, -8);    // halfway between 1 and 1 + 2^-7
  const float tie_up = 1.0f + 3 * std::ldexp(1.0f, -8);  // halfway between 1 + 2^-7 and 1 + 2^-6
  const float above = 1.0f + std::ldexp(1.0f, -8) + std::ldexp(1.0f, -20);
  std::vector<float> x = {
      tie_down, tie_up, above, -tie_down, 0.0f, -0.0f, std::numeric_limits<float>::infinity(),
      kNaN,     3.4e38f};
  std::vector<float> y(x.size());
  RoundToBf16(y.data(), x.data(), static_cast<int64_t>(x.size()));
  EXPECT_EQ(y[0], 1.0f);
  EXPECT_EQ(y[1], 1.0f + std::ldexp(1.0f, -6));
  EXPECT_EQ(y[2], 1.0f + std::ldexp(1.0f, -7));
  EXPECT_EQ(y[3], -1.0f);
  EXPECT_EQ(y[4], 0.0f);
  EXPECT_TRUE(std::signbit(y[5]));
  EXPECT_EQ(y[6], std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(y[7]));
  EXPECT_EQ(y[8], std::numeric_limits<float>::infinity());  // above bf16's largest finite

  // The same codes as the bf16 cast, and in place works.
  std::vector<float> r = Random(4096, 1, -1e4f, 1e4f), back(r.size());
  std::vector<uint16_t> codes(r.size());
  CastF32ToBf16(codes.data(), r.data(), static_cast<int64_t>(r.size()));
  CastBf16ToF32(back.data(), codes.data(), static_cast<int64_t>(r.size()));
  RoundToBf16(r.data(), r.data(), static_cast<int64_t>(r.size()));
  EXPECT_EQ(std::memcmp(r.data(), back.data(), r.size() * sizeof(float)), 0);
}

TEST(Bf16Matmul, ForwardIsTheFp32GemmOfRoundedOperands) {
  constexpr int N = 37, C = 300, OC = 45;
  auto inp = Random(N * C, 2), w = Random(C * OC, 3), bias = Random(OC, 4);
  std::vector<float> out(N * OC, kNaN);
  MatmulForwardBf16(out.data(), inp.data(), w.data(), bias.data(), N, C, OC);
  std::vector<float> init(N * OC);
  for (int n = 0; n < N; ++n)
    for (int o = 0; o < OC; ++o) init[n * OC + o] = bias[o];
  EXPECT_LT(RelErr(out, Gemm(init, inp, false, w, false, N, C, OC, true)), 1e-6);
  const double vs_exact = RelErr(out, Gemm(init, inp, false, w, false, N, C, OC, false));
  EXPECT_GT(vs_exact, 1e-4) << "the operands were not rounded";
  EXPECT_LT(vs_exact, 1e-2);

  std::fill(out.begin(), out.end(), kNaN);
  MatmulForwardBf16(out.data(), inp.data(), w.data(), nullptr, N, C, OC);
  EXPECT_LT(RelErr(out, Gemm(std::vector<float>(N * OC), inp, false, w, false, N, C, OC, true)),
            1e-6);
}

TEST(Bf16Matmul, BackwardAccumulatesRoundedProductsAndAnFp32BiasSum) {
  constexpr int N = 41, C = 64, OC = 260;
  auto inp = Random(N * C, 5), w = Random(C * OC, 6), dout = Random(N * OC, 7);
  auto dinp = Random(N * C, 8), dw = Random(C * OC, 9), db = Random(OC, 10);
  auto dinp0 = dinp, dw0 = dw, db_fp32 = db;
  MatmulBackwardBf16(dinp.data(), dw.data(), db.data(), dout.data(), inp.data(), w.data(), N, C,
                     OC);
  // dinp (N, C) += dout (N, OC) @ w^T;  dw (C, OC) += inp^T @ dout.
  EXPECT_LT(RelErr(dinp, Gemm(dinp0, dout, false, w, true, N, OC, C, true)), 1e-6);
  EXPECT_LT(RelErr(dw, Gemm(dw0, inp, true, dout, false, C, N, OC, true)), 1e-6);
  EXPECT_GT(RelErr(dw, Gemm(dw0, inp, true, dout, false, C, N, OC, false)), 1e-5);
  // The bias gradient is a sum, not a product: bit-identical to the fp32 kernel's.
  std::vector<float> scratch_dinp = dinp0, scratch_dw = dw0;
  MatmulBackward<float>(scratch_dinp.data(), scratch_dw.data(), db_fp32.data(), dout.data(),
                        inp.data(), w.data(), N, C, OC);
  EXPECT_EQ(db, db_fp32);

  // No dinp: weight is not needed and dweight is the same.
  std::vector<float> dw2 = dw0;
  MatmulBackwardBf16(nullptr, dw2.data(), nullptr, dout.data(), inp.data(), w.data(), N, C, OC);
  EXPECT_EQ(dw2, dw);
}

TEST(Bf16Matmul, GroupedIsThePerGroupGemm) {
  constexpr int E = 4, C = 48, OC = 70;
  const std::vector<int64_t> offsets = {0, 13, 13, 40, 61};  // group 1 is empty
  const int S = 61;
  auto inp = Random(S * C, 11), w = Random(E * C * OC, 12), bias = Random(E * OC, 13);
  auto dout = Random(S * OC, 14);
  std::vector<float> out(S * OC, kNaN), want(S * OC, kNaN);
  GroupedMatmulForwardBf16(out.data(), inp.data(), w.data(), bias.data(), offsets.data(), E, C, OC);
  auto dinp = Random(S * C, 15), dw = Random(E * C * OC, 16), db = Random(E * OC, 17);
  auto want_dinp = dinp, want_dw = dw, want_db = db;
  GroupedMatmulBackwardBf16(dinp.data(), dw.data(), db.data(), dout.data(), inp.data(), w.data(),
                            offsets.data(), E, C, OC);
  for (int e = 0; e < E; ++e) {
    const int64_t b = offsets[e];
    const int rows = static_cast<int>(offsets[e + 1] - b);
    if (rows == 0) continue;
    const int64_t we = int64_t{e} * C * OC;
    MatmulForwardBf16(want.data() + b * OC, inp.data() + b * C, w.data() + we, bias.data() + e * OC,
                      rows, C, OC);
    MatmulBackwardBf16(want_dinp.data() + b * C, want_dw.data() + we, want_db.data() + e * OC,
                       dout.data() + b * OC, inp.data() + b * C, w.data() + we, rows, C, OC);
  }
  EXPECT_EQ(std::memcmp(out.data(), want.data(), out.size() * 4), 0);
  EXPECT_EQ(dinp, want_dinp);
  EXPECT_EQ(dw, want_dw);
  EXPECT_EQ(db, want_db);
  // The empty group's gradients are untouched.
  auto dw0 = Random(E * C * OC, 16);
  for (int64_t i = 1LL * C * OC; i < 2LL * C * OC; ++i) ASSERT_EQ(dw[i], dw0[i]);
}

// Naive attention in double with the roundings of attention_bf16.h at the stated points.
struct AttentionRef {
  std::vector<double> out, att, dqkv;
};

AttentionRef NaiveAttentionBf16(const std::vector<float>& qkv, const std::vector<float>& dout,
                                const std::vector<float>& att_in, const std::vector<float>& dqkv0,
                                int B, int T, int C, int NH) {
  const int hs = C / NH, ld = 3 * C;
  const double scale = 1.0 / std::sqrt(static_cast<double>(hs));
  AttentionRef r;
  r.out.assign(int64_t{B} * T * C, 0.0);
  r.att.assign(int64_t{B} * NH * T * T, 0.0);
  r.dqkv.assign(dqkv0.begin(), dqkv0.end());
  auto at = [&](int b, int t, int off, int h, int d) {
    return R(qkv[(int64_t{b} * T + t) * ld + off + h * hs + d]);
  };
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < NH; ++h) {
      const int64_t abase = (int64_t{b} * NH + h) * T * T;
      for (int i = 0; i < T; ++i) {
        std::vector<double> s(i + 1);
        double mx = -1e300;
        for (int j = 0; j <= i; ++j) {
          double dot = 0;
          for (int d = 0; d < hs; ++d) dot += at(b, i, 0, h, d) * at(b, j, C, h, d);
          s[j] = scale * dot;
          mx = std::max(mx, s[j]);
        }
        double sum = 0;
        for (int j = 0; j <= i; ++j) sum += (s[j] = std::exp(s[j] - mx));
        for (int j = 0; j <= i; ++j) r.att[abase + int64_t{i} * T + j] = s[j] / sum;
        for (int d = 0; d < hs; ++d) {
          double o = 0;
          for (int j = 0; j <= i; ++j) o += R(s[j] / sum) * at(b, j, 2 * C, h, d);
          r.out[(int64_t{b} * T + i) * C + h * hs + d] = o;
        }
      }
      // Backward from the given (fp32) att.
      for (int i = 0; i < T; ++i) {
        const float* p = att_in.data() + abase + int64_t{i} * T;
        auto dy = [&](int t, int d) { return R(dout[(int64_t{b} * T + t) * C + h * hs + d]); };
        std::vector<double> dp(i + 1), ds(i + 1);
        double rowdot = 0;
        for (int j = 0; j <= i; ++j) {
          double v = 0;
          for (int d = 0; d < hs; ++d) v += dy(i, d) * at(b, j, 2 * C, h, d);
          dp[j] = v;
          rowdot += p[j] * v;
        }
        for (int j = 0; j <= i; ++j) ds[j] = R(p[j] * (dp[j] - rowdot));
        for (int j = 0; j <= i; ++j) {
          for (int d = 0; d < hs; ++d) {
            r.dqkv[(int64_t{b} * T + j) * ld + 2 * C + h * hs + d] += R(p[j]) * dy(i, d);
            r.dqkv[(int64_t{b} * T + i) * ld + h * hs + d] += scale * ds[j] * at(b, j, C, h, d);
            r.dqkv[(int64_t{b} * T + j) * ld + C + h * hs + d] += scale * ds[j] * at(b, i, 0, h, d);
          }
        }
      }
    }
  }
  return r;
}

TEST(Bf16Attention, ForwardAndBackwardRoundTheProductsOperands) {
  constexpr int B = 2, T = 150, C = 64, NH = 4;  // T > 128: two row blocks
  auto qkv = Random(int64_t{B} * T * 3 * C, 20, -2.0f, 2.0f);
  auto dout = Random(int64_t{B} * T * C, 21);
  std::vector<float> out(int64_t{B} * T * C, kNaN), att(int64_t{B} * NH * T * T, kNaN);
  AttentionForwardBf16(out.data(), att.data(), qkv.data(), B, T, C, NH);
  auto dqkv = Random(int64_t{B} * T * 3 * C, 22);
  const auto dqkv0 = dqkv;
  AttentionBackwardBf16(dqkv.data(), dout.data(), qkv.data(), att.data(), B, T, C, NH);
  const AttentionRef ref = NaiveAttentionBf16(qkv, dout, att, dqkv0, B, T, C, NH);
  EXPECT_LT(RelErr(att, ref.att), 1e-5);
  EXPECT_LT(RelErr(out, ref.out),
            1e-4);  // rare 1-ulp bf16 differences in rounding fp32 vs double p
  EXPECT_LT(RelErr(dqkv, ref.dqkv), 1e-5);

  // Against the fp32 kernel: a bf16-sized difference, which must be there.
  std::vector<float> out32(out.size(), kNaN), att32(att.size(), kNaN);
  AttentionForward<float>(out32.data(), att32.data(), qkv.data(), B, T, C, NH);
  std::vector<double> out32d(out32.begin(), out32.end());
  const double diff = RelErr(out, out32d);
  EXPECT_GT(diff, 1e-4) << "nothing was rounded";
  EXPECT_LT(diff, 2e-2);
}

// The bf16 RowStats pair rebuilds the forward's fp32 probabilities and rounds them as the stored
// pair does: bit-identical out and dqkv.
TEST(Bf16Attention, RowStatsMatchStoredBitForBit) {
  constexpr int B = 2, T = 150, C = 64, NH = 4;
  auto qkv = Random(int64_t{B} * T * 3 * C, 23, -2.0f, 2.0f);
  auto dout = Random(int64_t{B} * T * C, 24);
  std::vector<float> out(int64_t{B} * T * C, kNaN), att(int64_t{B} * NH * T * T, kNaN);
  AttentionForwardBf16(out.data(), att.data(), qkv.data(), B, T, C, NH);
  auto dqkv = Random(int64_t{B} * T * 3 * C, 25);
  auto dqkv2 = dqkv;
  AttentionBackwardBf16(dqkv.data(), dout.data(), qkv.data(), att.data(), B, T, C, NH);
  std::vector<float> out2(out.size(), kNaN), stats(int64_t{B} * NH * T * 2, kNaN);
  AttentionForwardRowStatsBf16(out2.data(), stats.data(), qkv.data(), B, T, C, NH);
  AttentionBackwardRowStatsBf16(dqkv2.data(), dout.data(), qkv.data(), stats.data(), B, T, C, NH);
  EXPECT_EQ(out2, out);
  EXPECT_EQ(dqkv2, dqkv);
  std::vector<float> att2(att.size(), kNaN);
  AttentionProbsBf16(att2.data(), qkv.data(), B, T, C, NH);
  EXPECT_EQ(att2, att);
}

}  // namespace
}  // namespace furnace::kernels::cpu
