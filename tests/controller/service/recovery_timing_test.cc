// Recovery timing (controller/service/recovery_phases.h, recovery_timing.cc) and the heartbeat's
// view of a worker's ranks, through the Controller with a fake clock and no sockets.
#include <algorithm>
#include <filesystem>

#include "controller/service/controller.h"
#include "controller/service/recovery_phases.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/controller/service/controller_on_temp_dir.h"

namespace furnace::controller {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

TEST(RecoveryPhasesTest, PhasesFollowEachOtherFromTheFailureToTheFirstStep) {
  v1::AttemptInfo failed;
  failed.set_attempt(1);
  failed.set_failed_unix(100.0);
  failed.set_ended_unix(100.5);         // detection 0.5
  failed.set_ranks_exited_unix(101.0);  // teardown 0.5
  failed.set_recover_at_unix(102.5);    // backoff 2.0 (the later of the two)
  v1::AttemptInfo next;
  next.set_attempt(2);
  next.set_started_unix(102.6);                              // placement 0.1
  next.set_all_running_unix(103.0);                          // start 0.4
  next.set_rendezvous_unix(104.0);                           // rendezvous 1.0
  next.set_setup_unix(107.0);                                // setup 3.0
  next.set_checkpoint_load_unix(107.2);                      // checkpoint load 0.2
  EXPECT_FALSE(RecoveryPhasesOf(failed, next).has_value());  // no first step yet
  next.set_first_step_unix(107.5);                           // first step 0.3
  const auto p = RecoveryPhasesOf(failed, next);
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(p->from_attempt(), 1u);
  EXPECT_NEAR(p->detection_s(), 0.5, 1e-9);
  EXPECT_NEAR(p->teardown_s(), 0.5, 1e-9);
  EXPECT_NEAR(p->backoff_s(), 2.0, 1e-9);
  EXPECT_NEAR(p->placement_s(), 0.1, 1e-9);
  EXPECT_NEAR(p->start_s(), 0.4, 1e-9);
  EXPECT_NEAR(p->rendezvous_s(), 1.0, 1e-9);
  EXPECT_NEAR(p->setup_s(), 3.0, 1e-9);
  EXPECT_NEAR(p->checkpoint_load_s(), 0.2, 1e-9);
  EXPECT_NEAR(p->first_step_s(), 0.3, 1e-9);
  EXPECT_NEAR(p->total_s(), 7.5, 1e-9);
  // detection + max(teardown, backoff) + the rest = total.
  EXPECT_NEAR(p->detection_s() + std::max(p->teardown_s(), p->backoff_s()) + p->placement_s() +
                  p->start_s() + p->rendezvous_s() + p->setup_s() + p->checkpoint_load_s() +
                  p->first_step_s(),
              p->total_s(), 1e-9);
  EXPECT_EQ(p->dominant(), "setup");
  EXPECT_EQ(RecoveryPhasesLine(*p),
            "7.50 s from the failure of attempt 1 to the first step: detection 0.50 s, teardown "
            "0.50 s, backoff 2.00 s, placement 0.10 s, start 0.40 s, rendezvous 1.00 s, setup "
            "3.00 s, checkpoint_load 0.20 s, first_step 0.30 s (longest: setup)");
}

TEST(RecoveryPhasesTest, ClocksThatDisagreeNeverMakeANegativePhase) {
  v1::AttemptInfo failed;
  failed.set_attempt(3);
  failed.set_ended_unix(50);
  v1::AttemptInfo next;
  next.set_started_unix(51);
  next.set_all_running_unix(52);
  next.set_rendezvous_unix(51.5);  // a rank's clock behind the controller's
  next.set_setup_unix(53);
  next.set_checkpoint_load_unix(53);
  next.set_first_step_unix(54);
  const auto p = RecoveryPhasesOf(failed, next);
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(p->rendezvous_s(), 0);
  EXPECT_EQ(p->detection_s(), 0);  // no failure time: counted from the attempt's end
  EXPECT_NEAR(p->setup_s(), 1, 1e-9);
  EXPECT_NEAR(p->total_s(), 4, 1e-9);
}

constexpr const char* kJob = R"(name: t
kind: commcheck
parallel: {dp: 2}
recovery:
  max_restarts: 2
  backoff: {initial_s: 1.0, max_s: 4.0, multiplier: 2.0}
  heartbeat_timeout_s: 5
  start_timeout_s: 20
)";

