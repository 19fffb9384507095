// The goodput accounting as a pure function: attempts and aggregated steps in, seconds by cause
// out (controller/store/goodput.h has the rules).
#include "controller/store/goodput.h"

#include <gtest/gtest.h>

#include <vector>

namespace furnace::controller {
namespace {

namespace v1 = furnace::v1;

constexpr double kT0 = 1'700'000'000.0;

v1::AttemptInfo Attempt(uint32_t n, double started, double ended, v1::AttemptState state,
                        const std::string& kind = "") {
  v1::AttemptInfo a;
  a.set_attempt(n);
  a.set_started_unix(started);
  a.set_ended_unix(ended);
  a.set_state(state);
  a.set_failure_kind(kind);
  return a;
}

// A step whose record arrived at `reported` (after its checkpoint stall, as ranks report).
v1::StepRecord Step(uint32_t attempt, uint64_t step, double reported, double seconds,
                    double stall = 0) {
  v1::StepRecord r;
  r.set_attempt(attempt);
  r.set_step(step);
  r.set_unix_time(reported);
  r.set_step_seconds(seconds);
  r.set_checkpoint_stall_seconds(stall);
  return r;
}

// `n` steps of attempt `attempt` from step `first`, each `seconds` long and back to back from
// `start`; a checkpoint with `stall` after every step that is a multiple of `every`.
std::vector<v1::StepRecord> Steps(uint32_t attempt, uint64_t first, int n, double start,
                                  double seconds, uint64_t every = 0, double stall = 0) {
  std::vector<v1::StepRecord> out;
  double t = start;
  for (int i = 0; i < n; ++i) {
    const uint64_t step = first + i;
    const double s = every > 0 && step % every == 0 ? stall : 0;
    t += seconds + s;
    out.push_back(Step(attempt, step, t, seconds, s));
  }
  return out;
}

TEST(Goodput, OneAttemptWithoutFailureLosesOnlyStartUpAndStalls) {
  // Placed at t0, first step starts 3 s later; 10 steps of 0.5 s, a 0.25 s stall every 5.
  const auto steps = Steps(1, 1, 10, kT0 + 3, 0.5, 5, 0.25);
  const std::vector<v1::AttemptInfo> attempts = {
      Attempt(1, kT0, kT0 + 20, v1::ATTEMPT_STATE_SUCCEEDED)};
  const v1::JobGoodput g = ComputeGoodput(attempts, steps, false, kT0 + 20);
  EXPECT_DOUBLE_EQ(g.productive_seconds(), 5.0);
  EXPECT_EQ(g.productive_steps(), 10u);
  EXPECT_DOUBLE_EQ(g.startup_seconds(), 3.0);
  EXPECT_DOUBLE_EQ(g.checkpoint_stall_seconds(), 0.5);
  EXPECT_DOUBLE_EQ(g.restart_seconds(), 0);
  EXPECT_DOUBLE_EQ(g.redone_seconds(), 0);
  EXPECT_EQ(g.redone_steps(), 0u);
  EXPECT_DOUBLE_EQ(g.ratio(), 5.0 / (5.0 + 3.0 + 0.5));
  EXPECT_EQ(g.failures(), 0u);
  EXPECT_TRUE(g.mtbf_from_prior());
  EXPECT_DOUBLE_EQ(g.mtbf_seconds(), kMtbfPriorSeconds);
  EXPECT_DOUBLE_EQ(g.recovering_seconds(), 0);
}

TEST(Goodput, AFailureCostsTheRestartAndTheStepsRedoneSinceTheCheckpoint) {
  // Attempt 1: steps 1..8 from t0 + 2, 1 s each, checkpoint (0.5 s stall) after step 5; a rank
  // dies during step 9 and the attempt ends 4 s after step 8 was reported.
  std::vector<v1::StepRecord> steps = Steps(1, 1, 8, kT0 + 2, 1.0, 5, 0.5);
  const double last_reported = steps.back().unix_time();  // t0 + 10.5
  // Attempt 2 resumes from step 5: its first step (6) starts 7 s after step 8 was reported.
  const double resumed = last_reported + 7;
  for (const auto& s : Steps(2, 6, 7, resumed, 1.0, 5, 0.5)) steps.push_back(s);  // steps 6..12
  const std::vector<v1::AttemptInfo> attempts = {
      Attempt(1, kT0, last_reported + 4, v1::ATTEMPT_STATE_FAILED, "signal"),
      Attempt(2, last_reported + 5, resumed + 20, v1::ATTEMPT_STATE_SUCCEEDED)};
  const v1::JobGoodput g = ComputeGoodput(attempts, steps, false, resumed + 20);
  EXPECT_DOUBLE_EQ(g.startup_seconds(), 2.0);
  EXPECT_DOUBLE_EQ(g.restart_seconds(), 7.0);
  // Steps 6, 7, 8 computed twice: the redo is lost, each step counts once as productive.
  EXPECT_EQ(g.redone_steps(), 3u);
  EXPECT_DOUBLE_EQ(g.redone_seconds(), 3.0);
  EXPECT_EQ(g.productive_steps(), 12u);
  EXPECT_DOUBLE_EQ(g.productive_seconds(), 12.0);
  // Checkpoints after step 5 (attempt 1) and step 10 (attempt 2).
  EXPECT_DOUBLE_EQ(g.checkpoint_stall_seconds(), 1.0);
  EXPECT_DOUBLE_EQ(g.ratio(), 12.0 / (12.0 + 2.0 + 7.0 + 3.0 + 1.0));
  EXPECT_EQ(g.failures(), 1u);
  EXPECT_FALSE(g.mtbf_from_prior());
  // Running time: attempt 1 (14.5 s) + attempt 2 (19 s), one failure.
  EXPECT_DOUBLE_EQ(g.mtbf_seconds(),
                   (last_reported + 4 - kT0) + (resumed + 20 - last_reported - 5));
}

TEST(Goodput, TotalsNeverGoDownAsStepsArrive) {
  std::vector<v1::StepRecord> steps = Steps(1, 1, 6, kT0 + 1, 0.5, 3, 0.1);
  for (const auto& s : Steps(2, 4, 6, steps.back().unix_time() + 5, 0.5, 3, 0.1))
    steps.push_back(s);
  for (const auto& s : Steps(3, 1, 4, steps.back().unix_time() + 5, 0.5)) steps.push_back(s);
  const std::vector<v1::AttemptInfo> attempts = {Attempt(1, kT0, 0, v1::ATTEMPT_STATE_FAILED),
                                                 Attempt(2, kT0, 0, v1::ATTEMPT_STATE_FAILED),
                                                 Attempt(3, kT0, 0, v1::ATTEMPT_STATE_RUNNING)};
  GoodputLedger ledger;
  v1::JobGoodput before;
  for (const auto& s : steps) {
    ledger.AddStep(s);
    const v1::JobGoodput g = ledger.Report(attempts, true, s.unix_time());
    EXPECT_GE(g.productive_seconds(), before.productive_seconds());
    EXPECT_GE(g.restart_seconds(), before.restart_seconds());
    EXPECT_GE(g.redone_seconds(), before.redone_seconds());
    EXPECT_GE(g.checkpoint_stall_seconds(), before.checkpoint_stall_seconds());
    EXPECT_GE(g.startup_seconds(), before.startup_seconds());
    before = g;
  }
  // Attempt 3 went back to the start (every checkpoint lost): all of its 4 steps are redone.
  EXPECT_EQ(before.redone_steps(), 3u + 4u);
  EXPECT_EQ(before.productive_steps(), 9u);
}

TEST(Goodput, AStepOutOfOrderIsIgnored) {
  GoodputLedger ledger;
  ledger.AddStep(Step(2, 5, kT0 + 10, 1.0));
  ledger.AddStep(Step(1, 9, kT0 + 11, 1.0));  // a straggler of an older attempt
  ledger.AddStep(Step(2, 5, kT0 + 12, 1.0));  // the same step again
  const v1::JobGoodput g =
      ledger.Report({Attempt(1, kT0, 0, v1::ATTEMPT_STATE_RUNNING)}, true, kT0 + 12);
  EXPECT_EQ(g.productive_steps(), 1u);
  EXPECT_EQ(g.redone_steps(), 0u);
}

TEST(Goodput, AnOpenRecoveryIsReportedApartFromTheTotals) {
  const auto steps = Steps(1, 1, 4, kT0 + 2, 1.0);  // last reported at t0 + 6
  std::vector<v1::AttemptInfo> attempts = {Attempt(1, kT0, kT0 + 8, v1::ATTEMPT_STATE_FAILED),
                                           Attempt(2, kT0 + 9, 0, v1::ATTEMPT_STATE_RUNNING)};
  v1::JobGoodput g = ComputeGoodput(attempts, steps, true, kT0 + 15);
  EXPECT_DOUBLE_EQ(g.recovering_seconds(), 9.0);
  EXPECT_DOUBLE_EQ(g.restart_seconds(), 0);
  // A job that ended is not recovering.
  g = ComputeGoodput(attempts, steps, false, kT0 + 15);
  EXPECT_DOUBLE_EQ(g.recovering_seconds(), 0);
  // Before the first step, the open interval is the start-up.
  g = ComputeGoodput({Attempt(1, kT0, 0, v1::ATTEMPT_STATE_RUNNING)}, {}, true, kT0 + 4);
  EXPECT_DOUBLE_EQ(g.recovering_seconds(), 4.0);
  EXPECT_DOUBLE_EQ(g.ratio(), 0);
}

TEST(Goodput, MtbfIsTheRunningTimeOverFailuresOrThePrior) {
  // No failure yet: the prior, or the time run when that is longer.
  MtbfEstimate e = EstimateMtbf({Attempt(1, kT0, 0, v1::ATTEMPT_STATE_RUNNING)}, kT0 + 100);
  EXPECT_TRUE(e.from_prior);
  EXPECT_DOUBLE_EQ(e.seconds, kMtbfPriorSeconds);
  e = EstimateMtbf({Attempt(1, kT0, 0, v1::ATTEMPT_STATE_RUNNING)}, kT0 + 2 * kMtbfPriorSeconds);
  EXPECT_DOUBLE_EQ(e.seconds, 2 * kMtbfPriorSeconds);
  // Two failures in 30 + 50 s of running (the 20 s of backoff in between do not count); an
  // interruption and an invalid input are not failures of the machines.
  e = EstimateMtbf({Attempt(1, kT0, kT0 + 30, v1::ATTEMPT_STATE_FAILED, "signal"),
                    Attempt(2, kT0 + 50, kT0 + 60, v1::ATTEMPT_STATE_INTERRUPTED),
                    Attempt(3, kT0 + 60, kT0 + 100, v1::ATTEMPT_STATE_FAILED, "hang"),
                    Attempt(4, kT0 + 100, 0, v1::ATTEMPT_STATE_RUNNING)},
                   kT0 + 100);
  EXPECT_FALSE(e.from_prior);
  EXPECT_EQ(e.failures, 2u);
  EXPECT_DOUBLE_EQ(e.seconds, 40.0);
  e = EstimateMtbf({Attempt(1, kT0, kT0 + 30, v1::ATTEMPT_STATE_FAILED, "bad_input")}, kT0 + 30);
  EXPECT_TRUE(e.from_prior);
  // Nor is the end at the job's time limit.
  e = EstimateMtbf({Attempt(1, kT0, kT0 + 30, v1::ATTEMPT_STATE_FAILED, "time_limit")}, kT0 + 30);
  EXPECT_TRUE(e.from_prior);
}

TEST(Goodput, AJobWithoutFailuresAssumesTheClustersRatePerRank) {
  // Another job: 4 ranks, two machine failures in 100 + 50 s (a bad input does not count).
  auto ranks = [](v1::AttemptInfo a, int n) {
    for (int r = 0; r < n; ++r) a.add_ranks();
    return a;
  };
  ClusterFailureRate cluster;
  EXPECT_DOUBLE_EQ(cluster.MtbfSeconds(4), 0.0);
  cluster.Add({ranks(Attempt(1, kT0, kT0 + 100, v1::ATTEMPT_STATE_FAILED, "signal"), 4),
               ranks(Attempt(2, kT0 + 100, kT0 + 150, v1::ATTEMPT_STATE_FAILED, "hang"), 4),
               ranks(Attempt(3, kT0 + 150, kT0 + 160, v1::ATTEMPT_STATE_FAILED, "bad_input"), 4)},
              kT0 + 160);
  EXPECT_EQ(cluster.failures, 2u);
  EXPECT_DOUBLE_EQ(cluster.rank_seconds, 4 * 160.0);
  // 320 rank-seconds per failure: a 4-rank job fails every 80 s, a 1-rank one every 320 s.
  EXPECT_DOUBLE_EQ(cluster.MtbfSeconds(4), 80.0);
  MtbfEstimate e =
      EstimateMtbf({Attempt(1, kT0 + 200, 0, v1::ATTEMPT_STATE_RUNNING)}, kT0 + 210, cluster, 1);
  EXPECT_TRUE(e.from_prior);
  EXPECT_EQ(e.basis, "cluster");
  EXPECT_DOUBLE_EQ(e.seconds, 320.0);
  // Its own failures, once it has some, are what counts.
  e = EstimateMtbf({Attempt(1, kT0 + 200, kT0 + 230, v1::ATTEMPT_STATE_FAILED, "signal")},
                   kT0 + 230, cluster, 1);
  EXPECT_EQ(e.basis, "observed");
  EXPECT_DOUBLE_EQ(e.seconds, 30.0);
  // No failure anywhere: the prior.
  e = EstimateMtbf({}, kT0, ClusterFailureRate{}, 1);
  EXPECT_EQ(e.basis, "prior");
  EXPECT_DOUBLE_EQ(e.seconds, kMtbfPriorSeconds);
  const v1::CheckpointHint hint = MakeCheckpointHint({}, GoodputLedger{}, kT0, cluster, 2);
  EXPECT_EQ(hint.mtbf_basis(), "cluster");
  EXPECT_DOUBLE_EQ(hint.mtbf_seconds(), 160.0);
}

TEST(Goodput, TheCheckpointHintCarriesTheMeasuredStallAndStepTime) {
  GoodputLedger ledger;
  for (const auto& s : Steps(1, 1, 10, kT0 + 1, 0.5, 4, 0.2)) ledger.AddStep(s);
  const v1::CheckpointHint hint =
      MakeCheckpointHint({Attempt(1, kT0, kT0 + 20, v1::ATTEMPT_STATE_FAILED, "signal"),
                          Attempt(2, kT0 + 25, 0, v1::ATTEMPT_STATE_RUNNING)},
                         ledger, kT0 + 25);
  EXPECT_DOUBLE_EQ(hint.mtbf_seconds(), 20.0);
  EXPECT_FALSE(hint.mtbf_from_prior());
  EXPECT_EQ(hint.failures(), 1u);
  EXPECT_DOUBLE_EQ(hint.stall_seconds(), 0.2);
  EXPECT_DOUBLE_EQ(hint.step_seconds(), 0.5);
}

}  // namespace
}  // namespace furnace::controller
