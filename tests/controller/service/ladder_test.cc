// The restart ladder with a fake clock and no sockets: a health check that names the worker that
// never arrived, exclusion and spares, waiting for healthy workers and how an excluded worker
// becomes usable again, giving up without progress, recovery.shrink, a layout that no longer fits,
// and a corrupt data file. The same flows run with real processes in
// tests/integration/test_ladder.py.
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "controller/service/controller.h"
#include "gtest/gtest.h"
#include "tests/controller/service/controller_on_temp_dir.h"

namespace furnace::controller {
namespace {

namespace fs = std::filesystem;

// A 4-rank commcheck; tests append recovery fields (two spaces deep).
std::string Commcheck(const std::string& recovery) {
  return "name: t\nkind: commcheck\nparallel: {dp: 4}\nrecovery:\n"
         "  max_restarts: 3\n"
         "  backoff: {initial_s: 1.0, max_s: 4.0, multiplier: 2.0}\n"
         "  heartbeat_timeout_s: 5\n"
         "  health_check_s: 5\n" +
         recovery;
}

class LadderTest : public ControllerOnTempDir {
 protected:
  void SetUp() override {
    StartController("furnace-ladder-test", [](ControllerOptions& o) { o.worker_timeout_s = 10; });
  }

  static std::string Id(int slot) { return "h/" + std::to_string(slot); }

  void Register(int slot, const std::string& instance = "i0") {
    v1::RegisterRequest r;
    r.set_instance_id(instance);
    r.set_worker_id(Id(slot));
    r.set_host("127.0.0.1");
    r.set_slot(slot);
    r.set_device_kind("cpu");
    r.set_pid(100 + slot);
    auto resp = c_->Register(r);
    ASSERT_TRUE(resp.ok()) << resp.status();
    sessions_[slot] = resp->session_id();
  }

  std::vector<v1::AgentCommand> Commands(int slot) {
    auto cmds = c_->NextCommands(Id(slot), sessions_[slot], 0.0);
    EXPECT_TRUE(cmds.ok()) << cmds.status();
    return cmds.ok() ? *cmds : std::vector<v1::AgentCommand>{};
  }

  // The start commands queued for the registered workers, by worker slot (a lost worker's session
  // is over: it has none).
  std::map<int, v1::RankTask> Starts() {
    std::map<int, v1::RankTask> out;
    for (const auto& [slot, session] : sessions_) {
      auto cmds = c_->NextCommands(Id(slot), session, 0.0);
      if (!cmds.ok()) continue;
      for (const auto& cmd : *cmds) {
        if (cmd.has_start()) out[slot] = cmd.start();
      }
    }
    return out;
  }

  void Report(int slot, uint32_t attempt, uint32_t rank, v1::RankEvent event,
              v1::ExitKind kind = v1::EXIT_KIND_UNSPECIFIED, int exit_code = 0,
              const std::string& reason = "") {
    v1::RankReport r;
    r.set_worker_id(Id(slot));
    r.set_job_id(job_);
    r.set_attempt(attempt);
    r.set_rank(rank);
    r.set_event(event);
    r.set_pid(1000 + rank);
    r.set_exit_kind(kind);
    r.set_exit_code(exit_code);
    r.set_reason(reason);
    ASSERT_TRUE(c_->ReportRank(r).ok());
  }

  void Progress(uint32_t attempt, uint32_t rank, uint64_t step) {
    v1::TelemetryBatch batch;
    auto* rec = batch.add_records();
    rec->set_job_id(job_);
    rec->set_attempt(attempt);
    rec->set_rank(rank);
    rec->set_step(step);
    rec->set_phase("running");
    ASSERT_TRUE(c_->PushTelemetry(batch).ok());
  }

