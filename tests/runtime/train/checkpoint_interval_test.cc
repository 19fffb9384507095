// checkpoint.every auto: the Young/Daly interval as a pure function, the per-rank state that
// follows the measurements, and the ranks' agreement on its inputs.
#include "runtime/train/checkpoint_interval.h"

#include <gtest/gtest.h>

#include <cmath>
#include <thread>
#include <vector>

#include "runtime/comm/local_communicator.h"

namespace furnace::train {
namespace {

TEST(YoungDalyInterval, IsSqrtTwoStallTimesMtbfInSteps) {
  // C = 2 s, M = 1 h: sqrt(2 * 2 * 3600) = 120 s; 0.5 s steps -> 240 steps.
  IntervalChoice c =
      YoungDalyInterval({.stall_seconds = 2, .step_seconds = 0.5, .mtbf_seconds = 3600}, 100000);
  EXPECT_DOUBLE_EQ(c.seconds, 120.0);
  EXPECT_EQ(c.steps, 240);
  // Rounded to the nearest step: 120 s / 7 s = 17.1 -> 17.
  c = YoungDalyInterval({.stall_seconds = 2, .step_seconds = 7, .mtbf_seconds = 3600}, 100000);
  EXPECT_EQ(c.steps, 17);
  // At least one step, at most the run.
  c = YoungDalyInterval({.stall_seconds = 1e-6, .step_seconds = 10, .mtbf_seconds = 1}, 100);
  EXPECT_EQ(c.steps, 1);
  c = YoungDalyInterval({.stall_seconds = 10, .step_seconds = 0.01, .mtbf_seconds = 1e6}, 100);
  EXPECT_EQ(c.steps, 100);
  // Four times the MTBF doubles the interval.
  const IntervalChoice a =
      YoungDalyInterval({.stall_seconds = 1, .step_seconds = 1, .mtbf_seconds = 50}, 1000);
  const IntervalChoice b =
      YoungDalyInterval({.stall_seconds = 1, .step_seconds = 1, .mtbf_seconds = 200}, 1000);
  EXPECT_EQ(b.steps, 2 * a.steps);
}

TEST(YoungDalyInterval, NeedsEveryInput) {
  EXPECT_EQ(
      YoungDalyInterval({.stall_seconds = 0, .step_seconds = 1, .mtbf_seconds = 10}, 10).steps, 0);
  EXPECT_EQ(
      YoungDalyInterval({.stall_seconds = 1, .step_seconds = 0, .mtbf_seconds = 10}, 10).steps, 0);
  EXPECT_EQ(YoungDalyInterval({.stall_seconds = 1, .step_seconds = 1, .mtbf_seconds = 0}, 10).steps,
            0);
}

TEST(AutoCheckpointInterval, ProbesFirstThenFollowsTheMeasurements) {
  AutoCheckpointInterval interval({.mtbf_seconds = 100}, 10000);
  // Nothing measured: checkpoint after the first step to measure the stall.
  EXPECT_EQ(interval.current().steps, 1);
  EXPECT_TRUE(interval.Due(1));
  interval.ObserveStep(0.1);
  EXPECT_FALSE(interval.Update(interval.Local()));  // still no stall
  interval.ObserveStall(0.5);
  // sqrt(2 * 0.5 * 100) = 10 s = 100 steps of 0.1 s.
  EXPECT_TRUE(interval.Update(interval.Local()));
  EXPECT_EQ(interval.current().steps, 100);
  EXPECT_DOUBLE_EQ(interval.current().seconds, 10.0);
  EXPECT_FALSE(interval.Due(99));
  EXPECT_TRUE(interval.Due(100));
}

TEST(AutoCheckpointInterval, SmallChangesDoNotMoveTheInterval) {
  AutoCheckpointInterval interval({.stall_seconds = 0.5, .step_seconds = 0.1, .mtbf_seconds = 100},
                                  10000);
  EXPECT_EQ(interval.current().steps, 100);  // from the hint: no probe
  // 10% slower steps: 91 steps would do, within the hysteresis.
  EXPECT_FALSE(interval.Update({.stall_seconds = 0.5, .step_seconds = 0.11, .mtbf_seconds = 100}));
  EXPECT_EQ(interval.current().steps, 100);
  // Stalls four times longer: twice the interval.
  EXPECT_TRUE(interval.Update({.stall_seconds = 2, .step_seconds = 0.1, .mtbf_seconds = 100}));
  EXPECT_EQ(interval.current().steps, 200);
}

TEST(AutoCheckpointInterval, LocalInputsAreRecentMeansOrTheHint) {
  AutoCheckpointInterval interval({.stall_seconds = 3, .step_seconds = 2, .mtbf_seconds = 7}, 10);
  IntervalInputs in = interval.Local();
  EXPECT_DOUBLE_EQ(in.stall_seconds, 3);
  EXPECT_DOUBLE_EQ(in.step_seconds, 2);
  EXPECT_DOUBLE_EQ(in.mtbf_seconds, 7);
  interval.ObserveStep(1);
  interval.ObserveStep(3);
  interval.ObserveStall(0.5);
  in = interval.Local();
  EXPECT_DOUBLE_EQ(in.step_seconds, 2);
  EXPECT_DOUBLE_EQ(in.stall_seconds, 0.5);
}

TEST(AgreeIntervalInputs, EveryRankGetsTheLargestOfEachInput) {
  constexpr int kRanks = 3;
  comm::LocalGroup group(kRanks);
  std::vector<IntervalInputs> agreed(kRanks);
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r) {
    threads.emplace_back([&, r, member = group.Member(r)]() mutable {
      const IntervalInputs mine{
          .stall_seconds = 0.1 * (r + 1), .step_seconds = 1.0 - 0.1 * r, .mtbf_seconds = 50};
      auto out = AgreeIntervalInputs(member.get(), mine);
      ASSERT_TRUE(out.ok()) << out.status();
      agreed[r] = *out;
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_DOUBLE_EQ(agreed[r].stall_seconds, 0.3) << r;
    EXPECT_DOUBLE_EQ(agreed[r].step_seconds, 1.0) << r;
    EXPECT_DOUBLE_EQ(agreed[r].mtbf_seconds, 50) << r;
  }
  // One process: its own.
  auto alone = AgreeIntervalInputs(nullptr, {.stall_seconds = 1, .step_seconds = 2});
  ASSERT_TRUE(alone.ok());
  EXPECT_DOUBLE_EQ(alone->step_seconds, 2);
}

}  // namespace
}  // namespace furnace::train
