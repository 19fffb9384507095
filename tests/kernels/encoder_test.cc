#include "kernels/encoder.h"

#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "grad_check.h"

namespace furnace::kernels::cpu {
namespace {
using testing::Dot;
using testing::GradBuffer;
using testing::RandomVector;

constexpr int B = 2, Tl = 3, C = 4, V = 5;
const std::vector<int32_t> kTokens = {1, 4, 1, 0, 2, 1};  // token 1 three times: dwte accumulates

TEST(Embedding, ForwardAddsTokenAndPosition) {
  std::mt19937_64 rng(1);
  auto wte = RandomVector(rng, V * C), wpe = RandomVector(rng, Tl * C);
  std::vector<double> out(B * Tl * C);
  EmbeddingForward(out.data(), kTokens.data(), wte.data(), wpe.data(), B, Tl, C);
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < Tl; ++t)
      for (int c = 0; c < C; ++c)
        EXPECT_EQ(out[(b * Tl + t) * C + c], wte[kTokens[b * Tl + t] * C + c] + wpe[t * C + c]);
}

TEST(Embedding, GradientMatchesFiniteDifferences) {
  std::mt19937_64 rng(2);
  auto wte = RandomVector(rng, V * C), wpe = RandomVector(rng, Tl * C);
  auto r = RandomVector(rng, B * Tl * C);
  std::vector<double> out(B * Tl * C);
  auto loss = [&] {
    EmbeddingForward(out.data(), kTokens.data(), wte.data(), wpe.data(), B, Tl, C);
    return Dot(out, r);
  };
  GradBuffer dwte(rng, wte.size()), dwpe(rng, wpe.size());
  EmbeddingBackward(dwte.data(), dwpe.data(), r.data(), kTokens.data(), B, Tl, C);
  testing::ExpectGradient("dwte", wte, dwte.Delta(), loss);
  testing::ExpectGradient("dwpe", wpe, dwpe.Delta(), loss);
}

TEST(Embedding, FloatMatchesDouble) {
  std::mt19937_64 rng(3);
  auto wte = RandomVector(rng, V * C), wpe = RandomVector(rng, Tl * C);
  std::vector<double> out(B * Tl * C);
  EmbeddingForward(out.data(), kTokens.data(), wte.data(), wpe.data(), B, Tl, C);
  auto wte_f = testing::ToFloat(wte), wpe_f = testing::ToFloat(wpe);
  std::vector<float> out_f(out.size());
  EmbeddingForward(out_f.data(), kTokens.data(), wte_f.data(), wpe_f.data(), B, Tl, C);
  testing::ExpectClose(out_f, out);
}

}  // namespace
}  // namespace furnace::kernels::cpu