  void Arrived(uint32_t attempt, uint32_t rank) {
    v1::KvSetRequest set;
    set.mutable_scope()->set_job_id(job_);
    set.mutable_scope()->set_attempt(attempt);
    set.set_key("health/arrived/" + std::to_string(rank));
    set.set_value("1");
    ASSERT_TRUE(c_->KvSet(set).ok());
  }

  v1::JobDetail Job() {
    auto d = c_->GetJob(job_);
    EXPECT_TRUE(d.ok()) << d.status();
    return *d;
  }

  // The newest event of `kind`, or "".
  std::string LastEvent(const std::string& kind) {
    std::string out;
    const v1::JobDetail detail = Job();
    for (const auto& e : detail.events()) {
      if (e.kind() == kind) out = e.message();
    }
    return out;
  }

  // Lets `seconds` pass in 1 s ticks; the workers in `alive` keep heart-beating.
  void Pass(double seconds, const std::vector<int>& alive) {
    for (double t = 0; t < seconds; t += 1) {
      clock_.Advance(1);
      for (int s : alive) {
        v1::HeartbeatRequest h;
        h.set_worker_id(Id(s));
        h.set_session_id(sessions_[s]);
        c_->Heartbeat(h);
      }
      c_->Tick();
    }
  }

  void Submit(const std::string& yaml) {
    auto id = c_->Submit(yaml, "t.yaml");
    ASSERT_TRUE(id.ok()) << id.status();
    job_ = *id;
  }

  // Attempt `attempt` placed on `slots` (rank r on slots[r]) and running.
  void ExpectRunningOn(uint32_t attempt, const std::vector<int>& slots) {
    std::map<int, v1::RankTask> starts = Starts();
    ASSERT_EQ(starts.size(), slots.size());
    for (size_t r = 0; r < slots.size(); ++r) {
      ASSERT_TRUE(starts.count(slots[r])) << "no start on " << Id(slots[r]);
      const v1::RankTask& t = starts[slots[r]];
      EXPECT_EQ(t.attempt(), attempt);
      EXPECT_EQ(t.rank(), r);
      EXPECT_EQ(t.worker_id(), Id(slots[r]));
      Report(slots[r], attempt, static_cast<uint32_t>(r), v1::RANK_STARTED);
    }
    EXPECT_EQ(Job().summary().state(), v1::JOB_RUNNING);
  }

  // Ranks 0..3 of attempt 1 on h/0..h/3 arrive except `missing`; rank `reporter` says the check
  // failed; every other rank then stops.
  void FailHealthCheck(uint32_t attempt, const std::vector<int>& slots, uint32_t missing,
                       uint32_t reporter) {
    for (uint32_t r = 0; r < slots.size(); ++r) {
      if (r != missing) Arrived(attempt, r);
    }
    Report(slots[reporter], attempt, reporter, v1::RANK_EXITED, v1::EXIT_KIND_CODE,
           v1::RANK_EXIT_HEALTH_CHECK,
           "health check: rank 2 did not arrive within 60 s of this rank");
    for (uint32_t r = 0; r < slots.size(); ++r) {
      if (r != reporter) Report(slots[r], attempt, r, v1::RANK_EXITED, v1::EXIT_KIND_STOPPED);
    }
  }