class RecoveryTimingTest : public ControllerOnTempDir {
 protected:
  void SetUp() override {
    StartController("furnace-recovery-timing");
    if (HasFatalFailure()) return;
    for (int slot = 0; slot < 2; ++slot) {
      v1::RegisterRequest r;
      r.set_instance_id("i0");
      r.set_worker_id(Worker(slot));
      r.set_slot(slot);
      r.set_device_kind("cpu");
      r.set_pid(100 + slot);
      auto resp = c_->Register(r);
      ASSERT_TRUE(resp.ok()) << resp.status();
      sessions_[slot] = resp->session_id();
    }
    auto id = c_->Submit(kJob, "t.yaml");
    ASSERT_TRUE(id.ok()) << id.status();
    job_ = *id;
  }

  static std::string Worker(int slot) { return "h/" + std::to_string(slot); }

  void Report(uint32_t attempt, uint32_t rank, v1::RankEvent event,
              v1::ExitKind kind = v1::EXIT_KIND_UNSPECIFIED, double failed_unix = 0) {
    v1::RankReport r;
    r.set_worker_id(Worker(static_cast<int>(rank)));
    r.set_job_id(job_);
    r.set_attempt(attempt);
    r.set_rank(rank);
    r.set_event(event);
    r.set_pid(1000 + rank);
    r.set_exit_kind(kind);
    r.set_reason(kind == v1::EXIT_KIND_SIGNAL ? "killed by signal 9 (SIGKILL)" : "");
    r.set_unix_time(clock_.UnixSeconds());
    r.set_failed_unix(failed_unix);
    ASSERT_TRUE(c_->ReportRank(r).ok());
  }

  // A rank's record: its start-up points (`startup`) or its first step (`step`).
  void Telemetry(uint32_t attempt, uint32_t rank, bool step, double rendezvous = 0,
                 double setup = 0, double loaded = 0) {
    v1::TelemetryBatch batch;
    batch.set_worker_id(Worker(static_cast<int>(rank)));
    v1::TelemetryRecord* r = batch.add_records();
    r->set_job_id(job_);
    r->set_attempt(attempt);
    r->set_rank(rank);
    r->set_unix_time(clock_.UnixSeconds());
    r->set_phase("running");
    if (step) {
      r->set_step(1);
      r->mutable_train()->set_loss(4.0);
    } else {
      r->mutable_startup()->set_rendezvous_unix(rendezvous);
      r->mutable_startup()->set_setup_unix(setup);
      r->mutable_startup()->set_checkpoint_load_unix(loaded);
    }
    ASSERT_TRUE(c_->PushTelemetry(batch).ok());
  }

  v1::HeartbeatResponse Heartbeat(int slot) {
    v1::HeartbeatRequest h;
    h.set_worker_id(Worker(slot));
    h.set_session_id(sessions_[slot]);
    return c_->Heartbeat(h);
  }

  v1::JobDetail Job() {
    auto d = c_->GetJob(job_);
    EXPECT_TRUE(d.ok()) << d.status();
    return *d;
  }

  // Starts attempt `attempt` (its start commands taken, both ranks reported started).
  void StartAttempt(uint32_t attempt) {
    for (int slot = 0; slot < 2; ++slot) {
      auto cmds = c_->NextCommands(Worker(slot), sessions_[slot], 0.0);
      ASSERT_TRUE(cmds.ok());
      ASSERT_FALSE(cmds->empty());
    }
    clock_.Advance(0.4);
    Report(attempt, 0, v1::RANK_STARTED);
    Report(attempt, 1, v1::RANK_STARTED);
  }

  std::string sessions_[2];
  std::string job_;
};

