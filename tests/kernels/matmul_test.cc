#include "kernels/matmul.h"

#include <cblas.h>
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "grad_check.h"
#include "kernels/blas.h"

namespace furnace::kernels::cpu {
namespace {
using testing::Dot;
using testing::GradBuffer;
using testing::RandomVector;

std::vector<double> NaiveMatmul(const std::vector<double>& inp, const std::vector<double>& w,
                                const double* bias, int N, int C, int OC) {
  std::vector<double> out(N * OC);
  for (int n = 0; n < N; ++n)
    for (int o = 0; o < OC; ++o) {
      double s = bias ? bias[o] : 0.0;
      for (int c = 0; c < C; ++c) s += inp[n * C + c] * w[c * OC + o];
      out[n * OC + o] = s;
    }
  return out;
}

TEST(Blas, SetBlasThreads) {
  SetBlasThreads(1);
  EXPECT_EQ(openblas_get_num_threads(), 1);
}

TEST(Matmul, ForwardMatchesNaive) {
  std::mt19937_64 rng(40);
  constexpr int N = 5, C = 6, OC = 7;
  auto inp = RandomVector(rng, N * C), w = RandomVector(rng, C * OC), b = RandomVector(rng, OC);
  std::vector<double> out(N * OC, 99.0);  // overwritten, not accumulated
  MatmulForward(out.data(), inp.data(), w.data(), b.data(), N, C, OC);
  testing::ExpectClose(out, NaiveMatmul(inp, w, b.data(), N, C, OC), 1e-13, "with bias");
  std::fill(out.begin(), out.end(), 99.0);
  MatmulForward(out.data(), inp.data(), w.data(), static_cast<const double*>(nullptr), N, C, OC);
  testing::ExpectClose(out, NaiveMatmul(inp, w, nullptr, N, C, OC), 1e-13, "no bias");
}

TEST(Matmul, GradientMatchesFiniteDifferences) {
  std::mt19937_64 rng(41);
  constexpr int N = 4, C = 5, OC = 3;
  auto inp = RandomVector(rng, N * C), w = RandomVector(rng, C * OC), b = RandomVector(rng, OC);
  auto r = RandomVector(rng, N * OC);
  std::vector<double> out(N * OC);
  auto loss = [&] {
    MatmulForward(out.data(), inp.data(), w.data(), b.data(), N, C, OC);
    return Dot(out, r);
  };
  GradBuffer dinp(rng, inp.size()), dw(rng, w.size()), db(rng, b.size());
  MatmulBackward(dinp.data(), dw.data(), db.data(), r.data(), inp.data(), w.data(), N, C, OC);
  testing::ExpectGradient("dinp", inp, dinp.Delta(), loss);
  testing::ExpectGradient("dweight", w, dw.Delta(), loss);
  testing::ExpectGradient("dbias", b, db.Delta(), loss);

  // dinp and dbias may be skipped; dweight is the same.
  GradBuffer dw2(rng, w.size());
  MatmulBackward<double>(nullptr, dw2.data(), nullptr, r.data(), inp.data(), w.data(), N, C, OC);
  testing::ExpectClose(dw2.Delta(), dw.Delta(), 1e-13, "dweight without dinp");
}

TEST(Matmul, FloatMatchesDouble) {
  std::mt19937_64 rng(42);
  constexpr int N = 64, C = 96, OC = 80;
  auto inp = RandomVector(rng, N * C), w = RandomVector(rng, C * OC), b = RandomVector(rng, OC);
  auto dout = RandomVector(rng, N * OC);
  std::vector<double> out(N * OC), dinp(N * C), dw(C * OC), db(OC);
  MatmulForward(out.data(), inp.data(), w.data(), b.data(), N, C, OC);
  MatmulBackward(dinp.data(), dw.data(), db.data(), dout.data(), inp.data(), w.data(), N, C, OC);
  auto inp_f = testing::ToFloat(inp), w_f = testing::ToFloat(w), b_f = testing::ToFloat(b);
  auto dout_f = testing::ToFloat(dout);
  std::vector<float> out_f(N * OC), dinp_f(N * C), dw_f(C * OC), db_f(OC);
  MatmulForward(out_f.data(), inp_f.data(), w_f.data(), b_f.data(), N, C, OC);
  MatmulBackward(dinp_f.data(), dw_f.data(), db_f.data(), dout_f.data(), inp_f.data(), w_f.data(),
                 N, C, OC);
  testing::ExpectClose(out_f, out, 1e-5, "out");
  testing::ExpectClose(dinp_f, dinp, 1e-5, "dinp");
  testing::ExpectClose(dw_f, dw, 1e-5, "dweight");
  testing::ExpectClose(db_f, db, 1e-5, "dbias");
}

// Groups of 3, 0 and 2 rows: the empty expert is skipped and its gradients stay untouched.
TEST(GroupedMatmul, MatchesPerGroupDenseAndSkipsEmptyGroups) {
  std::mt19937_64 rng(43);
  constexpr int E = 3, C = 4, OC = 5;
  const std::vector<int64_t> offsets = {0, 3, 3, 5};
  const int S = 5;
  auto inp = RandomVector(rng, S * C), w = RandomVector(rng, E * C * OC),
       b = RandomVector(rng, E * OC);
  std::vector<double> out(S * OC, 99.0);
  GroupedMatmulForward(out.data(), inp.data(), w.data(), b.data(), offsets.data(), E, C, OC);
  for (int e = 0; e < E; ++e) {
    for (int64_t s = offsets[e]; s < offsets[e + 1]; ++s) {
      std::vector<double> row(inp.begin() + s * C, inp.begin() + (s + 1) * C);
      std::vector<double> we(w.begin() + e * C * OC, w.begin() + (e + 1) * C * OC);
      auto ref = NaiveMatmul(row, we, b.data() + e * OC, 1, C, OC);
      std::vector<double> got(out.begin() + s * OC, out.begin() + (s + 1) * OC);
      testing::ExpectClose(got, ref, 1e-13, "row");
    }
  }

  auto r = RandomVector(rng, S * OC);
  auto loss = [&] {
    GroupedMatmulForward(out.data(), inp.data(), w.data(), b.data(), offsets.data(), E, C, OC);
    return Dot(out, r);
  };
  GradBuffer dinp(rng, inp.size()), dw(rng, w.size()), db(rng, b.size());
  GroupedMatmulBackward(dinp.data(), dw.data(), db.data(), r.data(), inp.data(), w.data(),
                        offsets.data(), E, C, OC);
  testing::ExpectGradient("dinp", inp, dinp.Delta(), loss);
  testing::ExpectGradient("dweight", w, dw.Delta(), loss);
  testing::ExpectGradient("dbias", b, db.Delta(), loss);
  const auto dw_delta = dw.Delta();
  for (int i = C * OC; i < 2 * C * OC; ++i) EXPECT_EQ(dw_delta[i], 0.0);
}

TEST(GroupedMatmul, AllRowsInOneGroupAndNoRowsAtAll) {
  std::mt19937_64 rng(44);
  constexpr int E = 4, C = 3, OC = 2;
  auto w = RandomVector(rng, E * C * OC);
  std::vector<double> dw(E * C * OC, 0.0);
  const std::vector<int64_t> empty = {0, 0, 0, 0, 0};
  GroupedMatmulForward<double>(nullptr, nullptr, w.data(), nullptr, empty.data(), E, C, OC);
  GroupedMatmulBackward<double>(nullptr, dw.data(), nullptr, nullptr, nullptr, w.data(),
                                empty.data(), E, C, OC);
  for (double x : dw) EXPECT_EQ(x, 0.0);

  const std::vector<int64_t> one = {0, 0, 0, 6, 6};
  auto inp = RandomVector(rng, 6 * C);
  std::vector<double> out(6 * OC);
  GroupedMatmulForward<double>(out.data(), inp.data(), w.data(), nullptr, one.data(), E, C, OC);
  std::vector<double> w2(w.begin() + 2 * C * OC, w.begin() + 3 * C * OC);
  testing::ExpectClose(out, NaiveMatmul(inp, w2, nullptr, 6, C, OC), 1e-13);
}

}  // namespace
}  // namespace furnace::kernels::cpu
