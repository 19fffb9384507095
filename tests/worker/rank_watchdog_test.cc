#include "worker/rank_watchdog.h"

#include <algorithm>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace furnace::worker {
namespace {

using ::testing::HasSubstr;
using Kind = furnace::v1::RankWatchdogRecord;

WatchdogTimeouts Timeouts() {
  WatchdogTimeouts t;
  t.startup_s = 38;  // start_timeout_s 30 + hang_timeout_s 8
  t.step_s = 8;
  t.checkpoint_s = 8;
  t.heartbeat_s = 1;
  return t;
}

class RankWatchdogTest : public ::testing::Test {
 protected:
  FakeClock clock_;
  comm::InFlightCollectives in_flight_{clock_};
  RankWatchdog watchdog_{Timeouts(), clock_, in_flight_};
};

TEST(WatchdogTimeoutsTest, DerivedFromTheRecoverySection) {
  furnace::v1::RecoverySpec recovery;
  recovery.set_hang_timeout_s(8);
  recovery.set_start_timeout_s(30);
  const WatchdogTimeouts t = WatchdogTimeoutsFor(recovery);
  EXPECT_DOUBLE_EQ(t.startup_s, 38);
  EXPECT_DOUBLE_EQ(t.step_s, 8);
  EXPECT_DOUBLE_EQ(t.checkpoint_s, 8);
  EXPECT_DOUBLE_EQ(t.heartbeat_s, 1);
  recovery.set_hang_timeout_s(2);
  EXPECT_DOUBLE_EQ(WatchdogTimeoutsFor(recovery).heartbeat_s, 0.5);
  // A task without a recovery section gets the spec's defaults (60 s each).
  EXPECT_DOUBLE_EQ(WatchdogTimeoutsFor(furnace::v1::RecoverySpec()).startup_s, 120);
  // The start-up's allowance for the data read before training: the dataset indexes at 100 MB/s
  // (the 2 GB index of 100M one-sequence documents gets 20 s more) and 10 ms for each scattered
  // fingerprint token (a dataset's 1,024: 10.24 s).
  EXPECT_DOUBLE_EQ(DataScanAllowanceS(uint64_t{2'000'000'000}, 0), 20);
  EXPECT_DOUBLE_EQ(DataScanAllowanceS(0, 1024), 10.24);
  EXPECT_DOUBLE_EQ(DataScanAllowanceS(0, 0), 0);
}

TEST_F(RankWatchdogTest, NothingBeforeAPhaseNorAfterDisarm) {
  EXPECT_EQ(watchdog_.Check().kind(), Kind::KIND_UNSPECIFIED);
  watchdog_.EnterStep(1);
  watchdog_.Disarm();
  clock_.Advance(100);
  EXPECT_EQ(watchdog_.Check().kind(), Kind::KIND_UNSPECIFIED);
}

TEST_F(RankWatchdogTest, AStepBlockedInACollectiveIsReportedOnceWithTheOpAndGroup) {
  watchdog_.EnterStep(12);
  clock_.Advance(0.5);
  const uint64_t token = in_flight_.Begin("all_reduce", "dp[0,1]", 2);
  clock_.Advance(7.5);  // exactly at the timeout: still a heartbeat
  furnace::v1::RankWatchdogRecord beat = watchdog_.Check();
  EXPECT_EQ(beat.kind(), Kind::KIND_HEARTBEAT);
  EXPECT_EQ(beat.phase(), "step");
  EXPECT_EQ(beat.step(), 12u);
  EXPECT_DOUBLE_EQ(beat.phase_s(), 8);
  EXPECT_DOUBLE_EQ(beat.timeout_s(), 8);
  EXPECT_EQ(beat.collective().op(), "all_reduce");
  EXPECT_DOUBLE_EQ(beat.collective().for_s(), 7.5);

  clock_.Advance(0.5);
  const furnace::v1::RankWatchdogRecord hung = watchdog_.Check();
  ASSERT_EQ(hung.kind(), Kind::KIND_HUNG);
  EXPECT_EQ(hung.reason(),
            "hung in step 12: all_reduce on group dp[0,1] (2 ranks) for 8.0 s; the step had run "
            "8.5 s, timeout 8 s (recovery.hang_timeout_s)");
  EXPECT_EQ(hung.collective().group(), "dp[0,1]");
  EXPECT_EQ(hung.collective().group_size(), 2u);
  EXPECT_EQ(hung.collectives_in_flight(), 1u);
  // Said once: the agent kills the rank on the first report.
  clock_.Advance(5);
  EXPECT_EQ(watchdog_.Check().kind(), Kind::KIND_UNSPECIFIED);
  in_flight_.End(token);
}

TEST_F(RankWatchdogTest, EachStepHasItsOwnClock) {
  for (uint64_t step = 1; step <= 5; ++step) {
    watchdog_.EnterStep(step);
    clock_.Advance(7);  // 35 s in all, each step within its 8 s
    EXPECT_EQ(watchdog_.Check().kind(), Kind::KIND_HEARTBEAT) << step;
  }
}

TEST_F(RankWatchdogTest, AHangOutsideACollectiveSaysSo) {
  watchdog_.EnterStep(3);
  clock_.Advance(9);
  const furnace::v1::RankWatchdogRecord hung = watchdog_.Check();
  ASSERT_EQ(hung.kind(), Kind::KIND_HUNG);
  EXPECT_FALSE(hung.has_collective());
  EXPECT_THAT(hung.reason(), HasSubstr("hung in step 3: not in a collective"));
}

// A checkpoint (every N steps or `every: auto`, which decides after the step) and an evaluation
// are phases of their own, each with its own clock, entered when they start (Trainer::Run's phase
// callback): the step before them does not eat into their time, nor they into the next step's.
TEST_F(RankWatchdogTest, ACheckpointIsAPhaseOfItsOwn) {
  watchdog_.EnterStep(20);
  clock_.Advance(7);
  watchdog_.EnterCheckpoint(20, /*final=*/false);
  clock_.Advance(7.5);
  EXPECT_EQ(watchdog_.Check().kind(), Kind::KIND_HEARTBEAT);
  const uint64_t token = in_flight_.Begin("all_gather", "world[0,1,2,3]", 4);
  clock_.Advance(1);
  const furnace::v1::RankWatchdogRecord hung = watchdog_.Check();
  ASSERT_EQ(hung.kind(), Kind::KIND_HUNG);
  EXPECT_EQ(hung.phase(), "checkpoint");
  EXPECT_EQ(hung.reason(),
            "hung in the checkpoint after step 20: all_gather on group world[0,1,2,3] (4 ranks) "
            "for 1.0 s; the checkpoint had run 8.5 s, timeout 8 s (recovery.hang_timeout_s)");
  in_flight_.End(token);
}

// The job's largest checkpoint shard of 2 GB is allowed 20 s more than hang_timeout_s to be written
// (each checkpoint) and read (the start-up, which the load ends), at 100 MB/s.
TEST_F(RankWatchdogTest, ACheckpointShardGetsTimeForItsBytes) {
  watchdog_.EnterStartup("model");
  clock_.Advance(30);
  watchdog_.AllowForCheckpointBytes(uint64_t{2'000'000'000});
  watchdog_.EnterStartup("checkpoint load");
  clock_.Advance(27);  // 57 s < 38 s + 20 s
  EXPECT_EQ(watchdog_.Check().kind(), Kind::KIND_HEARTBEAT);
  clock_.Advance(2);
  const furnace::v1::RankWatchdogRecord load = watchdog_.Check();
  ASSERT_EQ(load.kind(), Kind::KIND_HUNG);
  EXPECT_THAT(load.reason(),
              HasSubstr("timeout 58 s (recovery.start_timeout_s + recovery.hang_timeout_s + "
                        "20.0 s for the largest checkpoint shard (2.00 GB))"));

  RankWatchdog writing(Timeouts(), clock_, in_flight_);
  writing.AllowForCheckpointBytes(uint64_t{2'000'000'000});
  writing.EnterCheckpoint(40, /*final=*/false);
  clock_.Advance(27.5);  // 8 s + 20 s
  EXPECT_EQ(writing.Check().kind(), Kind::KIND_HEARTBEAT);
  clock_.Advance(1);
  const furnace::v1::RankWatchdogRecord write = writing.Check();
  ASSERT_EQ(write.kind(), Kind::KIND_HUNG);
  EXPECT_THAT(write.reason(),
              HasSubstr("timeout 28 s (recovery.hang_timeout_s + 20.0 s for the largest "
                        "checkpoint shard (2.00 GB))"));
  // Steps keep theirs.
  RankWatchdog stepping(Timeouts(), clock_, in_flight_);
  stepping.AllowForCheckpointBytes(uint64_t{2'000'000'000});
  stepping.EnterStep(41);
  clock_.Advance(8.5);
  EXPECT_EQ(stepping.Check().kind(), Kind::KIND_HUNG);
}

TEST_F(RankWatchdogTest, TheFinalCheckpointIsAPhaseOfItsOwn) {
  watchdog_.EnterCheckpoint(300, /*final=*/true);
  clock_.Advance(8.5);
  const furnace::v1::RankWatchdogRecord hung = watchdog_.Check();
  ASSERT_EQ(hung.kind(), Kind::KIND_HUNG);
  EXPECT_EQ(hung.phase(), "checkpoint");
  EXPECT_THAT(hung.reason(), HasSubstr("hung in the checkpoint after step 300 (the final one)"));
}

TEST_F(RankWatchdogTest, AnEvaluationGetsAStepsTimeForEachStepsWorthOfBatches) {
  WatchdogTimeouts t = WatchdogTimeoutsFor(furnace::v1::RecoverySpec());
  t.step_s = 8;
  // 100 batches over dp 4: 25 a rank, 2 micro-batches a step: 13 steps' worth.
  EXPECT_DOUBLE_EQ(EvalTimeoutS(t, 100, 4, 2), 8 * 13);
  EXPECT_DOUBLE_EQ(EvalTimeoutS(t, 1, 4, 2), 8);  // never less than a step
  t.eval_s = EvalTimeoutS(t, 100, 4, 2);
  RankWatchdog watchdog(t, clock_, in_flight_);
  watchdog.EnterStep(50);
  clock_.Advance(7);
  watchdog.EnterEval(50);
  clock_.Advance(100);
  EXPECT_EQ(watchdog.Check().kind(), Kind::KIND_HEARTBEAT);
  clock_.Advance(5);
  const furnace::v1::RankWatchdogRecord hung = watchdog.Check();
  ASSERT_EQ(hung.kind(), Kind::KIND_HUNG);
  EXPECT_EQ(hung.phase(), "evaluation");
  EXPECT_THAT(hung.reason(), HasSubstr("hung in the held-out evaluation after step 50: not in a "
                                       "collective"));
  EXPECT_THAT(hung.reason(), HasSubstr("timeout 104 s"));
}

// After its work a rank tears its groups down, which can block on a dead peer: watched, and the
// hang names how the work ended (the cause the rank was about to report).
TEST_F(RankWatchdogTest, FinishingIsWatchedAndAHangThereKeepsTheOutcome) {
  watchdog_.EnterStep(12);
  watchdog_.EnterFinishing("training failed at step 12: all_reduce: peer 1 closed");
  clock_.Advance(7);
  EXPECT_EQ(watchdog_.Check().kind(), Kind::KIND_HEARTBEAT);
  clock_.Advance(2);
  const furnace::v1::RankWatchdogRecord hung = watchdog_.Check();
  ASSERT_EQ(hung.kind(), Kind::KIND_HUNG);
  EXPECT_EQ(hung.phase(), "finishing");
  EXPECT_EQ(hung.step(), 12u);
  EXPECT_THAT(hung.reason(), HasSubstr("hung in finishing (after: training failed at step 12: "
                                       "all_reduce: peer 1 closed): not in a collective"));
}

// A stream-ordered collective its stream has not reached is queued behind this rank's own device
// work (a kernel that hangs): said so, and marked queued, so the agent and the controller blame
// this rank rather than take it for one of the peers waiting in the collective.
TEST_F(RankWatchdogTest, ACollectiveQueuedBehindTheRanksOwnDeviceWorkSaysSo) {
  watchdog_.EnterStep(5);
  const uint64_t token = in_flight_.Begin("all_reduce", "dp[0,1]", 2, -1, /*started=*/false);
  clock_.Advance(9);
  const furnace::v1::RankWatchdogRecord hung = watchdog_.Check();
  ASSERT_EQ(hung.kind(), Kind::KIND_HUNG);
  EXPECT_TRUE(hung.collective().queued());
  EXPECT_THAT(hung.reason(),
              HasSubstr("hung in step 5: all_reduce on group dp[0,1] (2 ranks) queued behind this "
                        "rank's own device work for 9.0 s (not started on its stream"));
  in_flight_.End(token);
  // Once its stream reaches it, it waits on its peers.
  RankWatchdog later(Timeouts(), clock_, in_flight_);
  later.EnterStep(6);
  const uint64_t waiting = in_flight_.Begin("all_reduce", "dp[0,1]", 2, -1, /*started=*/false);
  in_flight_.MarkStarted(waiting);
  clock_.Advance(9);
  const furnace::v1::RankWatchdogRecord peers = later.Check();
  ASSERT_EQ(peers.kind(), Kind::KIND_HUNG);
  EXPECT_FALSE(peers.collective().queued());
  EXPECT_THAT(peers.reason(),
              HasSubstr("hung in step 6: all_reduce on group dp[0,1] (2 ranks) for 9.0 s"));
  in_flight_.End(waiting);
}

TEST_F(RankWatchdogTest, StartUpKeepsOneClockAcrossItsParts) {
  watchdog_.EnterStartup("data");
  clock_.Advance(20);
  watchdog_.EnterStartup("rendezvous");
  const uint64_t token = in_flight_.Begin("recv", "pp[0,2]", 2, /*peer=*/1);
  clock_.Advance(17);
  const furnace::v1::RankWatchdogRecord beat = watchdog_.Check();
  EXPECT_EQ(beat.kind(), Kind::KIND_HEARTBEAT);
  EXPECT_EQ(beat.phase(), "start-up");
  EXPECT_EQ(beat.detail(), "rendezvous");
  clock_.Advance(2);  // 39 s > 38 s
  const furnace::v1::RankWatchdogRecord hung = watchdog_.Check();
  ASSERT_EQ(hung.kind(), Kind::KIND_HUNG);
  EXPECT_THAT(hung.reason(),
              HasSubstr("hung in start-up (rendezvous): recv on group pp[0,2] (2 ranks, peer 1) "
                        "for 19.0 s"));
  EXPECT_THAT(hung.reason(), HasSubstr("recovery.start_timeout_s + recovery.hang_timeout_s"));
  in_flight_.End(token);
}

TEST_F(RankWatchdogTest, TheOldestCollectiveInFlightIsNamed) {
  watchdog_.EnterStep(7);
  const uint64_t a2a = in_flight_.Begin("all_to_all", "ep[0,1,2,3]", 4);
  clock_.Advance(1);
  const uint64_t gather = in_flight_.Begin("all_gather", "esp[0,1]", 2);  // the fused exchange
  clock_.Advance(8);
  const furnace::v1::RankWatchdogRecord hung = watchdog_.Check();
  ASSERT_EQ(hung.kind(), Kind::KIND_HUNG);
  EXPECT_THAT(hung.reason(), HasSubstr("all_to_all on group ep[0,1,2,3] (4 ranks) for 9.0 s "
                                       "(1 more in flight)"));
  in_flight_.End(gather);
  in_flight_.End(a2a);
  EXPECT_EQ(in_flight_.count(), 0u);
}

TEST_F(RankWatchdogTest, TheThreadEmitsHeartbeatsThenTheHang) {
  WatchdogTimeouts fast = Timeouts();
  fast.heartbeat_s = 0.01;
  RankWatchdog watchdog(fast, clock_, in_flight_);
  watchdog.EnterStep(1);
  std::mutex mu;
  std::condition_variable cv;
  std::vector<furnace::v1::RankWatchdogRecord> seen;
  {
    const WatchdogThread thread(watchdog, [&](const furnace::v1::RankWatchdogRecord& r) {
      std::lock_guard<std::mutex> lock(mu);
      seen.push_back(r);
      cv.notify_all();
    });
    std::unique_lock<std::mutex> lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(10), [&] { return !seen.empty(); }));
    clock_.Advance(9);
    ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(10),
                            [&] { return seen.back().kind() == Kind::KIND_HUNG; }));
  }
  EXPECT_EQ(seen.front().kind(), Kind::KIND_HEARTBEAT);
  EXPECT_EQ(std::count_if(seen.begin(), seen.end(),
                          [](const auto& r) { return r.kind() == Kind::KIND_HUNG; }),
            1);
}

}  // namespace
}  // namespace furnace::worker
