#include "kernels/router.h"

#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "grad_check.h"

namespace furnace::kernels::cpu {
namespace {
using testing::Dot;
using testing::GradBuffer;
using testing::RandomVector;

TEST(Softmax, GradientMatchesFiniteDifferences) {
  std::mt19937_64 rng(60);
  constexpr int N = 3, E = 6;
  auto logits = RandomVector(rng, N * E, -3, 3), r = RandomVector(rng, N * E);
  std::vector<double> probs(N * E);
  auto loss = [&] {
    SoftmaxForward(probs.data(), logits.data(), N, E);
    return Dot(probs, r);
  };
  loss();
  GradBuffer dlogits(rng, logits.size());
  SoftmaxBackward(dlogits.data(), r.data(), probs.data(), N, E);
  testing::ExpectGradient("dlogits", logits, dlogits.Delta(), loss);
}

TEST(Softmax, FloatMatchesDouble) {
  std::mt19937_64 rng(61);
  constexpr int N = 32, E = 64;
  auto logits = RandomVector(rng, N * E, -8, 8);
  std::vector<double> probs(N * E);
  SoftmaxForward(probs.data(), logits.data(), N, E);
  auto logits_f = testing::ToFloat(logits);
  std::vector<float> probs_f(N * E);
  SoftmaxForward(probs_f.data(), logits_f.data(), N, E);
  testing::ExpectClose(probs_f, probs);
}

TEST(TopK, DescendingOrderAndTiesToLowerIndex) {
  constexpr int N = 3, E = 5, k = 3;
  const std::vector<float> probs = {
      0.1f, 0.3f, 0.1f, 0.3f, 0.2f,  // tie 1/3 at the top, tie 0/2 at the bottom
      0.2f, 0.2f, 0.2f, 0.2f, 0.2f,  // all tied
      0.0f, 0.1f, 0.2f, 0.3f, 0.4f};
  std::vector<int32_t> idx(N * k);
  std::vector<float> gates(N * k);
  TopKForward(idx.data(), gates.data(), probs.data(), N, E, k, /*normalize=*/false);
  EXPECT_EQ(idx, (std::vector<int32_t>{1, 3, 4, 0, 1, 2, 4, 3, 2}));
  EXPECT_EQ(gates, (std::vector<float>{0.3f, 0.3f, 0.2f, 0.2f, 0.2f, 0.2f, 0.4f, 0.3f, 0.2f}));

  TopKForward(idx.data(), gates.data(), probs.data(), N, E, k, /*normalize=*/true);
  for (int n = 0; n < N; ++n) {
    EXPECT_NEAR(gates[n * k] + gates[n * k + 1] + gates[n * k + 2], 1.0f, 1e-6f);
  }
  EXPECT_NEAR(gates[0], 0.3f / 0.8f, 1e-6f);

  // A tie between the k-th and (k+1)-th keeps the lower index.
  const std::vector<float> p2 = {0.25f, 0.25f, 0.25f, 0.25f};
  std::vector<int32_t> idx2(2);
  std::vector<float> g2(2);
  TopKForward(idx2.data(), g2.data(), p2.data(), 1, 4, 2, true);
  EXPECT_EQ(idx2, (std::vector<int32_t>{0, 1}));
  EXPECT_EQ(g2, (std::vector<float>{0.5f, 0.5f}));
}

void CheckTopKGradient(bool normalize) {
  std::mt19937_64 rng(62);
  constexpr int N = 4, E = 6, k = 3;
  auto logits = RandomVector(rng, N * E, -2, 2);
  std::vector<double> probs(N * E);
  SoftmaxForward(probs.data(), logits.data(), N, E);  // distinct, well separated
  auto r = RandomVector(rng, N * k);
  std::vector<int32_t> idx(N * k);
  std::vector<double> gates(N * k);
  auto loss = [&] {
    TopKForward(idx.data(), gates.data(), probs.data(), N, E, k, normalize);
    return Dot(gates, r);
  };
  loss();
  GradBuffer dprobs(rng, probs.size());
  TopKBackward(dprobs.data(), r.data(), probs.data(), idx.data(), N, E, k, normalize);
  testing::ExpectGradient(normalize ? "dprobs (normalized)" : "dprobs", probs, dprobs.Delta(),
                          loss);
}

TEST(TopK, GradientMatchesFiniteDifferences) { CheckTopKGradient(false); }
TEST(TopK, NormalizedGradientMatchesFiniteDifferences) { CheckTopKGradient(true); }

TEST(AuxLoss, HandComputedValue) {
  // N = 2, E = 2, k = 1: token 0 -> e0, token 1 -> e0. frac = (1, 0); meanprob = (0.7, 0.3).
  const std::vector<double> probs = {0.9, 0.1, 0.5, 0.5};
  const std::vector<int32_t> idx = {0, 0};
  EXPECT_NEAR(AuxLossForward(probs.data(), idx.data(), 2, 2, 1, 0.01), 0.01 * 2 * 0.7, 1e-15);
  // Perfect balance with uniform probabilities gives alpha.
  const std::vector<double> uniform(4 * 4, 0.25);
  const std::vector<int32_t> idx2 = {0, 1, 2, 3, 0, 1, 2, 3};  // N = 4, k = 2
  EXPECT_NEAR(AuxLossForward(uniform.data(), idx2.data(), 4, 4, 2, 0.01), 0.01, 1e-15);
}

TEST(AuxLoss, GradientMatchesFiniteDifferences) {
  std::mt19937_64 rng(63);
  constexpr int N = 5, E = 4, k = 2;
  auto probs = RandomVector(rng, N * E, 0, 1);
  const std::vector<int32_t> idx = {0, 1, 0, 2, 3, 0, 0, 1, 2, 0};  // fixed: frac is constant
  const double alpha = 0.01, daux = 1.7;
  auto loss = [&] { return daux * AuxLossForward(probs.data(), idx.data(), N, E, k, alpha); };
  GradBuffer dprobs(rng, probs.size());
  AuxLossBackward(dprobs.data(), idx.data(), N, E, k, alpha, daux);
  testing::ExpectGradient("dprobs", probs, dprobs.Delta(), loss);
}

// logits -> softmax -> top-k gates (normalized) and the aux loss: the router's whole backward.
TEST(Router, ChainGradientMatchesFiniteDifferences) {
  std::mt19937_64 rng(64);
  constexpr int N = 6, E = 5, k = 2;
  auto logits = RandomVector(rng, N * E, -2, 2), r = RandomVector(rng, N * k);
  const double alpha = 0.3;
  std::vector<double> probs(N * E), gates(N * k);
  std::vector<int32_t> idx(N * k);
  auto loss = [&] {
    SoftmaxForward(probs.data(), logits.data(), N, E);
    TopKForward(idx.data(), gates.data(), probs.data(), N, E, k, true);
    return Dot(gates, r) + AuxLossForward(probs.data(), idx.data(), N, E, k, alpha);
  };
  loss();
  std::vector<double> dprobs(N * E, 0.0);
  TopKBackward(dprobs.data(), r.data(), probs.data(), idx.data(), N, E, k, true);
  AuxLossBackward(dprobs.data(), idx.data(), N, E, k, alpha, 1.0);
  GradBuffer dlogits(rng, logits.size());
  SoftmaxBackward(dlogits.data(), dprobs.data(), probs.data(), N, E);
  testing::ExpectGradient("dlogits", logits, dlogits.Delta(), loss);
}

}  // namespace
}  // namespace furnace::kernels::cpu
