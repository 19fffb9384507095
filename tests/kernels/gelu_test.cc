#include "kernels/gelu.h"

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

TEST(Gelu, KnownValues) {
  const std::vector<double> x = {0.0, 1.0, -1.0, 10.0, -10.0};
  std::vector<double> y(x.size());
  GeluForward(y.data(), x.data(), static_cast<int64_t>(x.size()));
  EXPECT_EQ(y[0], 0.0);
  const double c = std::sqrt(2.0 / M_PI);
  EXPECT_NEAR(y[1], 0.5 * (1 + std::tanh(c * (1 + 0.044715))), 1e-15);
  EXPECT_NEAR(y[1] - y[2], 1.0, 1e-15);  // gelu(x) - gelu(-x) = x
  EXPECT_NEAR(y[3], 10.0, 1e-12);
  EXPECT_NEAR(y[4], 0.0, 1e-12);
}

TEST(Gelu, GradientMatchesFiniteDifferences) {
  std::mt19937_64 rng(20);
  constexpr int n = 64;
  auto x = RandomVector(rng, n, -4, 4), r = RandomVector(rng, n);
  std::vector<double> y(n);
  auto loss = [&] {
    GeluForward(y.data(), x.data(), n);
    return Dot(y, r);
  };
  GradBuffer dx(rng, n);
  GeluBackward(dx.data(), x.data(), r.data(), n);
  testing::ExpectGradient("dinp", x, dx.Delta(), loss);
}

TEST(Gelu, FloatMatchesDouble) {
  std::mt19937_64 rng(21);
  constexpr int n = 1000;
  auto x = RandomVector(rng, n, -6, 6);
  std::vector<double> y(n);
  GeluForward(y.data(), x.data(), n);
  auto x_f = testing::ToFloat(x);
  std::vector<float> y_f(n);
  GeluForward(y_f.data(), x_f.data(), n);
  testing::ExpectClose(y_f, y);
}

}  // namespace
}  // namespace furnace::kernels::cpu
