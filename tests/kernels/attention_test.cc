#include "kernels/attention.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "grad_check.h"

namespace furnace::kernels::cpu {
namespace {
using testing::Dot;
using testing::GradBuffer;
using testing::RandomVector;

// Straight from the definition, one (b, h, t) at a time.
void NaiveAttention(std::vector<double>& out, std::vector<double>& att,
                    const std::vector<double>& qkv, int B, int T, int C, int NH) {
  const int hs = C / NH;
  const double scale = 1.0 / std::sqrt(static_cast<double>(hs));
  out.assign(B * T * C, 0.0);
  att.assign(B * NH * T * T, 0.0);
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < NH; ++h)
      for (int t = 0; t < T; ++t) {
        const double* q = &qkv[(b * T + t) * 3 * C + h * hs];
        double* a = &att[((b * NH + h) * T + t) * T];
        double mx = -1e300;
        for (int j = 0; j <= t; ++j) {
          const double* k = &qkv[(b * T + j) * 3 * C + C + h * hs];
          double s = 0;
          for (int i = 0; i < hs; ++i) s += q[i] * k[i];
          a[j] = s * scale;
          mx = std::max(mx, a[j]);
        }
        double sum = 0;
        for (int j = 0; j <= t; ++j) sum += (a[j] = std::exp(a[j] - mx));
        for (int j = 0; j <= t; ++j) a[j] /= sum;
        for (int j = 0; j <= t; ++j) {
          const double* v = &qkv[(b * T + j) * 3 * C + 2 * C + h * hs];
          for (int i = 0; i < hs; ++i) out[(b * T + t) * C + h * hs + i] += a[j] * v[i];
        }
      }
}

struct Shape {
  int B, T, C, NH;
};

void CheckAgainstNaive(const Shape& s, uint64_t seed) {
  std::mt19937_64 rng(seed);
  auto qkv = RandomVector(rng, s.B * s.T * 3 * s.C, -2, 2);
  std::vector<double> out(s.B * s.T * s.C, 7.0), att(s.B * s.NH * s.T * s.T, 7.0);
  AttentionForward(out.data(), att.data(), qkv.data(), s.B, s.T, s.C, s.NH);
  std::vector<double> out_ref, att_ref;
  NaiveAttention(out_ref, att_ref, qkv, s.B, s.T, s.C, s.NH);
  testing::ExpectClose(out, out_ref, 1e-12, "out");
  testing::ExpectClose(att, att_ref, 1e-12, "att");  // includes the zero upper triangle
}

TEST(Attention, ForwardMatchesNaive) { CheckAgainstNaive({2, 7, 12, 3}, 50); }
// T above the 128-row block: several row blocks, the last one partial.
TEST(Attention, ForwardMatchesNaiveAcrossRowBlocks) { CheckAgainstNaive({1, 300, 8, 2}, 51); }

TEST(Attention, RowsAreCausalDistributions) {
  std::mt19937_64 rng(52);
  constexpr int B = 1, T = 9, C = 8, NH = 2;
  auto qkv = testing::ToFloat(RandomVector(rng, B * T * 3 * C, -3, 3));
  std::vector<float> out(B * T * C), att(B * NH * T * T);
  AttentionForward(out.data(), att.data(), qkv.data(), B, T, C, NH);
  for (int h = 0; h < NH; ++h)
    for (int t = 0; t < T; ++t) {
      double sum = 0;
      for (int j = 0; j < T; ++j) {
        const float a = att[(h * T + t) * T + j];
        if (j > t) {
          EXPECT_EQ(a, 0.0f);
        }
        sum += a;
      }
      EXPECT_NEAR(sum, 1.0, 1e-6);
    }
}

TEST(Attention, FutureTokensDoNotChangeEarlierOutputs) {
  std::mt19937_64 rng(53);
  constexpr int B = 2, T = 150, C = 8, NH = 2, kChanged = 100;
  auto qkv = RandomVector(rng, B * T * 3 * C);
  std::vector<double> out(B * T * C), att(B * NH * T * T);
  AttentionForward(out.data(), att.data(), qkv.data(), B, T, C, NH);
  auto qkv2 = qkv;
  for (int b = 0; b < B; ++b)
    for (int t = kChanged; t < T; ++t)
      for (int i = 0; i < 3 * C; ++i) qkv2[(b * T + t) * 3 * C + i] += 1.5;
  std::vector<double> out2(out.size()), att2(att.size());
  AttentionForward(out2.data(), att2.data(), qkv2.data(), B, T, C, NH);
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t)
      for (int c = 0; c < C; ++c) {
        const int i = (b * T + t) * C + c;
        if (t < kChanged) {
          EXPECT_NEAR(out2[i], out[i], 1e-14) << "b " << b << " t " << t;
        }
      }
  EXPECT_NE(out2[(T - 1) * C], out[(T - 1) * C]);
}

