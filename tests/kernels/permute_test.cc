#include "kernels/permute.h"

#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "grad_check.h"

namespace furnace::kernels::cpu {
namespace {
using testing::Dot;
using testing::GradBuffer;
using testing::RandomVector;

TEST(DispatchPlan, DroplessGroupsByExpertInTokenOrder) {
  // N = 4, k = 2, E = 3; expert 1 gets nothing.
  const std::vector<int32_t> idx = {2, 0, 0, 2, 2, 0, 0, 2};
  const DispatchPlan plan = MakeDispatchPlan(idx.data(), 4, 3, 2, 0.0);
  EXPECT_EQ(plan.capacity, 0);
  EXPECT_EQ(plan.routed, (std::vector<int64_t>{4, 0, 4}));
  EXPECT_EQ(plan.counts, (std::vector<int64_t>{4, 0, 4}));
  EXPECT_EQ(plan.offsets, (std::vector<int64_t>{0, 4, 4, 8}));
  EXPECT_EQ(plan.rows(), 8);
  // Expert 0 rows 0..3 in token order (tokens 0,1,2,3), expert 2 rows 4..7.
  EXPECT_EQ(plan.slot, (std::vector<int64_t>{4, 0, 1, 5, 6, 2, 3, 7}));
  EXPECT_EQ(plan.token, (std::vector<int32_t>{0, 1, 2, 3, 0, 1, 2, 3}));
}

TEST(DispatchPlan, CapacityIsCeilAndDropsInTokenOrder) {
  // cf = 1.0, k = 2, N = 5, E = 4: capacity = ceil(2.5) = 3.
  const std::vector<int32_t> idx = {0, 1, 1, 0, 0, 2, 1, 0, 0, 1};
  const DispatchPlan plan = MakeDispatchPlan(idx.data(), 5, 4, 2, 1.0);
  EXPECT_EQ(plan.capacity, 3);
  EXPECT_EQ(plan.routed, (std::vector<int64_t>{5, 4, 1, 0}));
  EXPECT_EQ(plan.counts, (std::vector<int64_t>{3, 3, 1, 0}));
  EXPECT_EQ(plan.offsets, (std::vector<int64_t>{0, 3, 6, 7, 7}));
  // Expert 0 keeps tokens 0, 1, 2 (choices 0, 3, 4); tokens 3 and 4 drop.
  // Expert 1 keeps tokens 0, 1, 3 (choices 1, 2, 6); token 4 drops.
  EXPECT_EQ(plan.slot, (std::vector<int64_t>{0, 3, 4, 1, 2, 6, 5, -1, -1, -1}));
  EXPECT_EQ(plan.token, (std::vector<int32_t>{0, 1, 2, 0, 1, 3, 2}));

  // A capacity factor that lands exactly on an integer is not bumped: 1.25 * 2 * 8 / 4 = 5.
  std::vector<int32_t> all0(16, 0);
  for (int n = 0; n < 8; ++n) all0[2 * n + 1] = 1;
  EXPECT_EQ(MakeDispatchPlan(all0.data(), 8, 4, 2, 1.25).capacity, 5);
}

TEST(DispatchPlan, EveryTokenToOneExpert) {
  constexpr int N = 7, E = 4;
  std::vector<int32_t> idx(N, 3);
  const DispatchPlan plan = MakeDispatchPlan(idx.data(), N, E, 1, 0.0);
  EXPECT_EQ(plan.counts, (std::vector<int64_t>{0, 0, 0, N}));
  for (int n = 0; n < N; ++n) EXPECT_EQ(plan.slot[n], n);
  // With capacity 2 (ceil(1.0 * 7 / 4)) only the first two survive.
  const DispatchPlan capped = MakeDispatchPlan(idx.data(), N, E, 1, 1.0);
  EXPECT_EQ(capped.capacity, 2);
  EXPECT_EQ(capped.rows(), 2);
  EXPECT_EQ(capped.slot, (std::vector<int64_t>{0, 1, -1, -1, -1, -1, -1}));
}

TEST(Permute, ForwardGathersAndBackwardScatters) {
  std::mt19937_64 rng(70);
  constexpr int N = 5, E = 4, k = 2, C = 3;
  const std::vector<int32_t> idx = {0, 1, 1, 0, 0, 2, 1, 0, 0, 1};
  const DispatchPlan plan = MakeDispatchPlan(idx.data(), N, E, k, 1.0);
  auto inp = RandomVector(rng, N * C);
  std::vector<double> out(plan.rows() * C);
  PermuteForward(out.data(), inp.data(), plan, C);
  for (int64_t s = 0; s < plan.rows(); ++s)
    for (int c = 0; c < C; ++c) EXPECT_EQ(out[s * C + c], inp[plan.token[s] * C + c]);

  auto r = RandomVector(rng, out.size());
  auto loss = [&] {
    PermuteForward(out.data(), inp.data(), plan, C);
    return Dot(out, r);
  };
  GradBuffer dinp(rng, inp.size());
  PermuteBackward(dinp.data(), r.data(), plan, C);
  testing::ExpectGradient("dinp", inp, dinp.Delta(), loss);
}

TEST(Unpermute, GradientMatchesFiniteDifferencesWithDrops) {
  std::mt19937_64 rng(71);
  constexpr int N = 5, E = 4, k = 2, C = 3;
  const std::vector<int32_t> idx = {0, 1, 1, 0, 0, 2, 1, 0, 0, 1};  // token 4 fully dropped
  const DispatchPlan plan = MakeDispatchPlan(idx.data(), N, E, k, 1.0);
  auto expert_out = RandomVector(rng, plan.rows() * C), gates = RandomVector(rng, N * k, 0, 1);
  auto r = RandomVector(rng, N * C);
  std::vector<double> out(N * C, 99.0);
  auto loss = [&] {
    UnpermuteForward(out.data(), expert_out.data(), gates.data(), plan, C);
    return Dot(out, r);
  };
  loss();
  for (int c = 0; c < C; ++c) EXPECT_EQ(out[4 * C + c], 0.0);  // all its choices dropped
  GradBuffer dexp(rng, expert_out.size()), dgates(rng, gates.size());
  UnpermuteBackward(dexp.data(), dgates.data(), r.data(), expert_out.data(), gates.data(), plan, C);
  testing::ExpectGradient("dexpert_out", expert_out, dexp.Delta(), loss);
  testing::ExpectGradient("dgates", gates, dgates.Delta(), loss);
  const auto dg = dgates.Delta();
  EXPECT_EQ(dg[7], 0.0);
  EXPECT_EQ(dg[8], 0.0);
  EXPECT_EQ(dg[9], 0.0);
}

TEST(Permute, FloatMatchesDouble) {
  std::mt19937_64 rng(72);
  constexpr int N = 6, E = 3, k = 2, C = 5;
  const std::vector<int32_t> idx = {0, 1, 1, 2, 2, 0, 0, 2, 1, 0, 2, 1};
  const DispatchPlan plan = MakeDispatchPlan(idx.data(), N, E, k, 0.0);
  auto expert_out = RandomVector(rng, plan.rows() * C), gates = RandomVector(rng, N * k, 0, 1);
  std::vector<double> out(N * C);
  UnpermuteForward(out.data(), expert_out.data(), gates.data(), plan, C);
  auto eo_f = testing::ToFloat(expert_out), g_f = testing::ToFloat(gates);
  std::vector<float> out_f(N * C);
  UnpermuteForward(out_f.data(), eo_f.data(), g_f.data(), plan, C);
  testing::ExpectClose(out_f, out);
}

}  // namespace
}  // namespace furnace::kernels::cpu
