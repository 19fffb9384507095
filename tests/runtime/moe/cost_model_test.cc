// The cost model: the fit against exact points, the bytes of every op against the file comment's
// formulas (forward and backward), the choice in both directions (a slow tp link favours s1, a slow
// ep link under fast tp and esp links favours s2, tp = 1 gives deepspeed), and the profile's JSON.
#include "runtime/moe/cost_model.h"

#include <cmath>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/permute.h"

namespace furnace::moe {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

// 256 tokens of d 64, 8 experts of width 128, top-2, dropless; tp 2 x ep 2 x esp 2.
LayerShape Shape() {
  return LayerShape{.N = 256,
                    .C = 64,
                    .f = 128,
                    .E = 8,
                    .k = 2,
                    .capacity_factor = 0,
                    .tp = 2,
                    .ep = 2,
                    .esp = 2};
}

TEST(FitAlphaBetaTest, RecoversExactLine) {
  const double alpha = 3e-5, beta = 2.5e-10;
  std::vector<std::pair<double, double>> points;
  for (double x : {1e3, 1e4, 1e5, 1e6, 1e7}) points.emplace_back(x, alpha + beta * x);
  const AlphaBeta fit = FitAlphaBeta(points);
  EXPECT_NEAR(fit.alpha, alpha, 1e-12);
  EXPECT_NEAR(fit.beta, beta, 1e-18);
  EXPECT_DOUBLE_EQ(fit.r2, 1.0);
  EXPECT_EQ(fit.points, 5);
}

TEST(FitAlphaBetaTest, NegativeInterceptIsClampedAndRefittedThroughOrigin) {
  // y = 2x - 1 on x = 1, 2, 3: the free fit has alpha -1.
  const AlphaBeta fit = FitAlphaBeta({{1, 1}, {2, 3}, {3, 5}});
  EXPECT_EQ(fit.alpha, 0);
  EXPECT_NEAR(fit.beta, (1 + 6 + 15) / 14.0, 1e-12);  // sum xy / sum xx
  EXPECT_LT(fit.r2, 1.0);
}

TEST(FitAlphaBetaTest, TimesFallingWithSizeFitAFlatCost) {
  // Latency-bound points whose noise tilts the line down (20, 19, 19.5 us): no negative slope,
  // which would price the largest transfers at nothing.
  const AlphaBeta fit = FitAlphaBeta({{16384, 20e-6}, {131072, 19e-6}, {1048576, 19.5e-6}});
  EXPECT_EQ(fit.beta, 0);
  EXPECT_NEAR(fit.alpha, 19.5e-6, 1e-12);
  EXPECT_GT(fit.Seconds(1e9), 0);
}

TEST(FitAlphaBetaTest, DegenerateInputs) {
  EXPECT_EQ(FitAlphaBeta({}).points, 0);
  const AlphaBeta one = FitAlphaBeta({{4, 2}});
  EXPECT_EQ(one.alpha, 0);
  EXPECT_DOUBLE_EQ(one.beta, 0.5);
  EXPECT_DOUBLE_EQ(one.r2, 1.0);
}

TEST(CostModelTest, RoutedRowsWithCapacity) {
  LayerShape s = Shape();
  s.N = 100;
  EXPECT_EQ(RoutedRows(s), 200);  // dropless: N * k
  s.capacity_factor = 0.5;
  EXPECT_EQ(RoutedRows(s), 8 * 13);  // E * ceil(0.5 * 200 / 8)
  s.capacity_factor = 2.0;
  EXPECT_EQ(RoutedRows(s), 200);  // capped at N * k
}

// The routed rows use the dispatch plan's own capacity, rounding included: cf 0.65, k 3, 120
// tokens, E 2 is 118 per expert for the plan (0.65 * 3 * 120 / 2 in double is just above 117), so
// 236 rows, not 234.
TEST(CostModelTest, RoutedRowsUseTheDispatchPlansCapacity) {
  for (const double cf : {0.5, 0.65, 0.8, 1.25, 1.3}) {
    for (const int k : {1, 2, 3}) {
      for (const int E : {2, 4, 8}) {
        for (const int N : {40, 120, 200, 240}) {
          const std::vector<int32_t> indices(static_cast<size_t>(N) * k, 0);
          const kernels::cpu::DispatchPlan plan =
              kernels::cpu::MakeDispatchPlan(indices.data(), N, E, k, cf);
          LayerShape s{.N = N, .C = 8, .f = 8, .E = E, .k = k, .capacity_factor = cf};
          EXPECT_EQ(RoutedRows(s), std::min<int64_t>(int64_t{N} * k, plan.capacity * E))
              << "cf " << cf << " k " << k << " N " << N << " E " << E;
        }
      }
    }
  }
  LayerShape s{.N = 120, .C = 8, .f = 8, .E = 2, .k = 3, .capacity_factor = 0.65};
  EXPECT_EQ(RoutedRows(s), 236);
}

TEST(CostModelTest, RowsPerSchedule) {
  const LayerShape s = Shape();
  const ScheduleRows ds = RowsOf(s, Schedule::kDeepspeed);
  EXPECT_EQ(ds.gate_tokens, 256);
  EXPECT_EQ(ds.S, 512);
  EXPECT_EQ(ds.R, 1024);
  const ScheduleRows s1 = RowsOf(s, Schedule::kS1);
  EXPECT_EQ(s1.gate_tokens, 128);
  EXPECT_EQ(s1.order_rows, 256);
  EXPECT_EQ(s1.S, 256);
  const ScheduleRows s2 = RowsOf(s, Schedule::kS2);
  EXPECT_EQ(s2.gate_tokens, 256);
  EXPECT_EQ(s2.order_rows, 512);
  EXPECT_EQ(s2.S, 256);
  EXPECT_EQ(s2.R, 512);
}

TEST(CostModelTest, AllToAllBytesOfS1AndS2AreDeepspeedsOverTp) {
  const LayerShape s = Shape();
  const Op a2a{OpKind::kAllToAll, OpGroup::kEp};
  const int64_t ds = OpBytes(a2a, Direction::kForward, s, Schedule::kDeepspeed).ep;
  EXPECT_EQ(ds, 512 * 64 * 4);
  EXPECT_EQ(OpBytes(a2a, Direction::kForward, s, Schedule::kS1).ep, ds / s.tp);
  EXPECT_EQ(OpBytes(a2a, Direction::kBackward, s, Schedule::kS1).ep, ds / s.tp);
  // s2's a2a is inside its fused ops: the ep part is the same share.
  const Op fused{OpKind::kFused, OpGroup::kEp, OpGroup::kEsp};
  EXPECT_EQ(OpBytes(fused, Direction::kForward, s, Schedule::kS2).ep, ds / s.tp);
  // Whole directions: two a2a per direction (and the counts in forward).
  const int64_t counts = 8 * 8;
  for (Schedule sch : {Schedule::kS1, Schedule::kS2}) {
    EXPECT_EQ(ScheduleBytes(Direction::kForward, s, sch).ep - counts,
              (ScheduleBytes(Direction::kForward, s, Schedule::kDeepspeed).ep - counts) / s.tp)
        << ScheduleName(sch);
    EXPECT_EQ(ScheduleBytes(Direction::kBackward, s, sch).ep,
              ScheduleBytes(Direction::kBackward, s, Schedule::kDeepspeed).ep / s.tp)
        << ScheduleName(sch);
  }
}

TEST(CostModelTest, BytesPerGroupForwardAndBackward) {
  const LayerShape s = Shape();
  const int64_t row = 64 * 4, counts = 8 * 8;
  // deepspeed: S = A = 512, R = 1024.
  EXPECT_EQ(
      ScheduleBytes(Direction::kForward, s, Schedule::kDeepspeed),
      (GroupBytes{.tp = 0, .ep = 2 * 512 * row + counts, .esp = (512 + 1024) * row + counts}));
  EXPECT_EQ(ScheduleBytes(Direction::kBackward, s, Schedule::kDeepspeed),
            (GroupBytes{.tp = 0, .ep = 2 * 512 * row, .esp = (512 + 1024) * row}));
  // s1: S = A = 256, R = 512; the mp_all_gather (forward) and its adjoint's all-gather (backward,
  // the mp_split's) move N/tp rows; the forward's gate also gathers 2 E doubles of statistics.
  const int64_t gate_stats = 2 * s.E * 8;
  EXPECT_EQ(ScheduleBytes(Direction::kForward, s, Schedule::kS1),
            (GroupBytes{.tp = 128 * row + gate_stats,
                        .ep = 2 * 256 * row + counts,
                        .esp = (256 + 512) * row + counts}));
  EXPECT_EQ(ScheduleBytes(Direction::kBackward, s, Schedule::kS1),
            (GroupBytes{.tp = 128 * row, .ep = 2 * 256 * row, .esp = (256 + 512) * row}));
  // s2: the tp all-gather moves S_all/tp rows; backward's comes from the row_split's adjoint. The
  // forward's counts also gather each tp peer's (ep rank, routing hash): 16 bytes.
  EXPECT_EQ(
      ScheduleBytes(Direction::kForward, s, Schedule::kS2),
      (GroupBytes{
          .tp = 256 * row + 16, .ep = 2 * 256 * row + counts, .esp = (256 + 512) * row + counts}));
  EXPECT_EQ(ScheduleBytes(Direction::kBackward, s, Schedule::kS2),
            (GroupBytes{.tp = 256 * row, .ep = 2 * 256 * row, .esp = (256 + 512) * row}));
  // Op by op in backward: mp_split is free, its adjoint all-gathers.
  EXPECT_EQ(OpBytes(Op{OpKind::kMpSplit}, Direction::kBackward, s, Schedule::kS1).total(), 0);
  EXPECT_EQ(OpBytes(Op{OpKind::kRowSplit}, Direction::kBackward, s, Schedule::kS2).total(), 0);
}

// Sliced experts (deepspeed with the ESP group as the TP group): each shard computes the rows it
// received (R = A), the partial products are all-reduced (R rows on esp, forward and backward),
// nothing is gathered, and the ESP peers' counts are not exchanged. s1 and s2 do not change.
TEST(CostModelTest, SlicedExpertsAllReduceTheRowsTheyReceived) {
  LayerShape s = Shape();
  s.esp_is_tp = true;
  const int64_t row = 64 * 4, counts = 8 * 8;
  EXPECT_EQ(RowsOf(s, Schedule::kDeepspeed).R, 512);
  for (Direction dir : {Direction::kForward, Direction::kBackward}) {
    EXPECT_EQ(ScheduleBytes(dir, s, Schedule::kDeepspeed),
              (GroupBytes{.tp = 0,
                          .ep = 2 * 512 * row + (dir == Direction::kForward ? counts : 0),
                          .esp = 512 * row}));
  }
  LayerShape gathered = Shape();
  for (Schedule sch : {Schedule::kS1, Schedule::kS2}) {
    EXPECT_EQ(ScheduleBytes(Direction::kForward, s, sch),
              ScheduleBytes(Direction::kForward, gathered, sch));
  }
  // The all-reduce: a reduce-scatter of its bytes and an all-gather of 1 / esp of them; the
  // expert's GEMMs on R = A rows, half the gathered form's.
  const CostProfile p = DefaultProfile(true, false, true);
  const Prediction pred = Predict(p, s, Schedule::kDeepspeed);
  EXPECT_TRUE(pred.sliced);
  ASSERT_EQ(pred.forward_ops.size(), ForwardOps(Schedule::kDeepspeed, true).size());
  const OpCost& copy = pred.forward_ops[4];
  const OpCost& expert = pred.forward_ops[5];
  const OpCost& ar = pred.forward_ops[6];
  ASSERT_EQ(copy.op.kind, OpKind::kEspCopy);
  ASSERT_EQ(expert.op.kind, OpKind::kExpert);
  ASSERT_EQ(ar.op.kind, OpKind::kEspAllReduce);
  EXPECT_EQ(copy.seconds, 0);
  EXPECT_DOUBLE_EQ(ar.seconds,
                   p.at(CollectiveKind::kReduceScatter, OpGroup::kEsp).Seconds(512 * row) +
                       p.at(CollectiveKind::kAllGather, OpGroup::kEsp).Seconds(512 * row / 2));
  EXPECT_DOUBLE_EQ(expert.seconds, 2.0 * p.gemm.Seconds(2.0 * 512 * 64 * 64));
  EXPECT_LT(pred.total_s(), Predict(p, gathered, Schedule::kDeepspeed).total_s());
}

TEST(CostModelTest, GroupsOfOneMoveNothing) {
  LayerShape s = Shape();
  s.esp = 1;
  s.tp = 1;
  for (Schedule sch : kAllSchedules) {
    const GroupBytes b = ScheduleBytes(Direction::kForward, s, sch);
    EXPECT_EQ(b.tp, 0);
    EXPECT_EQ(b.esp, 0);
    EXPECT_GT(b.ep, 0);
  }
}

TEST(CostModelTest, PredictionSumsItsOps) {
  const CostProfile p = DefaultProfile(true, false, true);
  const Prediction pred = Predict(p, Shape(), Schedule::kS2);
  EXPECT_EQ(pred.forward_ops.size(), ForwardOps(Schedule::kS2).size());
  EXPECT_EQ(pred.backward_ops.size(), BackwardOps(Schedule::kS2).size());
  double fwd = 0, bwd = 0;
  for (const OpCost& c : pred.forward_ops) fwd += c.seconds;
  for (const OpCost& c : pred.backward_ops) bwd += c.seconds;
  EXPECT_DOUBLE_EQ(pred.forward_s, fwd);
  EXPECT_DOUBLE_EQ(pred.backward_s, bwd);
  EXPECT_GT(pred.backward_s, 0);
  // The fused op: max of its parts plus ep start-ups.
  const LayerShape s = Shape();
  const OpCost& fused = pred.forward_ops[4];
  ASSERT_EQ(fused.op.kind, OpKind::kFused);
  const double t_a2a = p.at(CollectiveKind::kAllToAll, OpGroup::kEp).Seconds(256 * 64 * 4);
  const double t_ag = p.at(CollectiveKind::kAllGather, OpGroup::kEsp).Seconds(256 * 64 * 4);
  EXPECT_DOUBLE_EQ(fused.seconds, std::max(t_a2a, t_ag) +
                                      s.ep * p.at(CollectiveKind::kAllToAll, OpGroup::kEp).alpha);
}

// A fused op of which one group is a single rank runs the other collective alone (executor.cc):
// priced as that collective, without the pipelined exchange's start-ups.
TEST(CostModelTest, AFusedOpWithAGroupOfOneIsTheOtherCollective) {
  const CostProfile p = DefaultProfile(true, false, true);
  LayerShape s = Shape();
  s.esp = 1;  // forward: the all-to-all alone
  const Prediction no_esp = Predict(p, s, Schedule::kS2);
  const OpCost& forward = no_esp.forward_ops[4];
  ASSERT_EQ(forward.op.kind, OpKind::kFused);
  EXPECT_DOUBLE_EQ(forward.seconds,
                   p.at(CollectiveKind::kAllToAll, OpGroup::kEp).Seconds(256 * 64 * 4));
  // Nothing of the esp link's cost is in it; with ep = 1, nothing of the ep link's.
  CostProfile slow_esp = p;
  slow_esp.at(CollectiveKind::kAllGather, OpGroup::kEsp).alpha *= 100;
  EXPECT_DOUBLE_EQ(Predict(slow_esp, s, Schedule::kS2).forward_ops[4].seconds, forward.seconds);
  s = Shape();
  s.ep = 1;
  CostProfile slow_ep = p;
  slow_ep.at(CollectiveKind::kAllToAll, OpGroup::kEp).alpha *= 100;
  const Prediction no_ep = Predict(p, s, Schedule::kS2);
  const Prediction no_ep_slow = Predict(slow_ep, s, Schedule::kS2);
  int fused = 0;
  for (size_t i = 0; i < no_ep.backward_ops.size(); ++i) {
    if (no_ep.backward_ops[i].op.kind != OpKind::kFused) continue;
    ++fused;
    EXPECT_DOUBLE_EQ(no_ep_slow.backward_ops[i].seconds, no_ep.backward_ops[i].seconds);
  }
  EXPECT_GT(fused, 0);
}

// Fast compute and copies, so the links decide.
CostProfile LinkProfile(double tp_beta, double ep_beta, double esp_beta) {
  CostProfile p = DefaultProfile(true, true, true);
  p.gemm = AlphaBeta{.alpha = 1e-7, .beta = 1e-16};
  p.copy = AlphaBeta{.alpha = 1e-7, .beta = 1e-14};
  const double betas[3] = {tp_beta, ep_beta, esp_beta};
  for (int g = 0; g < 3; ++g) {
    for (CollectiveKind k : kAllCollectiveKinds) {
      p.at(k, kCommGroups[g]) = AlphaBeta{.alpha = 1e-6, .beta = betas[g]};
    }
  }
  return p;
}

TEST(ChooseScheduleTest, SlowTpLinkPicksS1) {
  // s2's tp all-gather moves k times the rows of s1's (S_all/tp vs N/tp): on a slow tp link s1
  // wins even though s2 overlaps it; slow local copies (order and inverse on S_all rows in
  // deepspeed and s2, S_all/tp in s1) keep deepspeed, which uses no tp link, behind.
  CostProfile p = LinkProfile(/*tp=*/3e-9, /*ep=*/1e-9, /*esp=*/1e-11);
  p.copy.beta = 4e-10;
  const Choice c = ChooseSchedule(p, Shape());
  EXPECT_EQ(c.schedule, Schedule::kS1) << c.reason;
  EXPECT_THAT(c.reason, StartsWith("s1: "));
  ASSERT_EQ(c.all.size(), 3u);
  EXPECT_LT(c.all[1].total_s() * 1.2, c.all[2].total_s());
  EXPECT_LT(c.all[1].total_s() * 1.2, c.all[0].total_s());
}

// s1 where its tokens do not split over tp: the cheapest of the others, and the reason says why
// (the runtime and `furnace plan` both choose through here).
TEST(ChooseScheduleTest, TokensThatDoNotSplitOverTpTakeTheNextCheapest) {
  CostProfile p = LinkProfile(/*tp=*/3e-9, /*ep=*/1e-9, /*esp=*/1e-11);
  p.copy.beta = 4e-10;
  LayerShape s = Shape();
  s.N = 255;
  const Choice c = ChooseSchedule(p, s);
  const Schedule next =
      c.all[0].total_s() <= c.all[2].total_s() ? Schedule::kDeepspeed : Schedule::kS2;
  EXPECT_EQ(c.schedule, next) << c.reason;
  EXPECT_THAT(c.reason, HasSubstr("s1 would be cheaper but 255 tokens do not split over tp = 2"));
}

TEST(ChooseScheduleTest, SlowEpLinkWithFastTpAndEspPicksS2) {
  // The all-to-all dominates: s2 hides the esp and tp all-gathers under it, s1 pays them after.
  const CostProfile p = LinkProfile(/*tp=*/1e-11, /*ep=*/1e-8, /*esp=*/1e-8);
  const Choice c = ChooseSchedule(p, Shape());
  EXPECT_EQ(c.schedule, Schedule::kS2) << c.reason;
  EXPECT_THAT(c.reason, StartsWith("s2: "));
  EXPECT_THAT(c.reason, HasSubstr("fwd+bwd vs s1 "));  // the others, fastest first
  EXPECT_THAT(c.reason, HasSubstr(", deepspeed "));
  EXPECT_LT(c.all[2].total_s() * 1.1, c.all[1].total_s());
}

// A Parm schedule predicted less than kParmMargin faster than deepspeed leaves deepspeed running,
// and the reason says by how much it would have gained; past the margin it runs.
TEST(ChooseScheduleTest, AGainUnderTheMarginKeepsDeepspeed) {
  CostProfile p = LinkProfile(/*tp=*/3e-9, /*ep=*/1e-9, /*esp=*/1e-11);
  p.copy.beta = 4e-10;
  const Choice fast = ChooseSchedule(p, Shape());
  ASSERT_EQ(fast.schedule, Schedule::kS1) << fast.reason;
  const double gain = 1 - fast.all[1].total_s() / fast.all[0].total_s();
  ASSERT_GT(gain, kParmMargin);
  // Slower GEMMs add the same expert time to every schedule (the same rows per shard here, R),
  // shrinking s1's relative gain below the margin.
  CostProfile slow_gemm = p;
  double extra = 0;
  for (int i = 0; i < 60 && gain > 0; ++i) {
    slow_gemm.gemm.alpha += 1e-4;
    const Choice c = ChooseSchedule(slow_gemm, Shape());
    const double g = 1 - c.all[1].total_s() / c.all[0].total_s();
    if (g > 0 && g < kParmMargin) {
      EXPECT_EQ(c.schedule, Schedule::kDeepspeed) << c.reason;
      EXPECT_THAT(c.reason, StartsWith("deepspeed: s1 is predicted only "));
      EXPECT_THAT(c.reason, HasSubstr("under the 10% a Parm schedule must gain; s1: "));
      extra = slow_gemm.gemm.alpha;
      break;
    }
  }
  EXPECT_GT(extra, 0) << "no profile put s1's gain under the margin";
}

TEST(ChooseScheduleTest, TpOneIsDeepspeed) {
  LayerShape s = Shape();
  s.tp = 1;
  const Choice c = ChooseSchedule(DefaultProfile(true, false, true), s);
  EXPECT_EQ(c.schedule, Schedule::kDeepspeed);
  EXPECT_EQ(c.reason, "tp = 1: nothing to pause");
  EXPECT_EQ(c.all.size(), 3u);
}

TEST(ChooseScheduleTest, DeepspeedWinsTies) {
  // Free everything: every schedule costs 0.
  CostProfile p;
  const Choice c = ChooseSchedule(p, Shape());
  EXPECT_EQ(c.schedule, Schedule::kDeepspeed) << c.reason;
}

TEST(CostProfileTest, JsonRoundTrip) {
  CostProfile p = DefaultProfile(true, false, true);
  p.at(CollectiveKind::kAllToAll, OpGroup::kEp) =
      AlphaBeta{.alpha = 1.0 / 3.0, .beta = 2.0 / 7.0, .r2 = 0.9987, .points = 3};
  p.seconds_spent = 0.125;
  p.source = "fitted on tp 2 x ep 2 x esp 1 (world 4)";
  absl::StatusOr<CostProfile> back = CostProfile::FromJson(p.ToJson());
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->ToJson(), p.ToJson());
  EXPECT_EQ(back->source, p.source);
  EXPECT_EQ(back->seconds_spent, p.seconds_spent);
  const AlphaBeta& ab = back->at(CollectiveKind::kAllToAll, OpGroup::kEp);
  EXPECT_EQ(ab.alpha, 1.0 / 3.0);
  EXPECT_EQ(ab.beta, 2.0 / 7.0);
  EXPECT_EQ(ab.points, 3);
  EXPECT_EQ(back->gemm.beta, p.gemm.beta);
}

TEST(CostProfileTest, BadJsonIsInvalidArgument) {
  EXPECT_TRUE(absl::IsInvalidArgument(CostProfile::FromJson("{").status()));
  const absl::Status missing = CostProfile::FromJson(R"({"source": "x"})").status();
  EXPECT_TRUE(absl::IsInvalidArgument(missing));
  EXPECT_THAT(missing.message(), HasSubstr("gemm"));
}

}  // namespace
}  // namespace furnace::moe