void CheckGradient(const Shape& s, uint64_t seed) {
  std::mt19937_64 rng(seed);
  auto qkv = RandomVector(rng, s.B * s.T * 3 * s.C, -1.5, 1.5);
  auto r = RandomVector(rng, s.B * s.T * s.C);
  std::vector<double> out(s.B * s.T * s.C), att(s.B * s.NH * s.T * s.T);
  auto loss = [&] {
    AttentionForward(out.data(), att.data(), qkv.data(), s.B, s.T, s.C, s.NH);
    return Dot(out, r);
  };
  loss();
  GradBuffer dqkv(rng, qkv.size());
  AttentionBackward(dqkv.data(), r.data(), qkv.data(), att.data(), s.B, s.T, s.C, s.NH);
  testing::ExpectGradient("dqkv", qkv, dqkv.Delta(), loss);
}

TEST(Attention, GradientMatchesFiniteDifferences) { CheckGradient({2, 5, 6, 2}, 54); }
TEST(Attention, GradientMatchesFiniteDifferencesAcrossRowBlocks) {
  CheckGradient({1, 133, 4, 2}, 55);
}

TEST(Attention, FloatMatchesDouble) {
  std::mt19937_64 rng(56);
  constexpr int B = 2, T = 160, C = 32, NH = 4;
  auto qkv = RandomVector(rng, B * T * 3 * C, -2, 2), dout = RandomVector(rng, B * T * C);
  std::vector<double> out(B * T * C), att(B * NH * T * T), dqkv(qkv.size());
  AttentionForward(out.data(), att.data(), qkv.data(), B, T, C, NH);
  AttentionBackward(dqkv.data(), dout.data(), qkv.data(), att.data(), B, T, C, NH);
  auto qkv_f = testing::ToFloat(qkv), dout_f = testing::ToFloat(dout);
  std::vector<float> out_f(out.size()), att_f(att.size()), dqkv_f(qkv.size());
  AttentionForward(out_f.data(), att_f.data(), qkv_f.data(), B, T, C, NH);
  AttentionBackward(dqkv_f.data(), dout_f.data(), qkv_f.data(), att_f.data(), B, T, C, NH);
  testing::ExpectClose(out_f, out, 1e-5, "out");
  testing::ExpectClose(att_f, att, 1e-5, "att");
  testing::ExpectClose(dqkv_f, dqkv, 1e-5, "dqkv");
}

