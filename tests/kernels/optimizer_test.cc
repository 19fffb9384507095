#include "kernels/optimizer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace furnace::kernels::cpu {
namespace {

TEST(AdamW, FirstStepIsBiasCorrected) {
  // Step 1: mhat = g and vhat = g^2, so the update is lr * (g / (|g| + eps) + wd * p).
  std::vector<float> p = {1.0f, -2.0f, 0.5f, 0.0f}, g = {0.1f, -0.3f, 0.0f, 2.0f};
  std::vector<float> m(4, 0.0f), v(4, 0.0f);
  const float lr = 0.01f, wd = 0.1f, eps = 1e-8f;
  const std::vector<float> p0 = p;
  AdamWUpdate(p.data(), g.data(), m.data(), v.data(), 4, lr, 0.9f, 0.95f, eps, wd, 1);
  for (int i = 0; i < 4; ++i) {
    const double gi = g[i];
    const double expected = p0[i] - lr * (gi / (std::fabs(gi) + eps) + wd * p0[i]);
    EXPECT_NEAR(p[i], expected, 1e-7) << i;
    EXPECT_NEAR(m[i], 0.1 * gi, 1e-6 * std::fabs(gi)) << i;
    EXPECT_NEAR(v[i], 0.05 * gi * gi, 1e-6 * gi * gi) << i;
  }
}

TEST(AdamW, SecondStepMatchesHandComputation) {
  float p = 0.7f, m = 0.0f, v = 0.0f;
  const float g1 = 0.2f, g2 = -0.5f, lr = 1e-3f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f;
  AdamWUpdate(&p, &g1, &m, &v, 1, lr, b1, b2, eps, wd, 1);
  AdamWUpdate(&p, &g2, &m, &v, 1, lr, b1, b2, eps, wd, 2);
  double hp = 0.7, hm = 0, hv = 0;
  const double gs[2] = {0.2, -0.5};
  for (int t = 1; t <= 2; ++t) {
    hm = 0.9 * hm + 0.1 * gs[t - 1];
    hv = 0.95 * hv + 0.05 * gs[t - 1] * gs[t - 1];
    const double mhat = hm / (1 - std::pow(0.9, t)), vhat = hv / (1 - std::pow(0.95, t));
    hp -= 1e-3 * (mhat / (std::sqrt(vhat) + 1e-8) + 0.1 * hp);
  }
  EXPECT_NEAR(p, hp, 1e-7);
  EXPECT_NEAR(m, hm, 1e-6 * std::fabs(hm));
  EXPECT_NEAR(v, hv, 1e-6 * hv);
}

TEST(AdamW, NoWeightDecayWhenZero) {
  float p = 3.0f, g = 0.0f, m = 0.0f, v = 0.0f;
  AdamWUpdate(&p, &g, &m, &v, 1, 0.1f, 0.9f, 0.95f, 1e-8f, 0.0f, 1);
  EXPECT_EQ(p, 3.0f);
}

TEST(SumOfSquares, AccumulatesInDouble) {
  // A float accumulator would lose the 1e-8 against 9000.
  std::vector<float> x(1000, 3.0f);
  x.push_back(1e-4f);
  EXPECT_NEAR(SumOfSquares(x.data(), static_cast<int64_t>(x.size())), 9000.0 + 1e-8, 1e-10);
  EXPECT_EQ(SumOfSquares(x.data(), 0), 0.0);
}

TEST(Scale, MultipliesInPlace) {
  std::vector<float> x = {1.0f, -2.0f, 4.0f};
  Scale(x.data(), 0.5f, 3);
  EXPECT_EQ(x, (std::vector<float>{0.5f, -1.0f, 2.0f}));
}

}  // namespace
}  // namespace furnace::kernels::cpu
