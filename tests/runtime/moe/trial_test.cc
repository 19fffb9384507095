// moe.schedule auto's trial (runtime/moe/trial.h) with layer runs whose times the test sets: which
// schedules are tried, that a run's time is the slowest rank's and a schedule's the median of the
// rounds, that every rank picks the same, that deepspeed stays unless a Parm schedule is measured
// 5% faster, how the outcome is said and cached, and that a run's error ends the trial.
#include "runtime/moe/trial.h"

#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/comm/local_communicator.h"

namespace furnace::moe {
namespace {

using ::testing::HasSubstr;

// A choice whose predictions (fwd+bwd, as forward seconds) are `ds`, `s1`, `s2`.
Choice Predicted(double ds, double s1, double s2) {
  Choice c;
  const double t[] = {ds, s1, s2};
  for (Schedule s : kAllSchedules) {
    Prediction p;
    p.schedule = s;
    p.forward_s = t[static_cast<int>(s)];
    c.all.push_back(p);
  }
  c.schedule = Schedule::kDeepspeed;
  c.reason = "predicted";
  return c;
}

LayerShape Shape(int tp, int64_t N = 64) {
  return {.N = N, .C = 16, .f = 32, .E = 4, .k = 2, .tp = tp, .ep = 2, .esp = 1};
}

TEST(TrialCandidatesTest, DeepspeedAndTheSchedulesPredictedWithinTheWindow) {
  const auto names = [](const std::vector<Schedule>& v) {
    std::vector<std::string> out;
    for (Schedule s : v) out.push_back(ScheduleName(s));
    return out;
  };
  // s1 best at 1.0: s2 at 1.4 is within 1.5x, deepspeed always tried.
  EXPECT_EQ(names(TrialCandidates(Predicted(3.0, 1.0, 1.4), Shape(2))),
            (std::vector<std::string>{"deepspeed", "s1", "s2"}));
  // s2 at 1.6 is not.
  EXPECT_EQ(names(TrialCandidates(Predicted(3.0, 1.0, 1.6), Shape(2))),
            (std::vector<std::string>{"deepspeed", "s1"}));
  // Deepspeed predicted best, the others far behind: nothing to try.
  EXPECT_EQ(names(TrialCandidates(Predicted(1.0, 2.0, 2.0), Shape(2))),
            (std::vector<std::string>{"deepspeed"}));
  // s1 only where the tokens split over tp (63 over 2 do not): the best allowed is deepspeed.
  EXPECT_EQ(names(TrialCandidates(Predicted(1.0, 0.1, 1.2), Shape(2, 63))),
            (std::vector<std::string>{"deepspeed", "s2"}));
  // tp 1: every schedule is deepspeed's computation.
  EXPECT_EQ(names(TrialCandidates(Predicted(1.0, 1.0, 1.0), Shape(1))),
            (std::vector<std::string>{"deepspeed"}));
  // A wider window.
  EXPECT_EQ(names(TrialCandidates(Predicted(3.0, 1.0, 2.5), Shape(2), {.window = 3})),
            (std::vector<std::string>{"deepspeed", "s1", "s2"}));
}

// Runs MeasureSchedules on `world` threads as ranks; rank r's run of schedule s takes
// times[r][s] per call, in order (the last repeated). Counts each rank's calls per schedule.
struct Trial {
  std::vector<absl::StatusOr<Choice>> out;
  std::vector<std::map<Schedule, int>> calls;
};
Trial RunTrial(int world, const Choice& predicted, const LayerShape& shape,
               const std::vector<std::map<Schedule, std::vector<double>>>& times,
               const TrialOptions& options = {.max_reps = 3}) {
  comm::LocalGroup group(world, {.name = "world"});
  std::vector<std::unique_ptr<comm::Communicator>> members;
  for (int r = 0; r < world; ++r) members.push_back(group.Member(r));
  Trial t;
  t.out.assign(world, absl::UnknownError("not run"));
  t.calls.assign(world, {});
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      const LayerRun run = [&, r](Schedule s) -> absl::StatusOr<double> {
        const std::vector<double>& v = times[r].at(s);
        const int i = t.calls[r][s]++;
        const double seconds = v[std::min<size_t>(i, v.size() - 1)];
        if (seconds < 0) return absl::ResourceExhaustedError("out of memory");
        return seconds;
      };
      t.out[r] = MeasureSchedules(predicted, shape, members[r].get(), run, options);
    });
  }
  for (std::thread& th : threads) th.join();
  return t;
}

