#include "kernels/gelu.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <iterator>
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

// The float loops run 16-element chunks through a vectorised exp (its clamp in MAXPS / MINPS on
// x86) and the rest one element at a time: both paths give the same bits for every input,
// the clamp's edges, infinities and NaN included.
TEST(Gelu, FloatChunksAreBitIdenticalToTheScalarPath) {
  std::mt19937_64 rng(22);
  std::vector<float> x = testing::ToFloat(RandomVector(rng, 4 * 16, -12, 12));
  const float specials[] = {0.0f,  -0.0f,  1e-30f,   -1e-30f,   43.7f,  -43.7f,
                            44.0f, -44.0f, 50.0f,    -50.0f,    100.0f, -100.0f,
                            3e38f, -3e38f, INFINITY, -INFINITY, NAN,    -NAN};
  for (size_t i = 0; i < std::size(specials); ++i) x[3 * i] = specials[i];
  const int64_t n = static_cast<int64_t>(x.size());  // whole chunks: no tail
  std::vector<float> dy = testing::ToFloat(RandomVector(rng, x.size()));
  std::vector<float> y(n), dx(n, 0.5f);
  GeluForward(y.data(), x.data(), n);
  GeluBackward(dx.data(), x.data(), dy.data(), n);
  for (int64_t i = 0; i < n; ++i) {
    float y1 = 0, dx1 = 0.5f;
    GeluForward(&y1, &x[i], 1);  // one element: the scalar path
    GeluBackward(&dx1, &x[i], &dy[i], 1);
    EXPECT_EQ(std::bit_cast<uint32_t>(y[i]), std::bit_cast<uint32_t>(y1)) << "x = " << x[i];
    EXPECT_EQ(std::bit_cast<uint32_t>(dx[i]), std::bit_cast<uint32_t>(dx1)) << "x = " << x[i];
  }
}

}  // namespace
}  // namespace furnace::kernels::cpu
