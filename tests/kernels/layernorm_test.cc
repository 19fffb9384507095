#include "kernels/layernorm.h"

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

constexpr int N = 4, C = 7;

TEST(LayerNorm, ForwardNormalisesEachRow) {
  std::mt19937_64 rng(10);
  auto inp = RandomVector(rng, N * C, -3, 5);
  std::vector<double> w(C, 1.0), b(C, 0.0), out(N * C), mean(N), rstd(N);
  LayerNormForward(out.data(), mean.data(), rstd.data(), inp.data(), w.data(), b.data(), N, C,
                   1e-5);
  for (int n = 0; n < N; ++n) {
    double s = 0, s2 = 0;
    for (int c = 0; c < C; ++c) {
      s += out[n * C + c];
      s2 += out[n * C + c] * out[n * C + c];
    }
    EXPECT_NEAR(s / C, 0.0, 1e-12);
    const double var = s2 / C;  // = v / (v + eps)
    const double v = 1.0 / (rstd[n] * rstd[n]) - 1e-5;
    EXPECT_NEAR(var, v / (v + 1e-5), 1e-12);
  }
}

TEST(LayerNorm, GradientMatchesFiniteDifferences) {
  std::mt19937_64 rng(11);
  auto inp = RandomVector(rng, N * C), w = RandomVector(rng, C, 0.5, 1.5), b = RandomVector(rng, C);
  auto r = RandomVector(rng, N * C);
  std::vector<double> out(N * C), mean(N), rstd(N);
  auto loss = [&] {
    LayerNormForward(out.data(), mean.data(), rstd.data(), inp.data(), w.data(), b.data(), N, C,
                     1e-5);
    return Dot(out, r);
  };
  loss();
  GradBuffer dinp(rng, inp.size()), dw(rng, C), db(rng, C);
  LayerNormBackward(dinp.data(), dw.data(), db.data(), r.data(), inp.data(), w.data(), mean.data(),
                    rstd.data(), N, C);
  testing::ExpectGradient("dinp", inp, dinp.Delta(), loss);
  testing::ExpectGradient("dweight", w, dw.Delta(), loss);
  testing::ExpectGradient("dbias", b, db.Delta(), loss);
}

TEST(LayerNorm, FloatMatchesDouble) {
  std::mt19937_64 rng(12);
  constexpr int n = 16, c = 96;
  auto inp = RandomVector(rng, n * c, -2, 3), w = RandomVector(rng, c), b = RandomVector(rng, c);
  std::vector<double> out(n * c), mean(n), rstd(n);
  LayerNormForward(out.data(), mean.data(), rstd.data(), inp.data(), w.data(), b.data(), n, c,
                   1e-5);
  auto inp_f = testing::ToFloat(inp), w_f = testing::ToFloat(w), b_f = testing::ToFloat(b);
  std::vector<float> out_f(n * c), mean_f(n), rstd_f(n);
  LayerNormForward(out_f.data(), mean_f.data(), rstd_f.data(), inp_f.data(), w_f.data(), b_f.data(),
                   n, c, 1e-5f);
  testing::ExpectClose(out_f, out);
  testing::ExpectClose(rstd_f, rstd);
}

}  // namespace
}  // namespace furnace::kernels::cpu
