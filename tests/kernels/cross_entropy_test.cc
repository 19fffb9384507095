#include "kernels/cross_entropy.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "grad_check.h"

namespace furnace::kernels::cpu {
namespace {
using testing::GradBuffer;
using testing::RandomVector;

TEST(CrossEntropy, UniformLogitsGiveLogV) {
  constexpr int N = 3, V = 50;
  std::vector<float> logits(N * V, 0.25f), probs(N * V), losses(N);
  const std::vector<int32_t> targets = {0, 17, 49};
  CrossEntropyForward(losses.data(), probs.data(), logits.data(), targets.data(), N, V);
  for (float l : losses) EXPECT_NEAR(l, std::log(50.0), 1e-6);
  for (float p : probs) EXPECT_NEAR(p, 1.0 / 50, 1e-7);
}

TEST(CrossEntropy, StableForLargeLogits) {
  constexpr int V = 4;
  const std::vector<float> logits = {1000.f, -1000.f, 999.f, 0.f};
  std::vector<float> probs(V), loss(1);
  const int32_t target = 1;
  CrossEntropyForward(loss.data(), probs.data(), logits.data(), &target, 1, V);
  EXPECT_TRUE(std::isfinite(loss[0]));
  EXPECT_NEAR(loss[0], 2000.0 + std::log1p(std::exp(-1.0)), 1e-2);
  EXPECT_NEAR(probs[0], 1.0 / (1.0 + std::exp(-1.0)), 1e-6);
}

TEST(CrossEntropy, GradientMatchesFiniteDifferences) {
  std::mt19937_64 rng(30);
  constexpr int N = 4, V = 9;
  auto logits = RandomVector(rng, N * V, -3, 3);
  const std::vector<int32_t> targets = {3, 0, 8, 3};
  const double dloss = 0.37;
  std::vector<double> probs(N * V), losses(N);
  auto loss = [&] {
    CrossEntropyForward(losses.data(), probs.data(), logits.data(), targets.data(), N, V);
    double s = 0;
    for (double l : losses) s += dloss * l;
    return s;
  };
  loss();
  GradBuffer dlogits(rng, logits.size());
  CrossEntropyBackward(dlogits.data(), probs.data(), targets.data(), dloss, N, V);
  testing::ExpectGradient("dlogits", logits, dlogits.Delta(), loss);
}

TEST(CrossEntropy, FloatMatchesDouble) {
  std::mt19937_64 rng(31);
  constexpr int N = 8, V = 300;
  auto logits = RandomVector(rng, N * V, -5, 5);
  std::vector<int32_t> targets(N);
  for (int n = 0; n < N; ++n) targets[n] = (n * 37) % V;
  std::vector<double> probs(N * V), losses(N);
  CrossEntropyForward(losses.data(), probs.data(), logits.data(), targets.data(), N, V);
  auto logits_f = testing::ToFloat(logits);
  std::vector<float> probs_f(N * V), losses_f(N);
  CrossEntropyForward(losses_f.data(), probs_f.data(), logits_f.data(), targets.data(), N, V);
  testing::ExpectClose(losses_f, losses);
  testing::ExpectClose(probs_f, probs);
}

}  // namespace
}  // namespace furnace::kernels::cpu