// model.attention_probs recomputed: the RowStats pair against the stored one. Bit-identical out
// and dqkv (the rebuilt probabilities are the forward's own), and (m, r) are each row's max score
// and 1 / sum of exponentials, checked against the stored probabilities: P[t][0] = exp(S - m) r.
template <typename T>
void CheckRowStatsAgainstStored(const Shape& s, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<T> qkv, dout;
  for (double x : RandomVector(rng, s.B * s.T * 3 * s.C, -2, 2)) qkv.push_back(static_cast<T>(x));
  for (double x : RandomVector(rng, s.B * s.T * s.C)) dout.push_back(static_cast<T>(x));
  const size_t rows = static_cast<size_t>(s.B) * s.NH * s.T;
  std::vector<T> out(s.B * s.T * s.C), att(rows * s.T), dqkv(qkv.size(), T(0.25));
  AttentionForward(out.data(), att.data(), qkv.data(), s.B, s.T, s.C, s.NH);
  AttentionBackward(dqkv.data(), dout.data(), qkv.data(), att.data(), s.B, s.T, s.C, s.NH);
  std::vector<T> out2(out.size(), T(7)), stats(rows * 2, T(7)), dqkv2(qkv.size(), T(0.25));
  AttentionForwardRowStats(out2.data(), stats.data(), qkv.data(), s.B, s.T, s.C, s.NH);
  AttentionBackwardRowStats(dqkv2.data(), dout.data(), qkv.data(), stats.data(), s.B, s.T, s.C,
                            s.NH);
  EXPECT_EQ(out2, out);
  EXPECT_EQ(dqkv2, dqkv);
  // The probabilities alone (the adaptive planner's rebuild of a dropped att): the forward's.
  std::vector<T> att2(att.size(), T(7));
  AttentionProbs(att2.data(), qkv.data(), s.B, s.T, s.C, s.NH);
  EXPECT_EQ(att2, att);
  const int hs = s.C / s.NH;
  const double scale = 1.0 / std::sqrt(static_cast<double>(hs));
  for (int b = 0; b < s.B; ++b)
    for (int h = 0; h < s.NH; ++h)
      for (int t = 0; t < s.T; ++t) {
        const size_t row = (static_cast<size_t>(b) * s.NH + h) * s.T + t;
        double mx = -1e300, sum = 0;
        std::vector<double> sc(t + 1);
        for (int j = 0; j <= t; ++j) {
          double d = 0;
          for (int i = 0; i < hs; ++i) {
            d += static_cast<double>(qkv[(b * s.T + t) * 3 * s.C + h * hs + i]) *
                 qkv[(b * s.T + j) * 3 * s.C + s.C + h * hs + i];
          }
          sc[j] = d * scale;
          mx = std::max(mx, sc[j]);
        }
        for (int j = 0; j <= t; ++j) sum += std::exp(sc[j] - mx);
        const double tol = sizeof(T) == 4 ? 1e-5 : 1e-12;
        EXPECT_NEAR(stats[2 * row], mx, tol * (1 + std::abs(mx))) << "row " << row;
        EXPECT_NEAR(stats[2 * row + 1], 1 / sum, tol / sum) << "row " << row;
      }
}

TEST(AttentionRowStats, MatchesStoredBitForBitInFloat) {
  CheckRowStatsAgainstStored<float>({2, 7, 12, 3}, 57);
  CheckRowStatsAgainstStored<float>({1, 300, 8, 2}, 58);  // several row blocks, the last partial
}

TEST(AttentionRowStats, MatchesStoredBitForBitInDouble) {
  CheckRowStatsAgainstStored<double>({2, 140, 16, 4}, 59);
}

TEST(AttentionRowStats, GradientMatchesFiniteDifferences) {
  for (const Shape& s : {Shape{2, 5, 6, 2}, Shape{1, 133, 4, 2}}) {
    std::mt19937_64 rng(60 + s.T);
    auto qkv = RandomVector(rng, s.B * s.T * 3 * s.C, -1.5, 1.5);
    auto r = RandomVector(rng, s.B * s.T * s.C);
    std::vector<double> out(s.B * s.T * s.C), stats(s.B * s.NH * s.T * 2);
    auto loss = [&] {
      AttentionForwardRowStats(out.data(), stats.data(), qkv.data(), s.B, s.T, s.C, s.NH);
      return Dot(out, r);
    };
    loss();
    GradBuffer dqkv(rng, qkv.size());
    AttentionBackwardRowStats(dqkv.data(), r.data(), qkv.data(), stats.data(), s.B, s.T, s.C, s.NH);
    testing::ExpectGradient("dqkv", qkv, dqkv.Delta(), loss);
  }
}

}  // namespace
}  // namespace furnace::kernels::cpu
