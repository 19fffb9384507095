// The whole MoE layer from the CPU ops, checked end to end by finite differences: router GEMM ->
// softmax -> top-k gates (+ aux loss) -> dispatch plan -> permute -> grouped GEMM -> GELU ->
// grouped GEMM -> unpermute with the gates. Run dropless and with capacity dropping; expert 3 is
// pushed out of every top-k by a constant logit offset, so the grouped GEMMs see an empty group.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <vector>

#include "grad_check.h"
#include "kernels/gelu.h"
#include "kernels/matmul.h"
#include "kernels/permute.h"
#include "kernels/router.h"

namespace furnace::kernels::cpu {
namespace {
using testing::Dot;
using testing::GradBuffer;
using testing::RandomVector;

constexpr int N = 8, C = 4, E = 4, k = 2, F = 6;
constexpr double kAlpha = 0.05;

struct Moe {
  explicit Moe(std::mt19937_64& rng)
      : x(RandomVector(rng, N * C)),
        wg(RandomVector(rng, C * E)),
        w1(RandomVector(rng, E * C * F)),
        b1(RandomVector(rng, E * F)),
        w2(RandomVector(rng, E * F * C)),
        b2(RandomVector(rng, E * C)),
        r(RandomVector(rng, N * C)) {}

  double Forward() {
    MatmulForward(logits.data(), x.data(), wg.data(), kLogitOffset.data(), N, C, E);
    SoftmaxForward(probs.data(), logits.data(), N, E);
    TopKForward(idx.data(), gates.data(), probs.data(), N, E, k, true);
    plan = MakeDispatchPlan(idx.data(), N, E, k, capacity_factor);
    const int64_t S = plan.rows();
    perm.resize(S * C);
    h.resize(S * F);
    a.resize(S * F);
    y.resize(S * C);
    PermuteForward(perm.data(), x.data(), plan, C);
    GroupedMatmulForward(h.data(), perm.data(), w1.data(), b1.data(), plan.offsets.data(), E, C, F);
    GeluForward(a.data(), h.data(), S * F);
    GroupedMatmulForward(y.data(), a.data(), w2.data(), b2.data(), plan.offsets.data(), E, F, C);
    UnpermuteForward(out.data(), y.data(), gates.data(), plan, C);
    return Dot(out, r) + AuxLossForward(probs.data(), idx.data(), N, E, k, kAlpha);
  }

  // Accumulates into the given gradient buffers (after a Forward()).
  void Backward(double* dx, double* dwg, double* dw1, double* db1, double* dw2, double* db2) {
    const int64_t S = plan.rows();
    std::vector<double> dy(S * C, 0.0), dgates(N * k, 0.0), da(S * F, 0.0), dh(S * F, 0.0),
        dperm(S * C, 0.0), dprobs(N * E, 0.0), dlogits(N * E, 0.0);
    UnpermuteBackward(dy.data(), dgates.data(), r.data(), y.data(), gates.data(), plan, C);
    GroupedMatmulBackward(da.data(), dw2, db2, dy.data(), a.data(), w2.data(), plan.offsets.data(),
                          E, F, C);
    GeluBackward(dh.data(), h.data(), da.data(), S * F);
    GroupedMatmulBackward(dperm.data(), dw1, db1, dh.data(), perm.data(), w1.data(),
                          plan.offsets.data(), E, C, F);
    PermuteBackward(dx, dperm.data(), plan, C);
    TopKBackward(dprobs.data(), dgates.data(), probs.data(), idx.data(), N, E, k, true);
    AuxLossBackward(dprobs.data(), idx.data(), N, E, k, kAlpha, 1.0);
    SoftmaxBackward(dlogits.data(), dprobs.data(), probs.data(), N, E);
    MatmulBackward(dx, dwg, static_cast<double*>(nullptr), dlogits.data(), x.data(), wg.data(), N,
                   C, E);
  }

  const std::vector<double> kLogitOffset = {0.0, 0.0, 0.0, -20.0};
  double capacity_factor = 0.0;
  std::vector<double> x, wg, w1, b1, w2, b2, r;
  std::vector<double> logits = std::vector<double>(N * E), probs = std::vector<double>(N * E),
                      gates = std::vector<double>(N * k), out = std::vector<double>(N * C);
  std::vector<int32_t> idx = std::vector<int32_t>(N * k);
  std::vector<double> perm, h, a, y;
  DispatchPlan plan;
};

void CheckMoeGradient(double capacity_factor, uint64_t seed) {
  std::mt19937_64 rng(seed);
  Moe moe(rng);
  moe.capacity_factor = capacity_factor;
  moe.Forward();
  EXPECT_EQ(moe.plan.counts[3], 0) << "expert 3 should receive no tokens";
  if (capacity_factor > 0) {
    EXPECT_EQ(moe.plan.capacity, 4);
    EXPECT_TRUE(std::count(moe.plan.slot.begin(), moe.plan.slot.end(), -1) > 0)
        << "expected capacity drops";
  }
  GradBuffer dx(rng, moe.x.size()), dwg(rng, moe.wg.size()), dw1(rng, moe.w1.size()),
      db1(rng, moe.b1.size()), dw2(rng, moe.w2.size()), db2(rng, moe.b2.size());
  moe.Backward(dx.data(), dwg.data(), dw1.data(), db1.data(), dw2.data(), db2.data());
  auto loss = [&] { return moe.Forward(); };
  testing::ExpectGradient("dx", moe.x, dx.Delta(), loss);
  testing::ExpectGradient("drouter", moe.wg, dwg.Delta(), loss);
  testing::ExpectGradient("dw1", moe.w1, dw1.Delta(), loss);
  testing::ExpectGradient("db1", moe.b1, db1.Delta(), loss);
  testing::ExpectGradient("dw2", moe.w2, dw2.Delta(), loss);
  testing::ExpectGradient("db2", moe.b2, db2.Delta(), loss);
}

TEST(Moe, DroplessGradientMatchesFiniteDifferences) { CheckMoeGradient(0.0, 80); }
TEST(Moe, CapacityDroppingGradientMatchesFiniteDifferences) { CheckMoeGradient(1.0, 81); }

}  // namespace
}  // namespace furnace::kernels::cpu