TEST(MeasureSchedulesTest, TheFastestAsMeasuredOnTheSlowestRankWinsOnEveryRank) {
  // The model prefers s1, but rank 1 runs s1 slowly: the slowest rank's time decides, so s2
  // (predicted within the window) wins. Each candidate runs once untimed, then 3 timed rounds.
  std::vector<std::map<Schedule, std::vector<double>>> times(2);
  times[0] = {
      {Schedule::kDeepspeed, {9, 0.010}}, {Schedule::kS1, {9, 0.005}}, {Schedule::kS2, {9, 0.008}}};
  times[1] = {
      {Schedule::kDeepspeed, {9, 0.009}}, {Schedule::kS1, {9, 0.012}}, {Schedule::kS2, {9, 0.007}}};
  const Trial t = RunTrial(2, Predicted(3e-3, 1e-3, 1.2e-3), Shape(2), times);
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(t.out[r].ok()) << t.out[r].status();
    EXPECT_EQ(t.out[r]->schedule, Schedule::kS2) << "rank " << r;
    EXPECT_EQ(t.out[r]->reason, t.out[0]->reason);
    EXPECT_EQ(t.out[r]->measured_s, (std::vector<double>{0.010, 0.012, 0.008}));
    for (Schedule s : kAllSchedules) EXPECT_EQ(t.calls[r].at(s), 4) << ScheduleName(s);
  }
  EXPECT_EQ(t.out[0]->reason,
            "s2: measured 8 ms fwd+bwd vs deepspeed 10 ms, s1 12 ms (slowest rank, median of 3; "
            "predicted deepspeed 3 ms, s1 1 ms, s2 1.2 ms)");
  EXPECT_EQ(t.out[0]->all.size(), 3u);  // the predictions kept
}

TEST(MeasureSchedulesTest, AScheduleNotTriedIsSaidAndTheMedianOfTheRoundsCounts) {
  // s2 outside the window: not run. s1's rounds 0.004, 0.02 (an outlier), 0.005: median 0.005.
  std::vector<std::map<Schedule, std::vector<double>>> times(1);
  times[0] = {{Schedule::kDeepspeed, {1, 0.010, 0.011, 0.009}},
              {Schedule::kS1, {1, 0.004, 0.020, 0.005}}};
  const Trial t = RunTrial(1, Predicted(3e-3, 1e-3, 9e-3), Shape(2), times);
  ASSERT_TRUE(t.out[0].ok()) << t.out[0].status();
  EXPECT_EQ(t.out[0]->schedule, Schedule::kS1);
  EXPECT_EQ(t.out[0]->measured_s, (std::vector<double>{0.010, 0.005, 0.0}));
  EXPECT_EQ(t.calls[0].count(Schedule::kS2), 0u);
  EXPECT_THAT(t.out[0]->reason, HasSubstr("s2 9 ms not tried"));
}

TEST(MeasureSchedulesTest, DeepspeedStaysUnlessAParmScheduleIsFivePercentFaster) {
  std::vector<std::map<Schedule, std::vector<double>>> times(1);
  times[0] = {{Schedule::kDeepspeed, {0.0100}}, {Schedule::kS1, {0.0097}}};
  Trial t = RunTrial(1, Predicted(3e-3, 1e-3, 9e-3), Shape(2), times);
  ASSERT_TRUE(t.out[0].ok()) << t.out[0].status();
  EXPECT_EQ(t.out[0]->schedule, Schedule::kDeepspeed);
  EXPECT_THAT(t.out[0]->reason, HasSubstr("deepspeed: s1 measured only 3% faster (9.7 ms vs 10 ms "
                                          "fwd+bwd), under the 5% a Parm schedule must gain"));
  // 6% faster: taken.
  times[0][Schedule::kS1] = {0.0094};
  t = RunTrial(1, Predicted(3e-3, 1e-3, 9e-3), Shape(2), times);
  ASSERT_TRUE(t.out[0].ok()) << t.out[0].status();
  EXPECT_EQ(t.out[0]->schedule, Schedule::kS1);
  // Measured slower than deepspeed although predicted 3x faster: deepspeed, as measured.
  times[0][Schedule::kS1] = {0.0200};
  t = RunTrial(1, Predicted(3e-3, 1e-3, 9e-3), Shape(2), times);
  ASSERT_TRUE(t.out[0].ok()) << t.out[0].status();
  EXPECT_EQ(t.out[0]->schedule, Schedule::kDeepspeed);
  EXPECT_THAT(t.out[0]->reason, HasSubstr("deepspeed: measured 10 ms fwd+bwd vs s1 20 ms"));
}