TEST_F(RecoveryTimingTest, ARecoveryIsTimedByPhaseAndReported) {
  StartAttempt(1);
  Telemetry(1, 0, true);
  Telemetry(1, 1, true);
  EXPECT_FALSE(Job().attempts(0).has_recovery());  // the first attempt recovers from nothing

  clock_.Advance(10);
  const double killed = clock_.UnixSeconds() - 0.25;  // the agent saw the exit 0.25 s ago
  Report(1, 1, v1::RANK_EXITED, v1::EXIT_KIND_SIGNAL, killed);
  clock_.Advance(0.3);
  Report(1, 0, v1::RANK_EXITED, v1::EXIT_KIND_STOPPED);  // teardown 0.3 s
  clock_.Advance(0.5);                                   // the backoff (1 s) is not over
  c_->Tick();
  EXPECT_EQ(Job().attempts_size(), 1);
  clock_.Advance(0.3);
  c_->Tick();
  ASSERT_EQ(Job().attempts_size(), 2);
  StartAttempt(2);  // start 0.4 s
  const double t = clock_.UnixSeconds();
  clock_.Advance(2);
  Telemetry(2, 0, false, t + 0.5, t + 1.0, t + 1.5);
  Telemetry(2, 1, false, t + 0.7, t + 1.2, t + 1.9);  // the slower rank sets the pace
  EXPECT_FALSE(Job().attempts(1).has_recovery());
  clock_.Advance(0.5);
  Telemetry(2, 0, true);
  EXPECT_FALSE(Job().attempts(1).has_recovery());  // rank 1 has not stepped yet
  clock_.Advance(0.2);
  Telemetry(2, 1, true);

  const v1::JobDetail d = Job();
  const v1::AttemptInfo& first = d.attempts(0);
  EXPECT_DOUBLE_EQ(first.failed_unix(), killed);
  EXPECT_GT(first.ranks_exited_unix(), first.ended_unix());
  ASSERT_TRUE(d.attempts(1).has_recovery());
  const v1::RecoveryPhases& p = d.attempts(1).recovery();
  EXPECT_EQ(p.from_attempt(), 1u);
  EXPECT_NEAR(p.detection_s(), 0.25, 1e-6);
  EXPECT_NEAR(p.teardown_s(), 0.3, 1e-6);
  EXPECT_NEAR(p.backoff_s(), 1.0, 1e-6);
  EXPECT_NEAR(p.placement_s(), 0.1, 1e-6);  // the tick after the backoff
  EXPECT_NEAR(p.start_s(), 0.4, 1e-6);
  EXPECT_NEAR(p.rendezvous_s(), 0.7, 1e-6);
  EXPECT_NEAR(p.setup_s(), 0.5, 1e-6);
  EXPECT_NEAR(p.checkpoint_load_s(), 0.7, 1e-6);
  EXPECT_NEAR(p.first_step_s(), 2.7 - 1.9, 1e-6);
  EXPECT_NEAR(p.total_s(), 0.25 + 1.0 + 0.1 + 0.4 + 2.7, 1e-6);
  EXPECT_EQ(p.dominant(), "backoff");
  bool event = false;
  for (const auto& e : d.events()) {
    if (e.kind() == "recovered") {
      event = true;
      EXPECT_THAT(e.message(), HasSubstr("from the failure of attempt 1 to the first step"));
    }
  }
  EXPECT_TRUE(event);
  const MetricsSnapshot m = c_->Metrics();
  ASSERT_EQ(m.jobs.size(), 1u);
  ASSERT_EQ(m.jobs[0].last_recovery_phases.size(), 10u);
  EXPECT_EQ(m.jobs[0].last_recovery_phases.front().first, "detection");
  EXPECT_EQ(m.jobs[0].last_recovery_phases.back().first, "total");
  EXPECT_NEAR(m.jobs[0].last_recovery_phases.back().second, p.total_s(), 1e-9);
}

TEST_F(RecoveryTimingTest, TheHeartbeatTellsTheWorkerWhichRanksTheControllerWants) {
  const v1::HeartbeatResponse placed = Heartbeat(0);
  EXPECT_TRUE(placed.reconcile());
  ASSERT_EQ(placed.ranks_size(), 1);
  EXPECT_TRUE(placed.ranks(0).wanted());
  EXPECT_FALSE(placed.ranks(0).started());  // its start command may still be on the way
  StartAttempt(1);
  const v1::HeartbeatResponse running = Heartbeat(0);
  ASSERT_EQ(running.ranks_size(), 1);
  EXPECT_EQ(running.ranks(0).job_id(), job_);
  EXPECT_EQ(running.ranks(0).attempt(), 1u);
  EXPECT_EQ(running.ranks(0).rank(), 0u);
  EXPECT_TRUE(running.ranks(0).wanted());
  EXPECT_TRUE(running.ranks(0).started());
  // Rank 1 fails: rank 0 is still alive in the records but no longer wanted.
  Report(1, 1, v1::RANK_EXITED, v1::EXIT_KIND_SIGNAL);
  const v1::HeartbeatResponse failed = Heartbeat(0);
  ASSERT_EQ(failed.ranks_size(), 1);
  EXPECT_FALSE(failed.ranks(0).wanted());
  EXPECT_EQ(Heartbeat(1).ranks_size(), 0);  // its rank ended
}

TEST_F(RecoveryTimingTest, ARankItsWorkerDoesNotHaveFailsTheAttemptAsLost) {
  StartAttempt(1);
  Report(1, 0, v1::RANK_EXITED, v1::EXIT_KIND_LOST);
  const v1::JobDetail d = Job();
  EXPECT_EQ(d.attempts(0).state(), v1::ATTEMPT_STATE_FAILED);
  EXPECT_EQ(d.attempts(0).failure_kind(), "lost");
}

}  // namespace
}  // namespace furnace::controller