  std::map<int, std::string> sessions_;
  std::string job_;
};

TEST_F(LadderTest, HealthCheckExcludesTheWorkerThatNeverArrivedAndUsesASpare) {
  for (int s = 0; s < 5; ++s) Register(s);
  Submit(Commcheck("  exclude_s: 60\n"));
  ExpectRunningOn(1, {0, 1, 2, 3});
  FailHealthCheck(1, {0, 1, 2, 3}, /*missing=*/2, /*reporter=*/0);

  v1::JobDetail d = Job();
  EXPECT_EQ(d.summary().state(), v1::JOB_RECOVERING);
  EXPECT_EQ(d.summary().restarts(), 0u);  // a health check failure does not spend the budget
  EXPECT_EQ(d.attempts(0).failure_kind(), "health_check");
  EXPECT_NE(
      d.attempts(0).cause().find("rank 2 on h/2 never arrived at the health check within 60 s "
                                 "(recovery.start_timeout_s)"),
      std::string::npos)
      << d.attempts(0).cause();
  const std::string excluded = LastEvent("exclude");
  EXPECT_NE(excluded.find("worker h/2 excluded"), std::string::npos) << excluded;
  EXPECT_NE(excluded.find("usable again when its agent restarts"), std::string::npos);
  EXPECT_NE(LastEvent("health_check").find("not counted against recovery.max_restarts"),
            std::string::npos);

  Pass(1, {0, 1, 2, 3, 4});
  ExpectRunningOn(2, {0, 1, 3, 4});  // the spare h/4 instead of h/2
  d = Job();
  ASSERT_EQ(d.attempts_size(), 2);
  ASSERT_EQ(d.attempts(1).excluded_size(), 1);
  EXPECT_NE(d.attempts(1).excluded(0).find("h/2 (failed the health check of attempt 1"),
            std::string::npos)
      << d.attempts(1).excluded(0);
}

TEST_F(LadderTest, WaitsForHealthyWorkersAndReadmitsAfterExcludeS) {
  for (int s = 0; s < 4; ++s) Register(s);
  Submit(Commcheck("  exclude_s: 30\n"));
  ExpectRunningOn(1, {0, 1, 2, 3});
  FailHealthCheck(1, {0, 1, 2, 3}, /*missing=*/1, /*reporter=*/3);

  Pass(5, {0, 1, 2, 3});
  v1::JobDetail d = Job();
  EXPECT_EQ(d.summary().state(), v1::JOB_RECOVERING);
  EXPECT_EQ(d.attempts_size(), 1);  // never back on the failed worker while it is excluded
  const std::string waiting = LastEvent("waiting");
  EXPECT_NE(waiting.find("needs 4 healthy cpu workers"), std::string::npos) << waiting;
  EXPECT_NE(waiting.find("h/1 excluded (failed the health check of attempt 1"), std::string::npos)
      << waiting;
  EXPECT_NE(
      waiting.find("usable again when its agent restarts (registers as a new process), or at"),
      std::string::npos);
  EXPECT_TRUE(Starts().empty());

  Pass(26, {0, 1, 2, 3});
  EXPECT_NE(LastEvent("include").find("worker h/1 usable again: its exclusion of 30 s is over"),
            std::string::npos)
      << LastEvent("include");
  ExpectRunningOn(2, {0, 1, 2, 3});
}

TEST_F(LadderTest, AnExcludedWorkerWhoseAgentRestartsIsUsableAgain) {
  for (int s = 0; s < 4; ++s) Register(s);
  Submit(Commcheck(""));
  ExpectRunningOn(1, {0, 1, 2, 3});
  FailHealthCheck(1, {0, 1, 2, 3}, /*missing=*/2, /*reporter=*/0);
  Pass(3, {0, 1, 2, 3});
  EXPECT_EQ(Job().attempts_size(), 1);
  Register(2, "i1");  // a new agent process on h/2
  Pass(1, {0, 1, 2, 3});
  EXPECT_NE(LastEvent("include").find("its agent restarted"), std::string::npos);
  ExpectRunningOn(2, {0, 1, 2, 3});
}

TEST_F(LadderTest, ALostWorkerIsUsableAgainWhenItRegistersAgain) {
  for (int s = 0; s < 4; ++s) Register(s);
  Submit(Commcheck(""));
  ExpectRunningOn(1, {0, 1, 2, 3});
  Pass(7, {0, 1, 2});  // h/3 lost
  for (uint32_t r = 0; r < 3; ++r) {
    Report(static_cast<int>(r), 1, r, v1::RANK_EXITED, v1::EXIT_KIND_STOPPED);
  }
  EXPECT_NE(LastEvent("exclude").find("worker h/3 excluded from this job (lost: no heartbeat"),
            std::string::npos)
      << LastEvent("exclude");
  Pass(3, {0, 1, 2});
  EXPECT_EQ(Job().attempts_size(), 1);
  Register(3);  // the same agent process, reachable again
  Pass(1, {0, 1, 2, 3});
  EXPECT_NE(LastEvent("include").find("worker h/3 usable again: its agent registered again"),
            std::string::npos)
      << LastEvent("include");
  ExpectRunningOn(2, {0, 1, 2, 3});
}

TEST_F(LadderTest, AHealthCheckThatNamesNobodyIsAnOrdinaryFailure) {
  for (int s = 0; s < 4; ++s) Register(s);
  Submit(Commcheck(""));
  ExpectRunningOn(1, {0, 1, 2, 3});
  for (uint32_t r = 0; r < 4; ++r) Arrived(1, r);
  Report(2, 1, 2, v1::RANK_EXITED, v1::EXIT_KIND_CODE, v1::RANK_EXIT_HEALTH_CHECK,
         "health check: commcheck allreduce 4096 B: 3 mismatched elements");
  v1::JobDetail d = Job();
  EXPECT_EQ(d.summary().state(), v1::JOB_RECOVERING);
  EXPECT_EQ(d.summary().restarts(), 1u);
  EXPECT_EQ(d.attempts(0).failure_kind(), "health_check");
  EXPECT_NE(d.attempts(0).cause().find("every rank arrived: no worker to blame"), std::string::npos)
      << d.attempts(0).cause();
  EXPECT_EQ(LastEvent("exclude"), "");
}

TEST_F(LadderTest, HealthCheckFailuresEndAfterMaxAttemptsWithoutProgress) {
  for (int s = 0; s < 6; ++s) Register(s);
  Submit(Commcheck("  max_attempts_without_progress: 2\n"));
  ExpectRunningOn(1, {0, 1, 2, 3});
  FailHealthCheck(1, {0, 1, 2, 3}, /*missing=*/0, /*reporter=*/1);
  Pass(1, {0, 1, 2, 3, 4, 5});
  ExpectRunningOn(2, {1, 2, 3, 4});
  FailHealthCheck(2, {1, 2, 3, 4}, /*missing=*/3, /*reporter=*/0);
  v1::JobDetail d = Job();
  EXPECT_EQ(d.summary().state(), v1::JOB_FAILED);
  EXPECT_EQ(d.summary().restarts(), 0u);
  EXPECT_NE(d.summary().cause().find("no progress across 2 consecutive attempts, none got past "
                                     "step 0; recovery.max_attempts_without_progress = 2"),
            std::string::npos)
      << d.summary().cause();
}

// With the no-progress rule off (0) nothing else bounds health-check retries: they spend
// recovery.max_restarts like any failure (before, a check failing every attempt retried forever).
TEST_F(LadderTest, WithoutTheNoProgressRuleHealthCheckFailuresSpendTheRestartBudget) {
  for (int s = 0; s < 6; ++s) Register(s);
  Submit(Commcheck("  max_attempts_without_progress: 0\n  exclude_s: 0\n"));
  ExpectRunningOn(1, {0, 1, 2, 3});
  FailHealthCheck(1, {0, 1, 2, 3}, /*missing=*/0, /*reporter=*/1);
  v1::JobDetail d = Job();
  EXPECT_EQ(d.summary().state(), v1::JOB_RECOVERING);
  EXPECT_EQ(d.summary().restarts(), 1u);
  for (uint32_t attempt = 2; attempt <= 4; ++attempt) {
    Pass(4, {0, 1, 2, 3, 4, 5});
    std::map<int, v1::RankTask> starts = Starts();
    ASSERT_EQ(starts.size(), 4u) << "attempt " << attempt;
    std::vector<int> slots(4);
    for (const auto& [slot, task] : starts) slots[task.rank()] = slot;
    for (uint32_t r = 0; r < 4; ++r) Report(slots[r], attempt, r, v1::RANK_STARTED);
    FailHealthCheck(attempt, slots, /*missing=*/0, /*reporter=*/1);
  }
  d = Job();
  EXPECT_EQ(d.summary().state(), v1::JOB_FAILED);
  EXPECT_EQ(d.summary().restarts(), 3u);
  EXPECT_NE(d.summary().cause().find("gave up after 3 restarts"), std::string::npos)
      << d.summary().cause();
}

// An agent that says it is leaving interrupts its attempt without spending a restart, but only
// the first three times for a job: an agent stopped each time it gets a rank (a probe, a
// supervisor) would otherwise restart the job forever.
TEST_F(LadderTest, OnlyTheFirstThreeLeavingAgentsSpendNoRestart) {
  for (int s = 0; s < 4; ++s) Register(s);
  Submit(Commcheck("  exclude_s: 0\n"));
  for (uint32_t attempt = 1; attempt <= 4; ++attempt) {
    if (attempt > 1) Pass(5, {0, 1, 2, 3});
    std::map<int, v1::RankTask> starts = Starts();
    ASSERT_EQ(starts.size(), 4u) << "attempt " << attempt;
    for (const auto& [slot, task] : starts) Report(slot, attempt, task.rank(), v1::RANK_STARTED);
    ASSERT_EQ(Job().summary().state(), v1::JOB_RUNNING) << "attempt " << attempt;
    const int leaver = starts.begin()->first;
    v1::HeartbeatRequest h;
    h.set_worker_id(Id(leaver));
    h.set_session_id(sessions_[leaver]);
    h.set_leaving(true);
    c_->Heartbeat(h);
    const v1::JobDetail d = Job();
    EXPECT_EQ(d.summary().state(), v1::JOB_RECOVERING) << "attempt " << attempt;
    EXPECT_EQ(d.summary().restarts(), attempt <= 3 ? 0u : 1u) << "attempt " << attempt;
    EXPECT_EQ(d.attempts(attempt - 1).state(),
              attempt <= 3 ? v1::ATTEMPT_STATE_INTERRUPTED : v1::ATTEMPT_STATE_FAILED);
    for (const auto& [slot, task] : starts) {
      Report(slot, attempt, task.rank(), v1::RANK_EXITED, v1::EXIT_KIND_STOPPED);
    }
    Register(leaver, "restarted-" + std::to_string(attempt));  // its agent comes back
  }
}

// Failures that repeat on whichever worker holds rank 1: the next attempt avoids every worker a
// failure without progress was blamed on, not only the latest, so it moves on to a spare instead
// of going back to the worker of the failure before.
TEST_F(LadderTest, FailuresWithoutProgressKeepTheirWorkersSuspect) {
  for (int s = 0; s < 6; ++s) Register(s);
  Submit(Commcheck(""));
  ExpectRunningOn(1, {0, 1, 2, 3});
  Report(1, 1, 1, v1::RANK_EXITED, v1::EXIT_KIND_SIGNAL, 0, "killed by signal 9");
  for (uint32_t r : {0u, 2u, 3u}) Report(r, 1, r, v1::RANK_EXITED, v1::EXIT_KIND_STOPPED);
  EXPECT_EQ(Job().attempts(0).culprit_worker(), Id(1));

  Pass(2, {0, 1, 2, 3, 4, 5});
  ExpectRunningOn(2, {0, 2, 3, 4});  // h/1 is a suspect
  Report(2, 2, 1, v1::RANK_EXITED, v1::EXIT_KIND_SIGNAL, 0, "killed by signal 9");
  for (const auto& [slot, rank] : std::vector<std::pair<int, uint32_t>>{{0, 0}, {3, 2}, {4, 3}}) {
    Report(slot, 2, rank, v1::RANK_EXITED, v1::EXIT_KIND_STOPPED);
  }
  EXPECT_EQ(Job().summary().state(), v1::JOB_RECOVERING);

  Pass(4, {0, 1, 2, 3, 4, 5});
  ExpectRunningOn(3, {0, 3, 4, 5});  // h/1 and h/2 both suspect: the spare h/5, not h/1 again
}

TEST_F(LadderTest, RepeatedFailuresBeforeTheBestStepEndTheJob) {
  for (int s = 0; s < 4; ++s) Register(s);
  Submit(Commcheck("  max_attempts_without_progress: 2\n"));
  ExpectRunningOn(1, {0, 1, 2, 3});
  for (uint32_t r = 0; r < 4; ++r) Progress(1, r, 3);
  Report(1, 1, 1, v1::RANK_EXITED, v1::EXIT_KIND_SIGNAL, 0, "killed by signal 9");
  for (uint32_t r : {0u, 2u, 3u}) Report(r, 1, r, v1::RANK_EXITED, v1::EXIT_KIND_STOPPED);
  EXPECT_EQ(Job().summary().state(), v1::JOB_RECOVERING);  // attempt 1 got to step 3

  Pass(1, {0, 1, 2, 3});
  ExpectRunningOn(2, {0, 1, 2, 3});  // the suspect h/1 is used: there is no spare
  for (uint32_t r = 0; r < 4; ++r) Progress(2, r, 2);
  Report(1, 2, 1, v1::RANK_EXITED, v1::EXIT_KIND_SIGNAL, 0, "killed by signal 9");
  for (uint32_t r : {0u, 2u, 3u}) Report(r, 2, r, v1::RANK_EXITED, v1::EXIT_KIND_STOPPED);
  EXPECT_EQ(Job().summary().state(), v1::JOB_RECOVERING);  // one attempt without progress

  Pass(2, {0, 1, 2, 3});
  ExpectRunningOn(3, {0, 1, 2, 3});
  Progress(3, 0, 3);  // the slowest rank sets the attempt's step: 1
  for (uint32_t r = 1; r < 4; ++r) Progress(3, r, 1);
  Report(1, 3, 1, v1::RANK_EXITED, v1::EXIT_KIND_SIGNAL, 0, "killed by signal 9");
  v1::JobDetail d = Job();
  EXPECT_EQ(d.summary().state(), v1::JOB_FAILED);
  EXPECT_EQ(d.summary().restarts(), 2u);
  EXPECT_NE(d.summary().cause().find("rank 1 on h/1: killed by signal 9 (not retried: no progress "
                                     "across 2 consecutive attempts, none got past step 3"),
            std::string::npos)
      << d.summary().cause();
}

TEST_F(LadderTest, ShrinksToTheFirstAllowedLayoutWhenAWorkerIsLost) {
  for (int s = 0; s < 4; ++s) Register(s);
  Submit(
      "name: t\nkind: train\nparallel: {dp: 4, ep: 4, micro_batch: 1, micro_batches: 1}\n"
      "moe: {experts: 4}\n"
      "recovery:\n  backoff: {initial_s: 1.0, max_s: 4.0, multiplier: 2.0}\n"
      "  heartbeat_timeout_s: 5\n  shrink:\n    - {dp: 2, ep: 2}\n");
  ExpectRunningOn(1, {0, 1, 2, 3});
  Pass(7, {0, 1, 2});  // h/3 goes silent: lost
  for (uint32_t r = 0; r < 3; ++r) {
    Report(static_cast<int>(r), 1, r, v1::RANK_EXITED, v1::EXIT_KIND_STOPPED);
  }
  Pass(2, {0, 1, 2});
  std::map<int, v1::RankTask> starts = Starts();
  ASSERT_EQ(starts.size(), 2u);
  for (int s : {0, 1}) {
    const v1::RankTask& t = starts[s];
    EXPECT_EQ(t.attempt(), 2u);
    EXPECT_EQ(t.world_size(), 2u);
    EXPECT_EQ(t.spec().parallel().dp(), 2u);
    EXPECT_EQ(t.spec().parallel().ep(), 2u);
    EXPECT_EQ(t.spec().parallel().micro_batches(), 2u);  // global batch 1 * 1 * 4 kept
    EXPECT_EQ(t.spec().resources().workers(), 2u);
  }
  v1::JobDetail d = Job();
  ASSERT_EQ(d.attempts_size(), 2);
  EXPECT_EQ(d.attempts(0).parallel().dp(), 4u);
  EXPECT_EQ(d.attempts(1).parallel().dp(), 2u);
  EXPECT_EQ(d.attempts(1).ranks_size(), 2);
  EXPECT_EQ(d.spec().parallel().dp(), 4u);  // the stored spec is what the user submitted
  const std::string shrink = LastEvent("shrink");
  EXPECT_NE(shrink.find("attempt 2 shrunk from pp 1 dp 4 tp 1 ep 4 esp 1 (4 ranks) to pp 1 dp 2 "
                        "tp 1 ep 2 esp 1 (2 ranks): 3 healthy cpu workers left (h/3 excluded "
                        "(lost: no heartbeat"),
            std::string::npos)
      << shrink;
  EXPECT_NE(shrink.find("micro_batches 1 -> 2 keeps the global batch at 4 sequences"),
            std::string::npos)
      << shrink;
}

TEST_F(LadderTest, GivesUpWhenNoAllowedLayoutFitsTheWorkersLeft) {
  for (int s = 0; s < 4; ++s) Register(s);
  Submit(Commcheck("  wait_for_workers_s: 20\n"));
  ExpectRunningOn(1, {0, 1, 2, 3});
  Pass(7, {0, 1, 2});  // h/3 lost
  for (uint32_t r = 0; r < 3; ++r) {
    Report(static_cast<int>(r), 1, r, v1::RANK_EXITED, v1::EXIT_KIND_STOPPED);
  }
  Pass(5, {0, 1, 2});
  EXPECT_EQ(Job().summary().state(), v1::JOB_RECOVERING);
  EXPECT_NE(LastEvent("waiting").find("needs 4 healthy cpu workers for pp 1 dp 4 tp 1 ep 1 esp 1 "
                                      "(4 ranks), 3 left"),
            std::string::npos)
      << LastEvent("waiting");
  Pass(20, {0, 1, 2});
  v1::JobDetail d = Job();
  EXPECT_EQ(d.summary().state(), v1::JOB_FAILED);
  EXPECT_NE(d.summary().cause().find("the layout no longer fits the workers left: needs 4 healthy "
                                     "cpu workers"),
            std::string::npos)
      << d.summary().cause();
  EXPECT_NE(d.summary().cause().find("for 20 s (recovery.wait_for_workers_s); not retried"),
            std::string::npos);
}

TEST_F(LadderTest, CorruptDataFileIsNotRetried) {
  for (int s = 0; s < 4; ++s) Register(s);
  Submit(Commcheck(""));
  ExpectRunningOn(1, {0, 1, 2, 3});
  Report(2, 1, 2, v1::RANK_EXITED, v1::EXIT_KIND_CODE, v1::RANK_EXIT_CORRUPT_DATA,
         "data file corrupt: token file /d/x.tok: truncated");
  v1::JobDetail d = Job();
  EXPECT_EQ(d.summary().state(), v1::JOB_FAILED);
  EXPECT_EQ(d.attempts(0).failure_kind(), "corrupt_data");
  EXPECT_NE(d.summary().cause().find("not retried: the data file is corrupt"), std::string::npos)
      << d.summary().cause();
  // A token file (not an indexed dataset, which comes from another tool) is made again so.
  EXPECT_NE(d.summary().cause().find("prepare it again, e.g. furnace data prepare"),
            std::string::npos)
      << d.summary().cause();
}

}  // namespace
}  // namespace furnace::controller