// Between Parm schedules, a difference within the margin goes to the model's order; a larger one
// to the measurement.
TEST(MeasureSchedulesTest, BetweenParmSchedulesTheModelsOrderBreaksTiesWithinTheMargin) {
  std::vector<std::map<Schedule, std::vector<double>>> times(1);
  times[0] = {
      {Schedule::kDeepspeed, {0.030}}, {Schedule::kS1, {0.0088}}, {Schedule::kS2, {0.0085}}};
  // s1 predicted faster; s2 measured 3% faster than s1: s1.
  Trial t = RunTrial(1, Predicted(3e-3, 1e-3, 1.2e-3), Shape(2), times);
  ASSERT_TRUE(t.out[0].ok()) << t.out[0].status();
  EXPECT_EQ(t.out[0]->schedule, Schedule::kS1);
  EXPECT_EQ(t.out[0]->reason,
            "s1: measured 8.8 ms fwd+bwd vs deepspeed 30 ms, s2 8.5 ms; s2 measured only 3% "
            "faster, under the 5% it must gain over one predicted faster (slowest rank, median of "
            "3; predicted deepspeed 3 ms, s1 1 ms, s2 1.2 ms)");
  // s2 predicted faster: s2, and s1 is no faster.
  t = RunTrial(1, Predicted(3e-3, 1.2e-3, 1e-3), Shape(2), times);
  ASSERT_TRUE(t.out[0].ok()) << t.out[0].status();
  EXPECT_EQ(t.out[0]->schedule, Schedule::kS2);
  // s2 measured 10% faster than s1, predicted slower: s2.
  times[0][Schedule::kS2] = {0.0079};
  t = RunTrial(1, Predicted(3e-3, 1e-3, 1.2e-3), Shape(2), times);
  ASSERT_TRUE(t.out[0].ok()) << t.out[0].status();
  EXPECT_EQ(t.out[0]->schedule, Schedule::kS2);
}

// At least `reps` rounds, more while the rounds so far took under `seconds`, at most `max_reps`:
// every rank runs as many (the sum is of the all-gathered maxima).
TEST(MeasureSchedulesTest, SmallLayersRunMoreRoundsUpToTheCap) {
  const auto rounds_for = [](double seconds_per_run) {
    std::vector<std::map<Schedule, std::vector<double>>> times(2);
    for (auto& rank : times) {
      rank = {{Schedule::kDeepspeed, {seconds_per_run}}, {Schedule::kS1, {seconds_per_run}}};
    }
    // Rank 1 slower: the rounds' time is its.
    times[1][Schedule::kS1] = {2 * seconds_per_run};
    const Trial t = RunTrial(2, Predicted(3e-3, 1e-3, 9e-3), Shape(2), times, TrialOptions{});
    EXPECT_TRUE(t.out[0].ok()) << t.out[0].status();
    EXPECT_EQ(t.calls[0].at(Schedule::kDeepspeed), t.calls[1].at(Schedule::kDeepspeed));
    return t.calls[0].at(Schedule::kDeepspeed) - 1;  // less the warm-up
  };
  EXPECT_EQ(rounds_for(1e-3), 11);  // 3 ms a round: the cap
  EXPECT_EQ(rounds_for(0.5), 3);    // 1.5 s a round: the least
  EXPECT_EQ(rounds_for(0.1), 4);    // 0.3 s a round: 1.2 s after 4
}

TEST(MeasureSchedulesTest, NothingToTryRunsNothing) {
  std::vector<std::map<Schedule, std::vector<double>>> times(2);
  const Choice predicted = Predicted(1e-3, 5e-3, 5e-3);
  const Trial t = RunTrial(2, predicted, Shape(2), times);
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(t.out[r].ok()) << t.out[r].status();
    EXPECT_EQ(t.out[r]->reason, "predicted");
    EXPECT_TRUE(t.out[r]->measured_s.empty());
    EXPECT_TRUE(t.calls[r].empty());
  }
}

TEST(MeasureSchedulesTest, ARunsErrorEndsTheTrialNamingTheSchedule) {
  std::vector<std::map<Schedule, std::vector<double>>> times(1);
  times[0] = {{Schedule::kDeepspeed, {0.01}}, {Schedule::kS1, {-1}}};
  const Trial t = RunTrial(1, Predicted(3e-3, 1e-3, 9e-3), Shape(2), times);
  ASSERT_FALSE(t.out[0].ok());
  EXPECT_TRUE(absl::IsResourceExhausted(t.out[0].status())) << t.out[0].status();
  EXPECT_THAT(t.out[0].status().message(),
              HasSubstr("moe.schedule auto: the trial of s1: out of memory"));
}

// One rank's run fails (before the layer's collectives): every rank returns, the failing one with
// its error, the others saying which rank failed (none waits in the next collective).
TEST(MeasureSchedulesTest, ARanksFailureEndsTheTrialOnEveryRank) {
  std::vector<std::map<Schedule, std::vector<double>>> times(3);
  for (auto& rank : times) rank = {{Schedule::kDeepspeed, {0.01}}, {Schedule::kS1, {0.01}}};
  times[1][Schedule::kS1] = {0.01, 0.01, -1};  // its third run of s1 (the second timed round)
  const Trial t = RunTrial(3, Predicted(3e-3, 1e-3, 9e-3), Shape(2), times);
  ASSERT_FALSE(t.out[1].ok());
  EXPECT_TRUE(absl::IsResourceExhausted(t.out[1].status())) << t.out[1].status();
  for (int r : {0, 2}) {
    ASSERT_FALSE(t.out[r].ok()) << "rank " << r;
    EXPECT_TRUE(absl::IsAborted(t.out[r].status())) << t.out[r].status();
    EXPECT_THAT(t.out[r].status().message(),
                HasSubstr("moe.schedule auto: the trial of s1 failed on rank 1"));
    EXPECT_EQ(t.calls[r].at(Schedule::kS1), 3) << "rank " << r;
  }
}

TEST(TrialJsonTest, TheOutcomeRoundTripsExactlyAndMalformedTextIsRefused) {
  Choice measured = Predicted(3e-3, 1e-3, 9e-3);
  measured.schedule = Schedule::kS1;
  measured.reason = "s1: measured";
  measured.measured_s = {0.1 / 3, 0.0123456789012345, 0};
  const absl::StatusOr<Choice> back =
      TrialFromJson(Predicted(3e-3, 1e-3, 9e-3), TrialToJson(measured));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->schedule, Schedule::kS1);
  EXPECT_EQ(back->reason, "s1: measured");
  EXPECT_EQ(back->measured_s, measured.measured_s);
  EXPECT_EQ(back->all.size(), 3u);
  for (const char* bad :
       {"", "[]", "{\"schedule\": \"s1\"}",
        "{\"schedule\": \"s3\", \"reason\": \"\", \"measured_s\": [1, 2, 3]}",
        "{\"schedule\": \"s1\", \"reason\": \"\", \"measured_s\": [1, 2]}",
        "{\"schedule\": \"s1\", \"reason\": \"\", \"measured_s\": [1, 2, \"x\"]}"}) {
    const absl::StatusOr<Choice> c = TrialFromJson(measured, bad);
    EXPECT_TRUE(absl::IsInvalidArgument(c.status())) << bad << ": " << c.status();
  }
}

}  // namespace
}  // namespace furnace::moe
