// The controller's logic with a fake clock and no sockets: placement, the job lifecycle, failure
// detection, recovery, fencing and reload after a restart. The same flows run with real processes
// in tests/integration.
#include "controller/service/controller.h"

#include <sqlite3.h>

#include <filesystem>
#include <fstream>
#include <future>
#include <set>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "controller/service/rendezvous.h"
#include "controller/store/goodput.h"
#include "gtest/gtest.h"
#include "proto/furnace/v1/state_names.h"
#include "runtime/comm/communicator.h"
#include "runtime/train/trainer.h"
#include "worker/step_telemetry.h"

namespace furnace::controller {
namespace {

namespace fs = std::filesystem;

constexpr const char* kJob = R"(name: t
kind: commcheck
parallel: {dp: 2}
recovery:
  max_restarts: 2
  backoff: {initial_s: 1.0, max_s: 4.0, multiplier: 2.0}
  heartbeat_timeout_s: 5
  start_timeout_s: 20
)";

class ControllerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("furnace-ctl-test-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    Restart();
  }
  void TearDown() override { fs::remove_all(dir_); }

  void Restart() {
    c_.reset();
    ControllerOptions o;
    o.state_dir = dir_.string();
    o.advertise_address = "127.0.0.1:1";
    o.worker_timeout_s = 10;
    o.heartbeat_interval_s = 0.75;
    o.telemetry_flush_s = telemetry_flush_s_;
    o.forget_lost_s = forget_lost_s_;
    o.forget_ended_s = forget_ended_s_;
    o.default_time_limit_s = default_time_limit_s_;
    o.max_time_limit_s = max_time_limit_s_;
    auto c = Controller::Create(o, clock_);
    ASSERT_TRUE(c.ok()) << c.status();
    c_ = std::move(*c);
  }

  std::string Register(int slot, int pid = 100, std::vector<v1::RunningRank> running = {},
                       const std::string& instance = "i0") {
    v1::RegisterRequest r;
    r.set_instance_id(instance);
    r.set_worker_id("h/" + std::to_string(slot));
    r.set_host("127.0.0.1");
    r.set_slot(slot);
    r.set_device_kind("cpu");
    r.set_pid(pid + slot);
    for (auto& rr : running) *r.add_running() = rr;
    auto resp = c_->Register(r);
    EXPECT_TRUE(resp.ok()) << resp.status();
    // What every agent is told to follow (worker/agent.cc).
    EXPECT_EQ(resp->heartbeat_interval_s(), 0.75);
    if (telemetry_flush_s_ > 0) {
      EXPECT_EQ(resp->telemetry_flush_s(), telemetry_flush_s_);
    }
    sessions_[slot] = resp->session_id();
    return resp->session_id();
  }

  std::vector<v1::AgentCommand> Commands(int slot) {
    auto cmds = c_->NextCommands("h/" + std::to_string(slot), sessions_[slot], 0.0);
    EXPECT_TRUE(cmds.ok()) << cmds.status();
    return cmds.ok() ? *cmds : std::vector<v1::AgentCommand>{};
  }

  // The report of `rank` of `attempt` (on slot `slot`) of the job.
  v1::RankReport MakeReport(int slot, uint32_t attempt, uint32_t rank, v1::RankEvent event,
                            v1::ExitKind kind = v1::EXIT_KIND_UNSPECIFIED,
                            const std::string& reason = "", int exit_code = 0) {
    v1::RankReport r;
    r.set_worker_id("h/" + std::to_string(slot));
    r.set_job_id(job_);
    r.set_attempt(attempt);
    r.set_rank(rank);
    r.set_event(event);
    r.set_pid(1000 + rank);
    r.set_exit_kind(kind);
    r.set_reason(reason);
    r.set_exit_code(exit_code);
    return r;
  }
  void Report(int slot, uint32_t attempt, uint32_t rank, v1::RankEvent event,
              v1::ExitKind kind = v1::EXIT_KIND_UNSPECIFIED, const std::string& reason = "",
              int exit_code = 0) {
    ASSERT_TRUE(
        c_->ReportRank(MakeReport(slot, attempt, rank, event, kind, reason, exit_code)).ok());
  }

  // The report of attempt 1's rank `rank` (on slot `slot`) ending with a hang its own watchdog
  // found (the agent then killed it), inside a collective or not.
  v1::RankReport HangReport(int slot, uint32_t rank, const std::string& reason,
                            bool in_collective) {
    v1::RankReport r;
    r.set_worker_id("h/" + std::to_string(slot));
    r.set_job_id(job_);
    r.set_attempt(1);
    r.set_rank(rank);
    r.set_event(v1::RANK_EXITED);
    r.set_pid(1000 + rank);
    r.set_exit_kind(v1::EXIT_KIND_HANG);
    r.set_reason(reason);
    r.set_hang_in_collective(in_collective);
    r.set_unix_time(clock_.UnixSeconds());
    return r;
  }
  void ReportHang(int slot, uint32_t rank, const std::string& reason, bool in_collective) {
    ASSERT_TRUE(c_->ReportRank(HangReport(slot, rank, reason, in_collective)).ok());
  }

  v1::JobDetail Job() {
    auto d = c_->GetJob(job_);
    EXPECT_TRUE(d.ok()) << d.status();
    return *d;
  }

  // A job of kJob's kind named `name`, of `dp` ranks and, unless `limit` is empty, of
  // resources.time_limit_s `limit`; "" when refused (a failure of the test).
  std::string SubmitNamed(const std::string& name, int dp, const std::string& limit = "") {
    std::string text = absl::StrReplaceAll(
        kJob, {{"name: t", "name: " + name}, {"dp: 2", absl::StrCat("dp: ", dp)}});
    if (!limit.empty()) text += "resources: {time_limit_s: " + limit + "}\n";
    absl::StatusOr<std::string> id = c_->Submit(text, name + ".yaml");
    EXPECT_TRUE(id.ok()) << id.status();
    return id.ok() ? *id : std::string();
  }
  // Every rank of `id`'s last attempt reports `event` from the worker it was placed on (an exit
  // ends successfully); job_ becomes `id`.
  void ReportAll(const std::string& id, v1::RankEvent event) {
    job_ = id;
    const v1::JobDetail detail = *c_->GetJob(id);
    const v1::AttemptInfo& attempt = detail.attempts(detail.attempts_size() - 1);
    for (const v1::RankInfo& r : attempt.ranks()) {
      Report(std::stoi(r.worker_id().substr(2)), attempt.attempt(), r.rank(), event,
             event == v1::RANK_EXITED ? v1::EXIT_KIND_SUCCESS : v1::EXIT_KIND_UNSPECIFIED);
    }
  }
  // SubmitNamed, and its ranks report started when it was placed at once; job_ becomes it.
  std::string SubmitStarted(const std::string& name, int dp, const std::string& limit) {
    const std::string id = SubmitNamed(name, dp, limit);
    if (id.empty()) return id;
    job_ = id;
    if (c_->GetJob(id)->summary().state() == v1::JOB_STARTING) ReportAll(id, v1::RANK_STARTED);
    return id;
  }
  v1::JobSummary SummaryOf(const std::string& id) { return c_->GetJob(id)->summary(); }

  // One heartbeat of slot `slot`'s agent in its session (`leaving`: it says it is shutting down).
  v1::HeartbeatResponse Beat(int slot, bool leaving = false) {
    v1::HeartbeatRequest h;
    h.set_worker_id("h/" + std::to_string(slot));
    h.set_session_id(sessions_[slot]);
    h.set_leaving(leaving);
    return c_->Heartbeat(h);
  }
  void HeartbeatAll(int n) {
    for (int s = 0; s < n; ++s) EXPECT_FALSE(Beat(s).reregister());
  }

  // Rank `rank` of `attempt` reports `step` from the worker it was placed on (`loaded`: with its
  // start-up's checkpoint-load time, as a train rank's first record after the restore), and
  // `train` figures when given.
  void PushStep(uint32_t attempt, uint32_t rank, uint64_t step, bool loaded = false,
                const v1::StepTelemetry* train = nullptr) {
    v1::TelemetryBatch batch;
    batch.set_worker_id(Job().attempts(attempt - 1).ranks(rank).worker_id());
    v1::TelemetryRecord& r = *batch.add_records();
    r.set_job_id(job_);
    r.set_attempt(attempt);
    r.set_rank(rank);
    r.set_step(step);
    if (loaded) r.mutable_startup()->set_checkpoint_load_unix(clock_.UnixSeconds());
    if (train != nullptr) *r.mutable_train() = *train;
    ASSERT_TRUE(c_->PushTelemetry(batch).ok());
  }

  // Runs attempt `n` of job_ (two ranks on workers 0 and 1; after attempt 1, once its backoff of
  // at most 1.1 s has passed) to RUNNING and returns the memory policy its start commands carried,
  // which both ranks and the attempt's record must agree on.
  std::string RunMemoryAttempt(uint32_t n) {
    if (n > 1) {
      clock_.Advance(1.1);
      HeartbeatAll(2);
      c_->Tick();
    }
    std::string policy;
    for (int s = 0; s < 2; ++s) {
      std::vector<v1::RankTask> starts;  // rank 1 also finds the stop of the failed attempt
      for (const auto& cmd : Commands(s)) {
        if (cmd.has_start()) starts.push_back(cmd.start());
      }
      EXPECT_EQ(starts.size(), 1u);
      if (starts.size() != 1u) return "(no start)";
      EXPECT_EQ(starts[0].attempt(), n);
      if (s == 1) {
        EXPECT_EQ(starts[0].spec().memory().policy(), policy);
      }
      policy = starts[0].spec().memory().policy();
      Report(s, n, s, v1::RANK_STARTED);
    }
    EXPECT_EQ(Job().summary().state(), v1::JOB_RUNNING);
    EXPECT_EQ(Job().attempts(n - 1).memory_policy(), policy);
    return policy;
  }

  // Two workers, the job submitted, both ranks started: RUNNING at attempt 1. `tasks`, when
  // given, gets the ranks' start commands.
  void StartRunning(const char* yaml = kJob, std::vector<v1::RankTask>* tasks = nullptr) {
    Register(0);
    Register(1);
    auto id = c_->Submit(yaml, "t.yaml");
    ASSERT_TRUE(id.ok()) << id.status();
    job_ = *id;
    for (int s = 0; s < 2; ++s) {
      auto cmds = Commands(s);
      ASSERT_EQ(cmds.size(), 1u);
      ASSERT_TRUE(cmds[0].has_start());
      if (tasks != nullptr) tasks->push_back(cmds[0].start());
      EXPECT_EQ(cmds[0].start().rank(), static_cast<uint32_t>(s));
      EXPECT_EQ(cmds[0].start().world_size(), 2u);
      EXPECT_EQ(cmds[0].start().attempt(), 1u);
    }
    EXPECT_EQ(Job().summary().state(), v1::JOB_STARTING);
    Report(0, 1, 0, v1::RANK_STARTED);
    Report(1, 1, 1, v1::RANK_STARTED);
    EXPECT_EQ(Job().summary().state(), v1::JOB_RUNNING);
  }

  int ThreeAttemptsWithAStoppingRank();

  // What changed written behind (a tick 2 s on), then the controller restarted.
  void WriteBehindAndRestart(int workers) {
    clock_.Advance(2);
    HeartbeatAll(workers);
    c_->Tick();
    Restart();
  }

  // Attempt 1's rank 1 killed, rank 0 stopped, the backoff (1 s) over: attempt 2 placed.
  void FailAndRestart() {
    Report(1, 1, 1, v1::RANK_EXITED, v1::EXIT_KIND_SIGNAL, "killed by signal 9 (SIGKILL)");
    Commands(0);  // the survivor's stop
    Report(0, 1, 0, v1::RANK_EXITED, v1::EXIT_KIND_STOPPED, "stopped");
    clock_.Advance(1.1);
    HeartbeatAll(2);
    c_->Tick();
    ASSERT_EQ(Job().summary().attempt(), 2u);
  }

  // Rank `rank`'s record (its `seq`-th) of step `step` of job_'s attempt 1: 1,000 tokens in 0.5 s.
  v1::TelemetryRecord StepRecord(uint32_t rank, uint64_t seq, uint64_t step) const {
    v1::TelemetryRecord r;
    r.set_job_id(job_);
    r.set_attempt(1);
    r.set_rank(rank);
    r.set_seq(seq);
    r.set_step(step);
    r.mutable_train()->set_tokens(1000);
    r.mutable_train()->set_step_seconds(0.5);
    return r;
  }
  // Pushes `records` from worker h/<slot>, asking how far job_'s steps are stored, and returns the
  // answer for job_. The push's status goes to `status`, else it must be OK.
  v1::SettledSteps PushAsking(int slot, std::vector<v1::TelemetryRecord> records,
                              absl::Status* status = nullptr) {
    v1::TelemetryBatch batch;
    batch.set_worker_id("h/" + std::to_string(slot));
    batch.add_unsettled_jobs(job_);
    for (auto& r : records) *batch.add_records() = std::move(r);
    v1::TelemetryAck ack;
    const absl::Status pushed = c_->PushTelemetry(batch, &ack);
    if (status != nullptr) {
      *status = pushed;
    } else {
      EXPECT_TRUE(pushed.ok()) << pushed;
    }
    EXPECT_EQ(ack.settled_size(), 1);
    return ack.settled_size() == 1 ? ack.settled(0) : v1::SettledSteps();
  }

  // Makes every update of the jobs table fail, or lifts that: another connection adds (drops) a
  // trigger, so the controller's own writes of job summaries return an error.
  void FailJobWrites(bool fail) { FailWrites("fail_jobs", "BEFORE UPDATE ON jobs", fail); }
  // The same for the writes of aggregated steps (job_steps).
  void FailStepWrites(bool fail) { FailWrites("fail_steps", "BEFORE INSERT ON job_steps", fail); }
  // Adds (drops) the trigger `name`, which makes every `when` statement fail.
  void FailWrites(const std::string& name, const std::string& when, bool fail) {
    sqlite3* db = nullptr;
    ASSERT_EQ(sqlite3_open((dir_ / "furnace.db").c_str(), &db), SQLITE_OK);
    // The controller writes records behind on a thread of its own: wait for its transaction.
    sqlite3_busy_timeout(db, 10000);
    const std::string sql = fail ? "CREATE TRIGGER " + name + " " + when +
                                       " BEGIN SELECT RAISE(ABORT, 'injected failure'); END;"
                                 : "DROP TRIGGER " + name + ";";
    char* err = nullptr;
    const int rc = sqlite3_exec(db, sql.c_str(), nullptr, nullptr, &err);
    const std::string message = err ? err : "";
    sqlite3_free(err);
    sqlite3_close(db);
    ASSERT_EQ(rc, SQLITE_OK) << message;
  }

  fs::path dir_;
  FakeClock clock_;
  std::unique_ptr<Controller> c_;
  std::map<int, std::string> sessions_;
  std::string job_;
  double telemetry_flush_s_ = 1.25;  // ControllerOptions::telemetry_flush_s at Restart (0: auto)
  double forget_lost_s_ = 86400;     // ControllerOptions::forget_lost_s at Restart
  double forget_ended_s_ = 0;        // ControllerOptions::forget_ended_s at Restart
  double default_time_limit_s_ = 0;  // ControllerOptions::default_time_limit_s at Restart
  double max_time_limit_s_ = 0;      // ControllerOptions::max_time_limit_s at Restart
};

// How often agents push telemetry (RegisterResponse and every HeartbeatResponse): a fixed
// --telemetry-flush as given; 0 sizes it to the workers heard from in this run, one second per
// 10,000 (a step's records then arrive at about 10,000 a second), from 0.2 s up to 2 s.
TEST_F(ControllerTest, TelemetryFlushIsSizedToTheFleetUnlessGiven) {
  v1::HeartbeatRequest h;
  h.set_worker_id("h/0");
  h.set_session_id(Register(0));
  EXPECT_EQ(c_->TryHeartbeat(h).telemetry_flush_s(), 1.25);  // given
  telemetry_flush_s_ = 0;
  Restart();
  h.set_session_id(Register(0));
  EXPECT_EQ(c_->TryHeartbeat(h).telemetry_flush_s(), 0.2);
  for (int slot = 1; slot < 12000; ++slot) Register(slot);
  EXPECT_DOUBLE_EQ(c_->TryHeartbeat(h).telemetry_flush_s(), 1.2);
  EXPECT_DOUBLE_EQ(c_->Heartbeat(h).telemetry_flush_s(), 1.2);
  EXPECT_TRUE(c_->TryHeartbeat(h).reconcile());
}

TEST_F(ControllerTest, RefusedJobsLeaveNoTrace) {
  Register(0);
  auto too_big = c_->Submit(kJob, "t.yaml");  // needs 2 ranks, 1 worker
  ASSERT_FALSE(too_big.ok());
  EXPECT_EQ(too_big.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(too_big.status().message().find("needs 2 ranks"), absl::string_view::npos);
  auto bad = c_->Submit("name: t\nkind: commcheck\nparallel: {dp: -1}\n", "bad.yaml");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("bad.yaml:3"), absl::string_view::npos);
  auto train = c_->Submit("name: t\nkind: train\nparallel: {dp: 2}\n", "train.yaml");
  ASSERT_FALSE(train.ok());
  EXPECT_NE(train.status().message().find("needs 2 ranks"), absl::string_view::npos);
  EXPECT_TRUE(c_->ListJobs().empty());
  EXPECT_TRUE(Commands(0).empty());
}

TEST_F(ControllerTest, HappyPathToSucceeded) {
  StartRunning();
  Report(0, 1, 0, v1::RANK_EXITED, v1::EXIT_KIND_SUCCESS);
  EXPECT_EQ(Job().summary().state(), v1::JOB_RUNNING);
  Report(1, 1, 1, v1::RANK_EXITED, v1::EXIT_KIND_SUCCESS);
  auto d = Job();
  EXPECT_EQ(d.summary().state(), v1::JOB_SUCCEEDED);
  EXPECT_EQ(d.attempts(0).state(), v1::ATTEMPT_STATE_SUCCEEDED);
  for (auto& w : c_->ListWorkers()) EXPECT_EQ(w.state(), v1::WORKER_STATE_READY);
  // Re-sent report (the agent retries until acked) changes nothing.
  Report(1, 1, 1, v1::RANK_EXITED, v1::EXIT_KIND_SUCCESS);
  EXPECT_EQ(Job().summary().state(), v1::JOB_SUCCEEDED);
}

TEST_F(ControllerTest, RankFailureRecoversWithBackoffAndFencing) {
  StartRunning();
  v1::KvSetRequest set;
  set.mutable_scope()->set_job_id(job_);
  set.mutable_scope()->set_attempt(1);
  set.set_key("k");
  set.set_value("v");
  ASSERT_TRUE(c_->KvSet(set).ok());

  Report(1, 1, 1, v1::RANK_EXITED, v1::EXIT_KIND_SIGNAL, "killed by signal 9 (SIGKILL)");
  auto d = Job();
  EXPECT_EQ(d.summary().state(), v1::JOB_RECOVERING);
  EXPECT_EQ(d.summary().restarts(), 1u);
  EXPECT_EQ(d.attempts(0).state(), v1::ATTEMPT_STATE_FAILED);
  EXPECT_NE(d.attempts(0).cause().find("rank 1 on h/1: killed by signal 9"), std::string::npos);
  // The surviving rank is told to stop; attempt 1's rendezvous scope is closed (fenced).
  auto cmds = Commands(0);
  ASSERT_EQ(cmds.size(), 1u);
  EXPECT_TRUE(cmds[0].has_stop());
  EXPECT_EQ(c_->KvSet(set).code(), absl::StatusCode::kFailedPrecondition);

  Report(0, 1, 0, v1::RANK_EXITED, v1::EXIT_KIND_STOPPED, "stopped");
  clock_.Advance(0.5);
  HeartbeatAll(2);
  c_->Tick();
  EXPECT_EQ(Job().summary().state(), v1::JOB_RECOVERING);  // backoff is 1 s
  clock_.Advance(0.6);
  HeartbeatAll(2);
  c_->Tick();
  d = Job();
  EXPECT_EQ(d.summary().state(), v1::JOB_STARTING);
  EXPECT_EQ(d.summary().attempt(), 2u);
  for (int s = 0; s < 2; ++s) {
    auto c = Commands(s);
    ASSERT_EQ(c.size(), 1u);
    EXPECT_EQ(c[0].start().attempt(), 2u);
  }
  set.mutable_scope()->set_attempt(2);
  EXPECT_TRUE(c_->KvSet(set).ok());
  // A late report from attempt 1 does not disturb attempt 2.
  Report(1, 1, 1, v1::RANK_EXITED, v1::EXIT_KIND_SIGNAL);
  EXPECT_EQ(Job().summary().state(), v1::JOB_STARTING);
}

// A rank's KvSet over its attempt's bounds (rendezvous.h) is refused before anything is written:
// RESOURCE_EXHAUSTED, which the rank's KV store does not retry.
TEST_F(ControllerTest, ARendezvousValueOverItsBoundIsRefusedAndNotStored) {
  StartRunning();
  v1::KvSetRequest set;
  set.mutable_scope()->set_job_id(job_);
  set.mutable_scope()->set_attempt(1);
  set.set_key("big");
  set.set_value(std::string(Rendezvous::LimitsFor(2).value_bytes + 1, 'x'));
  const absl::Status refused = c_->KvSet(set);
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted) << refused;
  EXPECT_NE(refused.message().find("a value is at most"), absl::string_view::npos) << refused;
  v1::KvGetRequest get;
  *get.mutable_scope() = set.scope();
  get.add_keys("big");
  std::promise<absl::StatusOr<v1::KvGetResponse>> got;
  c_->KvGet(get, [&](absl::StatusOr<v1::KvGetResponse> r) { got.set_value(std::move(r)); });
  EXPECT_EQ(got.get_future().get().status().code(), absl::StatusCode::kDeadlineExceeded);
  set.set_value("an address");
  EXPECT_TRUE(c_->KvSet(set).ok());
}

// A controller restarted during a job's restart backoff keeps what is left of it (from the failed
// attempt's recover_at_unix), rather than placing the next attempt at once.
// One controller per state dir: a second one (a leftover, or two started by mistake) is refused
// before it opens the database, naming the holder's pid; once the first is gone the directory is
// free again.
TEST_F(ControllerTest, ASecondControllerOnTheStateDirIsRefused) {
  ControllerOptions o;
  o.state_dir = dir_.string();
  o.advertise_address = "127.0.0.1:1";
  auto second = Controller::Create(o, clock_);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(second.status().message().find(
                absl::StrCat("in use by another controller (pid ", ::getpid(), ")")),
            std::string::npos)
      << second.status();
  Restart();  // the first goes, then a new one takes the directory
  EXPECT_NE(c_, nullptr);
}

TEST_F(ControllerTest, ARestartedControllerKeepsTheRemainingBackoff) {
  StartRunning(R"(name: t
kind: commcheck
parallel: {dp: 2}
recovery:
  max_restarts: 2
  backoff: {initial_s: 60.0, max_s: 60.0}
  heartbeat_timeout_s: 5
  start_timeout_s: 20
)");
  Report(1, 1, 1, v1::RANK_EXITED, v1::EXIT_KIND_SIGNAL, "killed by signal 9 (SIGKILL)");
  Commands(0);  // the survivor's stop
  Report(0, 1, 0, v1::RANK_EXITED, v1::EXIT_KIND_STOPPED, "stopped");
  ASSERT_EQ(Job().summary().state(), v1::JOB_RECOVERING);
  clock_.Advance(10);
  HeartbeatAll(2);
  c_->Tick();  // writes the stop report's record behind (a restart would lose it otherwise)
  Restart();
  Register(0);
  Register(1);
  const auto tick_after = [&](double s) {
    clock_.Advance(s);
    HeartbeatAll(2);
    c_->Tick();
  };
  tick_after(1);
  tick_after(47);  // 58 s after the failure: 2 s of the backoff left
  EXPECT_EQ(Job().summary().state(), v1::JOB_RECOVERING);
  EXPECT_EQ(Job().summary().attempt(), 1u);
  EXPECT_TRUE(Commands(0).empty());
  tick_after(2.5);
  EXPECT_EQ(Job().summary().state(), v1::JOB_STARTING);
  EXPECT_EQ(Job().summary().attempt(), 2u);
}

// The backoff grows over failures without progress and starts again from initial_s after an
// attempt that got past the job's best step: it grew with every restart the job ever had, so a job
// training for days waited max_s after each failure once it had had a few.
TEST_F(ControllerTest, TheBackoffStartsAgainAfterAnAttemptThatMadeProgress) {
  StartRunning(R"(name: t
kind: commcheck
parallel: {dp: 2}
recovery:
  max_restarts: 10
  max_attempts_without_progress: 0
  backoff: {initial_s: 1.0, max_s: 30.0, multiplier: 4.0}
  heartbeat_timeout_s: 5
  start_timeout_s: 20
)");
  // Attempt n runs to `step` on both ranks, then rank 1 crashes; returns the restart's delay.
  const auto fail_at = [&](uint32_t n, uint64_t step) {
    PushStep(n, 0, step);
    PushStep(n, 1, step);
    Report(1, n, 1, v1::RANK_EXITED, v1::EXIT_KIND_SIGNAL, "killed by signal 9 (SIGKILL)");
    Report(0, n, 0, v1::RANK_EXITED, v1::EXIT_KIND_STOPPED, "stopped");
    const v1::AttemptInfo a = Job().attempts(n - 1);
    EXPECT_EQ(a.state(), v1::ATTEMPT_STATE_FAILED);
    const double delay = a.recover_at_unix() - a.ended_unix();
    clock_.Advance(delay + 0.1);
    HeartbeatAll(2);
    c_->Tick();
    EXPECT_EQ(Job().summary().attempt(), n + 1);
    for (int s = 0; s < 2; ++s) Commands(s);
    Report(0, n + 1, 0, v1::RANK_STARTED);
    Report(1, n + 1, 1, v1::RANK_STARTED);
    EXPECT_EQ(Job().summary().state(), v1::JOB_RUNNING);
    return delay;
  };
  EXPECT_DOUBLE_EQ(fail_at(1, 10), 1.0);
  EXPECT_DOUBLE_EQ(fail_at(2, 20), 1.0);  // past step 10: progress
  EXPECT_DOUBLE_EQ(fail_at(3, 30), 1.0);
  EXPECT_DOUBLE_EQ(fail_at(4, 25), 1.0);   // not past 30: the first without progress
  EXPECT_DOUBLE_EQ(fail_at(5, 28), 4.0);   // the second in a row
  EXPECT_DOUBLE_EQ(fail_at(6, 30), 16.0);  // the third
  EXPECT_DOUBLE_EQ(fail_at(7, 31), 1.0);   // past 30 again
  EXPECT_EQ(Job().summary().restarts(), 7u);
}

TEST_F(ControllerTest, RestartBudgetExhaustedEndsFailedWithCause) {
  StartRunning();
  for (uint32_t attempt = 1; attempt <= 3; ++attempt) {
    if (attempt > 1) {
      clock_.Advance(10);
      HeartbeatAll(2);
      c_->Tick();
      Commands(0);
      Commands(1);
      Report(0, attempt, 0, v1::RANK_STARTED);
      Report(1, attempt, 1, v1::RANK_STARTED);
      ASSERT_EQ(Job().summary().state(), v1::JOB_RUNNING);
    }
    Report(0, attempt, 0, v1::RANK_EXITED, v1::EXIT_KIND_CODE, "exited with code 1");
    clock_.Advance(1.1);  // the settle window: no root cause from another rank came
    HeartbeatAll(2);
    c_->Tick();
    Report(1, attempt, 1, v1::RANK_EXITED, v1::EXIT_KIND_STOPPED);
  }
  auto d = Job();
  EXPECT_EQ(d.summary().state(), v1::JOB_FAILED);
  EXPECT_EQ(d.summary().restarts(), 2u);
  EXPECT_NE(d.summary().cause().find("exited with code 1"), std::string::npos);
  EXPECT_NE(d.summary().cause().find("gave up after 2 restarts"), std::string::npos);
  // The metric agrees with the summary: the third failure ended the job, it is not a restart.
  const MetricsSnapshot snap = c_->Metrics();
  ASSERT_EQ(snap.jobs.size(), 1u);
  EXPECT_EQ(snap.jobs[0].restarts_by_cause, (std::map<std::string, uint64_t>{{"exit", 2}}));
  EXPECT_EQ(snap.jobs[0].state, v1::JOB_FAILED);
  // A day after it ended the job leaves the export (not the store).
  clock_.Advance(kFinishedJobMetricsS - 1);
  EXPECT_EQ(c_->Metrics().jobs.size(), 1u);
  clock_.Advance(2);
  EXPECT_TRUE(c_->Metrics().jobs.empty());
  EXPECT_EQ(Job().summary().state(), v1::JOB_FAILED);
}

// Spikes are seeded by step, so a restart from the checkpoint under the same memory policy would
// run out of memory again forever: without a memory.device_budget each out-of-memory exit makes
// the next attempt one rung more conservative (none -> selective -> full_recompute), any other
// failure keeps the policy, and an out-of-memory exit under full_recompute ends the job instead
// of looping.
TEST_F(ControllerTest, OutOfMemoryExitsEscalateTheMemoryPolicyUntilNoneIsLeft) {
  Register(0);
  Register(1);
  auto id = c_->Submit(
      "name: t\nkind: train\nparallel: {dp: 2}\nrecovery:\n  max_restarts: 5\n"
      "  backoff: {initial_s: 1.0, max_s: 1.0, multiplier: 1.0}\n",
      "t.yaml");
  ASSERT_TRUE(id.ok()) << id.status();
  job_ = *id;
  // The rank's own out-of-memory exit (exit code 3), or another failure.
  auto fail_attempt = [&](uint32_t n, v1::ExitKind kind) {
    Report(0, n, 0, v1::RANK_EXITED, kind, "",
           kind == v1::EXIT_KIND_OOM ? v1::RANK_EXIT_OUT_OF_MEMORY : 0);
    Report(1, n, 1, v1::RANK_EXITED, v1::EXIT_KIND_STOPPED);
  };

  EXPECT_EQ(RunMemoryAttempt(1), "none");
  fail_attempt(1, v1::EXIT_KIND_OOM);
  EXPECT_EQ(RunMemoryAttempt(2), "selective");
  fail_attempt(2, v1::EXIT_KIND_SIGNAL);  // not a memory failure: the policy stays
  EXPECT_EQ(RunMemoryAttempt(3), "selective");
  // The kernel's OOM killer (host RAM, no exit code of the rank's): retried under the same policy.
  Report(0, 3, 0, v1::RANK_EXITED, v1::EXIT_KIND_OOM, "killed by signal 9, likely by the kernel");
  Report(1, 3, 1, v1::RANK_EXITED, v1::EXIT_KIND_STOPPED);
  EXPECT_EQ(Job().attempts(2).failure_kind(), "oom");
  EXPECT_FALSE(Job().attempts(2).activation_oom());
  EXPECT_EQ(RunMemoryAttempt(4), "selective");
  fail_attempt(4, v1::EXIT_KIND_OOM);
  EXPECT_EQ(RunMemoryAttempt(5), "full_recompute");
  fail_attempt(5, v1::EXIT_KIND_OOM);

  const v1::JobDetail d = Job();
  EXPECT_EQ(d.summary().state(), v1::JOB_FAILED);
  EXPECT_EQ(d.summary().restarts(), 4u);  // of 5 allowed: the last out-of-memory exit ended it
  EXPECT_NE(d.summary().cause().find("the last policy to try without a memory.device_budget"),
            std::string::npos)
      << d.summary().cause();
  EXPECT_EQ(d.spec().memory().policy(), "none");  // the submitted spec is kept as submitted
  std::vector<std::string> escalations;
  for (const auto& e : d.events()) {
    if (e.kind() == "escalate") escalations.push_back(e.message());
  }
  ASSERT_EQ(escalations.size(), 2u);
  EXPECT_EQ(escalations[0],
            "attempt 1 ran out of memory under memory.policy none; attempt 2 runs with selective");
  EXPECT_EQ(escalations[1],
            "attempt 4 ran out of memory under memory.policy selective; attempt 5 runs with "
            "full_recompute");
}

// With a budget the next attempt runs adaptive (it needs the least of every policy), and an
// out-of-memory exit under adaptive ends the job, blaming the step's routing.
TEST_F(ControllerTest, WithABudgetAnOutOfMemoryExitRestartsUnderAdaptiveAndAnAdaptiveOneEnds) {
  Register(0);
  Register(1);
  auto id = c_->Submit(
      "name: t\nkind: train\nparallel: {dp: 2}\nmemory: {policy: offload, device_budget: 4MiB, "
      "offload_ratio: 0.5}\nrecovery:\n  max_restarts: 5\n"
      "  backoff: {initial_s: 1.0, max_s: 1.0, multiplier: 1.0}\n",
      "t.yaml");
  ASSERT_TRUE(id.ok()) << id.status();
  job_ = *id;
  auto run_out = [&](uint32_t n) {
    Report(0, n, 0, v1::RANK_EXITED, v1::EXIT_KIND_OOM, "", v1::RANK_EXIT_OUT_OF_MEMORY);
    Report(1, n, 1, v1::RANK_EXITED, v1::EXIT_KIND_STOPPED);
  };
  EXPECT_EQ(RunMemoryAttempt(1), "offload");
  run_out(1);
  // Not full_recompute, which needs more than adaptive at any budget.
  EXPECT_EQ(RunMemoryAttempt(2), "adaptive");
  run_out(2);

  const v1::JobDetail d = Job();
  EXPECT_EQ(d.summary().state(), v1::JOB_FAILED);
  EXPECT_EQ(d.summary().restarts(), 1u);
  EXPECT_NE(d.summary().cause().find("under memory.policy adaptive, which needs the least"),
            std::string::npos)
      << d.summary().cause();
  EXPECT_NE(d.summary().cause().find("the step's routing sent a rank more rows"), std::string::npos)
      << d.summary().cause();
}

TEST_F(ControllerTest, SilentWorkerIsLostAndTheJobRecovers) {
  StartRunning();
  clock_.Advance(3);
  HeartbeatAll(2);
  c_->Tick();
  EXPECT_EQ(Job().summary().state(), v1::JOB_RUNNING);
  // Worker 1 goes silent; the job's heartbeat_timeout_s is 5.
  clock_.Advance(5.5);
  v1::HeartbeatRequest h;
  h.set_worker_id("h/0");
  h.set_session_id(sessions_[0]);
  c_->Heartbeat(h);
  c_->Tick();
  auto d = Job();
  EXPECT_EQ(d.summary().state(), v1::JOB_RECOVERING);
  EXPECT_NE(d.attempts(0).cause().find("worker h/1 lost"), std::string::npos);
  // It must register again before it gets work.
  h.set_worker_id("h/1");
  h.set_session_id(sessions_[1]);
  EXPECT_TRUE(c_->Heartbeat(h).reregister());
  bool lost = false;
  for (auto& w : c_->ListWorkers())
    lost |= w.worker_id() == "h/1" && w.state() == v1::WORKER_STATE_LOST;
  EXPECT_TRUE(lost);
}

TEST_F(ControllerTest, RootCauseWinsOverTheVictimsErrorExit) {
  StartRunning();
  // Rank 0's collective failed because rank 1 was killed; rank 0's report arrives first.
  Report(0, 1, 0, v1::RANK_EXITED, v1::EXIT_KIND_CODE, "exited with code 1: connection closed");
  EXPECT_EQ(Job().summary().state(), v1::JOB_RUNNING);  // settling
  Report(1, 1, 1, v1::RANK_EXITED, v1::EXIT_KIND_SIGNAL, "killed by signal 9 (SIGKILL)");
  auto d = Job();
  EXPECT_EQ(d.summary().state(), v1::JOB_RECOVERING);
  EXPECT_NE(d.attempts(0).cause().find("rank 1 on h/1: killed by signal 9"), std::string::npos);
}

// A record of a step past train.steps (a faulty or forged agent's) is not taken: it would become
// the job's newest step, and every real step after it would be dropped as stale.
TEST_F(ControllerTest, ARecordOfAStepPastTrainStepsIsNotTaken) {
  StartRunning("name: t\nkind: train\nparallel: {dp: 2}\ntrain: {steps: 100}\n");
  v1::StepTelemetry train;
  train.set_tokens(1000);
  train.set_step_seconds(0.5);
  PushStep(1, 0, 1000000000000, false, &train);
  PushStep(1, 1, 1000000000000, false, &train);
  for (uint64_t step : {1, 2}) {
    PushStep(1, 0, step, false, &train);
    PushStep(1, 1, step, false, &train);
  }
  v1::GetJobSeriesRequest req;
  req.set_job_id(job_);
  auto series = c_->GetJobSeries(req);
  ASSERT_TRUE(series.ok()) << series.status();
  ASSERT_EQ(series->steps_size(), 2);
  EXPECT_EQ(series->steps(0).step(), 1u);
  EXPECT_EQ(series->steps(1).step(), 2u);
  EXPECT_EQ(Job().summary().step(), 2u);
}

// An agent re-sends a batch whose answer it lost (a deadline passed after the controller took
// it): the records come again with the same seq, and nothing is counted twice: rank 0's record
// does not stand in for rank 1's in the step, the step's tokens are each rank's once, and the
// uncommitted checkpoint is one event. A record with a new seq is counted.
TEST_F(ControllerTest, ARecordSentAgainIsCountedOnce) {
  StartRunning();
  const auto record = [&](uint32_t rank, uint64_t seq, uint64_t step) {
    v1::TelemetryRecord r = StepRecord(rank, seq, step);
    r.mutable_train()->set_checkpoint_error("write step-00000001: No space left on device");
    return r;
  };
  v1::TelemetryBatch batch;
  batch.set_worker_id("h/0");
  *batch.add_records() = record(0, 7, 1);
  ASSERT_TRUE(c_->PushTelemetry(batch).ok());
  ASSERT_TRUE(c_->PushTelemetry(batch).ok());  // the same batch again
  v1::GetJobSeriesRequest req;
  req.set_job_id(job_);
  EXPECT_EQ(c_->GetJobSeries(req)->steps_size(), 0);  // rank 1 has not reported step 1
  batch.clear_records();
  batch.set_worker_id("h/1");  // rank 1's worker
  *batch.add_records() = record(1, 3, 1);
  ASSERT_TRUE(c_->PushTelemetry(batch).ok());
  auto series = c_->GetJobSeries(req);
  ASSERT_TRUE(series.ok());
  ASSERT_EQ(series->steps_size(), 1);
  EXPECT_EQ(series->steps(0).ranks(), 2u);
  EXPECT_DOUBLE_EQ(series->steps(0).tokens(), 2000);
  int failed = 0;
  const v1::JobDetail detail = Job();
  for (const auto& e : detail.events()) failed += e.kind() == "checkpoint_failed";
  EXPECT_EQ(failed, 1);
  EXPECT_EQ(Job().attempts(0).ranks(0).telemetry_seq(), 7u);
  // Newer records of both ranks (each from its own worker) complete step 2.
  batch.clear_records();
  *batch.add_records() = record(1, 4, 2);
  ASSERT_TRUE(c_->PushTelemetry(batch).ok());
  batch.clear_records();
  batch.set_worker_id("h/0");
  *batch.add_records() = record(0, 8, 2);
  ASSERT_TRUE(c_->PushTelemetry(batch).ok());
  EXPECT_EQ(c_->GetJobSeries(req)->steps_size(), 2);
  // Paged (furnace report): a page of one, then the last, and no cursor beside a thinning.
  v1::GetJobSeriesRequest paged;
  paged.set_job_id(job_);
  paged.set_page_size(1);
  auto first = c_->GetJobSeries(paged);
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_EQ(first->steps_size(), 1);
  EXPECT_TRUE(first->more());
  paged.set_after_attempt(first->steps(0).attempt());
  paged.set_after_step(first->steps(0).step());
  auto second = c_->GetJobSeries(paged);
  ASSERT_TRUE(second.ok()) << second.status();
  ASSERT_EQ(second->steps_size(), 1);
  EXPECT_EQ(second->steps(0).step(), 2u);
  EXPECT_FALSE(second->more());
  paged.set_max_points(10);
  EXPECT_TRUE(absl::IsInvalidArgument(c_->GetJobSeries(paged).status()));
  paged.set_max_points(0);
  paged.set_page_size(kMaxSeriesPageSize + 1);
  EXPECT_TRUE(absl::IsInvalidArgument(c_->GetJobSeries(paged).status()));
  // Thinned to more points than one reply holds: refused, naming the field.
  req.set_max_points(kMaxSeriesPageSize + 1);
  const absl::Status too_many = c_->GetJobSeries(req).status();
  EXPECT_TRUE(absl::IsInvalidArgument(too_many)) << too_many;
  EXPECT_NE(too_many.message().find("max_points"), absl::string_view::npos) << too_many;
  EXPECT_EQ(Job().attempts(0).ranks(1).step(), 2u);
  EXPECT_DOUBLE_EQ(c_->Metrics().jobs[0].tokens_total, 4000);
}

v1::RunningRank Running(const std::string& job, uint32_t attempt, uint32_t rank);  // below

// The job's step (status, furnace_job_step) is written behind, its steps as they complete: a
// controller killed between the two starts from the stored steps, not from the older summary, so
// the step a dashboard plotted never goes back (the ETA panel divides by its rate).
TEST_F(ControllerTest, AControllerKilledBeforeItsWriteBehindKeepsTheJobsStoredStep) {
  StartRunning();
  uint64_t seq = 0;
  const auto both = [&](uint64_t step) {
    ++seq;
    PushAsking(0, {StepRecord(0, seq, step)});
    PushAsking(1, {StepRecord(1, seq, step)});
  };
  both(1);
  both(2);
  clock_.Advance(2);
  HeartbeatAll(2);
  c_->Tick();  // written behind at step 2
  both(3);
  both(4);
  both(5);  // stored as steps, not yet in the summary
  ASSERT_EQ(Job().summary().step(), 5u);
  ASSERT_EQ(c_->Metrics().jobs[0].step, 5u);
  Restart();  // killed: no write behind
  EXPECT_EQ(Job().summary().step(), 5u);
  EXPECT_EQ(c_->Metrics().jobs[0].step, 5u);
  Register(0, 100, {Running(job_, 1, 0)});
  Register(1, 100, {Running(job_, 1, 1)});
  // Rank 1's agent re-sends step 4's record (stored, not yet settled), its seq above the one
  // written behind: counted as sent, not as a step back.
  PushAsking(1, {StepRecord(1, 4, 4)});
  EXPECT_EQ(Job().attempts(0).ranks(1).step(), 5u);
  EXPECT_EQ(c_->Metrics().jobs[0].step, 5u);
  // Rank 0 is one step ahead of rank 1 after the restart: the job is at rank 1's step, 5.
  ++seq;
  PushAsking(0, {StepRecord(0, seq, 6)});
  EXPECT_EQ(Job().summary().step(), 5u);
  EXPECT_EQ(Job().attempts(0).ranks(1).step(), 5u);
  EXPECT_EQ(c_->Metrics().jobs[0].step, 5u);
  PushAsking(1, {StepRecord(1, seq, 6)});
  EXPECT_EQ(c_->Metrics().jobs[0].step, 6u);
}

// A controller killed while it merges a step (one rank's record in, the other's not yet) loses
// that record with its memory. The agent held it (acknowledged, not stored: TelemetryAck.settled)
// and pushes it again to the controller it registers with next, which counts it toward the step
// although its seq was stored as counted (not as progress again), so the step is stored whole.
TEST_F(ControllerTest, AStepBeingMergedWhenTheControllerDiesIsStoredWhole) {
  StartRunning();
  const auto record = [&](uint32_t rank, uint64_t seq, uint64_t step) {
    return StepRecord(rank, seq, step);
  };
  const auto push = [&](int slot, std::vector<v1::TelemetryRecord> records) {
    return PushAsking(slot, std::move(records));
  };
  v1::SettledSteps settled = push(0, {record(0, 7, 1)});
  EXPECT_EQ(settled.job_id(), job_);
  EXPECT_EQ(settled.step(), 0u);  // nothing stored yet: the agent holds the record
  EXPECT_FALSE(settled.all());
  WriteBehindAndRestart(2);  // rank 0's seq 7 is stored as counted; its step 1 only in memory
  ASSERT_EQ(Job().attempts(0).ranks(0).telemetry_seq(), 7u);
  v1::GetJobSeriesRequest req;
  req.set_job_id(job_);
  ASSERT_EQ(c_->GetJobSeries(req)->steps_size(), 0);
  Register(0, 100, {Running(job_, 1, 0)});
  Register(1, 100, {Running(job_, 1, 1)});

  push(0, {record(0, 7, 1)});  // rank 0's agent registered anew: what it held, again
  push(1, {record(1, 3, 1)});
  auto series = c_->GetJobSeries(req);
  ASSERT_TRUE(series.ok()) << series.status();
  ASSERT_EQ(series->steps_size(), 1);
  EXPECT_EQ(series->steps(0).ranks(), 2u);
  EXPECT_DOUBLE_EQ(series->steps(0).tokens(), 2000);
  // Now stored: the next answer lets both agents go of step 1.
  settled = push(1, {});
  EXPECT_EQ(settled.attempt(), 1u);
  EXPECT_EQ(settled.step(), 1u);
  EXPECT_FALSE(settled.all());  // the job runs on
  // Sent again once more (another registration): stored already, not counted twice.
  push(0, {record(0, 7, 1)});
  EXPECT_DOUBLE_EQ(c_->GetJobSeries(req)->steps(0).tokens(), 2000);
  EXPECT_EQ(Job().attempts(0).ranks(0).telemetry_seq(), 7u);
  EXPECT_DOUBLE_EQ(c_->Metrics().jobs[0].tokens_total, 2000);

  // A job the controller does not know (deleted): all of it is settled.
  v1::TelemetryBatch unknown;
  unknown.set_worker_id("h/0");
  unknown.add_unsettled_jobs("no-such-job");
  v1::TelemetryAck ack;
  ASSERT_TRUE(c_->PushTelemetry(unknown, &ack).ok());
  ASSERT_EQ(ack.settled_size(), 1);
  EXPECT_TRUE(ack.settled(0).all());
}

// A step whose write failed (a full disk) is not settled: the agents keep its records, and the
// controller writes it again (every TelemetryAggregator::kStepRetryS) until it is stored.
TEST_F(ControllerTest, AStepWhoseWriteFailedIsKeptByTheAgentsAndWrittenAgain) {
  StartRunning();
  const auto record = [&](uint32_t rank, uint64_t seq, uint64_t step) {
    return StepRecord(rank, seq, step);
  };
  const auto ask = [&](int slot, std::vector<v1::TelemetryRecord> records) {
    absl::Status written;  // (a push whose write failed says so: not checked here)
    return PushAsking(slot, std::move(records), &written);
  };
  ask(0, {record(0, 1, 1)});
  ask(1, {record(1, 1, 1)});
  ask(0, {record(0, 2, 2)});
  ask(1, {record(1, 2, 2)});
  ASSERT_EQ(ask(0, {}).step(), 2u);
  FailStepWrites(true);
  ask(0, {record(0, 3, 3)});
  ask(1, {record(1, 3, 3)});  // step 3 complete: its write fails
  ask(0, {record(0, 4, 4)});
  ask(1, {record(1, 4, 4)});  // step 4's too
  v1::SettledSteps settled = ask(0, {});
  EXPECT_EQ(settled.attempt(), 1u);
  EXPECT_EQ(settled.step(), 2u);  // below the first step not written
  EXPECT_FALSE(settled.all());
  v1::GetJobSeriesRequest req;
  req.set_job_id(job_);
  EXPECT_EQ(c_->GetJobSeries(req)->steps_size(), 2);

  FailStepWrites(false);  // room on the disk again
  clock_.Advance(TelemetryAggregator::kStepRetryS + 0.1);
  c_->Tick();
  for (int i = 0; i < 100 && c_->GetJobSeries(req)->steps_size() < 4; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  auto series = c_->GetJobSeries(req);
  ASSERT_EQ(series->steps_size(), 4);
  EXPECT_EQ(series->steps(3).ranks(), 2u);
  // (Settled once the write is answered, a moment after the row is visible.)
  for (int i = 0; i < 100 && ask(0, {}).step() < 4; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(ask(0, {}).step(), 4u);
  EXPECT_DOUBLE_EQ(c_->Metrics().jobs[0].tokens_total, 8000);
}

// An attempt that failed with a step some rank never reported: the step is stored with the ranks
// that did once the attempt's last batches had time to come (Controller::kEndedSettleS), while
// the job recovers (or its next attempt starts), so no agent holds its records until the next
// attempt trains a step.
TEST_F(ControllerTest, AnEndedAttemptsUnfinishedStepIsStoredWhileTheJobRecovers) {
  StartRunning();
  PushAsking(0, {StepRecord(0, 1, 1)});  // rank 1's record of step 1 never comes
  Report(1, 1, 1, v1::RANK_EXITED, v1::EXIT_KIND_SIGNAL, "killed by signal 9 (SIGKILL)");
  Commands(0);
  Report(0, 1, 0, v1::RANK_EXITED, v1::EXIT_KIND_STOPPED, "stopped");
  ASSERT_EQ(Job().summary().state(), v1::JOB_RECOVERING);
  v1::GetJobSeriesRequest req;
  req.set_job_id(job_);
  c_->Tick();
  EXPECT_EQ(c_->GetJobSeries(req)->steps_size(), 0);  // its last batches may still come
  clock_.Advance(11);                                 // past Controller::kEndedSettleS (10 s)
  c_->Tick();
  for (int i = 0; i < 100 && c_->GetJobSeries(req)->steps_size() < 1; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));  // (written behind)
  }
  auto series = c_->GetJobSeries(req);
  ASSERT_EQ(series->steps_size(), 1);
  EXPECT_EQ(series->steps(0).ranks(), 1u);
  // (Settled once the write is answered, a moment after the row is visible.)
  v1::SettledSteps settled = PushAsking(0, {});
  for (int i = 0; i < 100 && settled.step() != 1; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    settled = PushAsking(0, {});
  }
  EXPECT_EQ(settled.attempt(), 1u);
  EXPECT_EQ(settled.step(), 1u);
}

// An ended job is all settled (the agents let go of every record of it) only once its ranks' last
// batches had time to come (Controller::kEndedSettleS), and nothing of it waits for the disk.
TEST_F(ControllerTest, AnEndedJobIsAllSettledOnceItsLastBatchesHadTimeToCome) {
  StartRunning();
  PushAsking(0, {StepRecord(0, 1, 1)});
  PushAsking(1, {StepRecord(1, 1, 1)});  // step 1 complete, written before this answers
  Report(0, 1, 0, v1::RANK_EXITED, v1::EXIT_KIND_SUCCESS);
  Report(1, 1, 1, v1::RANK_EXITED, v1::EXIT_KIND_SUCCESS);
  ASSERT_EQ(Job().summary().state(), v1::JOB_SUCCEEDED);
  const auto settled = [&] { return PushAsking(0, {}); };
  EXPECT_FALSE(settled().all());
  EXPECT_EQ(settled().step(), 1u);
  clock_.Advance(11);  // past Controller::kEndedSettleS (10 s)
  EXPECT_TRUE(settled().all());
}

TEST_F(ControllerTest, ErrorExitFailsWhenEveryRankHasEnded) {
  StartRunning();
  Report(0, 1, 0, v1::RANK_EXITED, v1::EXIT_KIND_SUCCESS);
  Report(1, 1, 1, v1::RANK_EXITED, v1::EXIT_KIND_CODE, "exited with code 3");
  auto d = Job();
  EXPECT_EQ(d.summary().state(), v1::JOB_RECOVERING);  // nothing left to wait for
  EXPECT_NE(d.attempts(0).cause().find("exited with code 3"), std::string::npos);
}

// checkpoint.async: a checkpoint the ranks could not commit (every rank reports the same error)
// is one event naming the step and the error; the job keeps running.
TEST_F(ControllerTest, AnUncommittedCheckpointIsOneEvent) {
  StartRunning();
  v1::TelemetryBatch batch;
  batch.set_worker_id("h/0");
  for (uint32_t rank : {0u, 1u}) {
    v1::TelemetryRecord& r = *batch.add_records();
    r.set_job_id(job_);
    r.set_attempt(1);
    r.set_rank(rank);
    r.set_step(10);
    r.mutable_train()->set_step_seconds(0.5);
    r.mutable_train()->set_checkpoint_error("write step-00000010: No space left on device");
  }
  ASSERT_TRUE(c_->PushTelemetry(batch).ok());
  const v1::JobDetail d = Job();
  std::vector<std::string> failed;
  for (const auto& e : d.events()) {
    if (e.kind() == "checkpoint_failed") failed.push_back(e.message());
  }
  ASSERT_EQ(failed.size(), 1u);
  EXPECT_NE(failed[0].find("after step 10 was not committed"), std::string::npos) << failed[0];
  EXPECT_NE(failed[0].find("No space left on device"), std::string::npos) << failed[0];
  EXPECT_EQ(d.summary().state(), v1::JOB_RUNNING);
}

TEST_F(ControllerTest, StepsAreAggregatedOverRanksAndSurviveARestart) {
  StartRunning();
  auto record = [&](uint32_t rank, uint64_t step, double step_s, uint64_t tokens,
                    std::vector<uint64_t> experts) {
    v1::TelemetryRecord r;
    r.set_job_id(job_);
    r.set_attempt(1);
    r.set_rank(rank);
    r.set_step(step);
    v1::StepTelemetry& t = *r.mutable_train();
    t.set_loss(2.0 + rank);
    t.set_aux_loss(0.01);
    t.set_tokens(tokens);
    t.set_step_seconds(step_s);
    t.set_checkpoint_stall_seconds(0.125 * (rank + 1));
    t.set_mfu(0.4);
    t.mutable_memory()->set_activation_peak_bytes(100 * (rank + 1));
    t.mutable_memory()->set_budget_bytes(1000);
    v1::MoeLayerTelemetry* layer = t.add_moe_layers();
    for (uint64_t e : experts) layer->add_expert_tokens(e);
    v1::CommTelemetry* c = t.add_comm();
    c->set_op(v1::COLLECTIVE_OP_ALL_TO_ALL);
    c->set_group(v1::PARALLEL_GROUP_EP);
    c->set_bytes(10);
    c->set_seconds(0.25);
    c->set_calls(1);
    v1::MoeOpTelemetry* op = t.add_moe_ops();
    op->set_op("a2a(ep)");
    op->set_bytes(8);
    op->set_seconds(0.125);
    op->set_calls(2);
    return r;
  };
  v1::TelemetryBatch batch;
  batch.set_worker_id("h/0");
  *batch.add_records() = record(0, 1, 0.5, 1000, {3, 1});
  ASSERT_TRUE(c_->PushTelemetry(batch).ok());
  v1::GetJobSeriesRequest req;
  req.set_job_id(job_);
  EXPECT_EQ(c_->GetJobSeries(req)->steps_size(), 0);  // rank 1 has not reported step 1 yet
  batch.clear_records();
  batch.set_worker_id("h/1");  // rank 1's worker
  batch.set_dropped(7);
  *batch.add_records() = record(1, 1, 0.8, 1000, {1, 3});
  ASSERT_TRUE(c_->PushTelemetry(batch).ok());
  auto series = c_->GetJobSeries(req);
  ASSERT_TRUE(series.ok());
  ASSERT_EQ(series->steps_size(), 1);
  const auto& st = series->steps(0);
  EXPECT_EQ(st.ranks(), 2u);
  EXPECT_DOUBLE_EQ(st.step_seconds(), 0.8);               // the slowest rank
  EXPECT_DOUBLE_EQ(st.checkpoint_stall_seconds(), 0.25);  // the rank held longest
  EXPECT_DOUBLE_EQ(st.tokens(), 2000);
  EXPECT_DOUBLE_EQ(st.tokens_per_second(), 2500);
  EXPECT_DOUBLE_EQ(st.loss(), 2.5);
  EXPECT_DOUBLE_EQ(st.activation_peak_bytes(), 200);
  ASSERT_EQ(st.imbalance_size(), 1);
  EXPECT_DOUBLE_EQ(st.imbalance(0), 1.0);  // {4, 4} over both ranks
  ASSERT_EQ(st.comm_size(), 1);
  EXPECT_EQ(st.comm(0).op(), v1::COLLECTIVE_OP_ALL_TO_ALL);
  EXPECT_EQ(st.comm(0).group(), v1::PARALLEL_GROUP_EP);
  EXPECT_EQ(st.comm(0).bytes(), 20u);
  EXPECT_DOUBLE_EQ(st.comm(0).seconds(), 0.5);
  EXPECT_EQ(st.comm(0).calls(), 2u);
  // `furnace status` gets the job's MFU, the aggregated step's (the dashboard's figure).
  const v1::JobDetail detail = Job();
  EXPECT_DOUBLE_EQ(detail.job_mfu(), st.mfu());
  EXPECT_GT(detail.job_mfu(), 0);
  EXPECT_EQ(detail.job_mfu_step(), 1u);
  auto snap = c_->Metrics();
  ASSERT_EQ(snap.jobs.size(), 1u);
  EXPECT_TRUE(snap.jobs[0].has_step);
  EXPECT_DOUBLE_EQ(snap.jobs[0].tokens_total, 2000);
  EXPECT_EQ(snap.jobs[0].comm_bytes_total, (std::map<std::string, double>{{"all_to_all", 20}}));
  EXPECT_EQ(snap.telemetry_dropped_total, 7u);
  EXPECT_EQ(snap.workers_by_state[v1::WORKER_STATE_BUSY], 2u);
  Report(1, 1, 1, v1::RANK_EXITED, v1::EXIT_KIND_SIGNAL, "killed by signal 9 (SIGKILL)");
  Restart();
  snap = c_->Metrics();
  EXPECT_DOUBLE_EQ(snap.jobs[0].tokens_total, 2000);  // history reloaded
  EXPECT_EQ(snap.jobs[0].comm_bytes_total, (std::map<std::string, double>{{"all_to_all", 20}}));
  EXPECT_EQ(snap.jobs[0].moe_op_bytes_total, (std::map<std::string, double>{{"a2a(ep)", 16}}));
  EXPECT_EQ(snap.jobs[0].moe_op_seconds_total, (std::map<std::string, double>{{"a2a(ep)", 0.25}}));
  EXPECT_EQ(snap.jobs[0].restarts_by_cause["signal"], 1u);
  EXPECT_EQ(c_->GetJobSeries(req)->steps_size(), 1);
}

constexpr const char* kAutoJob = R"(name: t
kind: train
parallel: {dp: 2}
checkpoint: {every: auto}
recovery:
  max_restarts: 2
  backoff: {initial_s: 1.0, max_s: 4.0, multiplier: 2.0}
  heartbeat_timeout_s: 5
  start_timeout_s: 20
)";

// A train job's total steps are known from its spec at once (a pending job shows 0/N). A restart
// does not set its progress back to 0 while the new attempt starts: it stays until every rank of
// the new attempt has said where it starts (the step it restored, or a start-up with none).
TEST_F(ControllerTest, ARestartKeepsTheJobsProgressUntilItsRanksSayWhereTheyStart) {
  StartRunning(kAutoJob);
  EXPECT_EQ(Job().summary().total_steps(), 100u);  // train.steps' default, from the spec
  const auto progress = [&] {
    clock_.Advance(2);  // what changed is written behind
    HeartbeatAll(2);
    c_->Tick();
    return Job().summary().step();
  };
  PushStep(1, 0, 7, false);
  PushStep(1, 1, 7, false);
  // Read as of now, not as last written (the summary is written behind).
  EXPECT_EQ(Job().summary().step(), 7u);
  EXPECT_EQ(c_->ListJobs()[0].step(), 7u);
  EXPECT_EQ(progress(), 7u);
  FailAndRestart();
  EXPECT_EQ(Job().summary().step(), 7u);
  PushStep(2, 0, 0, false);  // rank 0 connected, has not restored yet
  EXPECT_EQ(progress(), 7u);
  PushStep(2, 0, 5, false);   // restored step 5
  EXPECT_EQ(progress(), 7u);  // rank 1 has not said yet
  PushStep(2, 1, 5, false);
  EXPECT_EQ(progress(), 5u);
  PushStep(2, 0, 6, false);
  PushStep(2, 1, 6, false);
  EXPECT_EQ(progress(), 6u);
}

TEST_F(ControllerTest, ARestartFromNoCheckpointShowsStepZeroOnceItsRanksStart) {
  StartRunning(kAutoJob);
  PushStep(1, 0, 3, false);
  PushStep(1, 1, 3, false);
  FailAndRestart();
  PushStep(2, 0, 0, true);  // found no checkpoint: starts at 0
  PushStep(2, 1, 0, true);
  clock_.Advance(2);
  HeartbeatAll(2);
  c_->Tick();
  EXPECT_EQ(Job().summary().step(), 0u);
}

// Rank 1's telemetry never came (its agent was cut off) and the job ended: the steps rank 0
// reported are stored a settle time after the end, with the one rank that reported them.
TEST_F(ControllerTest, AnEndedJobsStepsAnAgentNeverReportedAreStoredAfterItSettles) {
  StartRunning(kAutoJob);
  v1::StepTelemetry train;
  train.set_loss(2.0);
  for (uint64_t step = 1; step <= 3; ++step) PushStep(1, 0, step, false, &train);
  Report(0, 1, 0, v1::RANK_EXITED, v1::EXIT_KIND_SUCCESS, "exited 0");
  Report(1, 1, 1, v1::RANK_EXITED, v1::EXIT_KIND_SUCCESS, "exited 0");
  ASSERT_EQ(Job().summary().state(), v1::JOB_SUCCEEDED);
  v1::GetJobSeriesRequest req;
  req.set_job_id(job_);
  clock_.Advance(5);
  HeartbeatAll(2);
  c_->Tick();
  EXPECT_EQ(c_->GetJobSeries(req)->steps_size(), 0);  // its last batches may still come
  clock_.Advance(6);
  HeartbeatAll(2);
  c_->Tick();
  for (int i = 0; i < 100 && c_->GetJobSeries(req)->steps_size() < 3; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));  // written behind
  }
  const auto series = c_->GetJobSeries(req);
  ASSERT_EQ(series->steps_size(), 3);
  EXPECT_EQ(series->steps(2).step(), 3u);
  EXPECT_EQ(series->steps(2).ranks(), 1u);
}

// A commcheck rank reports no start-up and counts its rounds from 0: a restarted commcheck job
// shows its new attempt's progress at once.
TEST_F(ControllerTest, ARestartedCommcheckShowsItsNewAttemptsProgress) {
  StartRunning();
  PushStep(1, 0, 4);
  PushStep(1, 1, 4);
  EXPECT_EQ(Job().summary().step(), 4u);
  FailAndRestart();
  PushStep(2, 0, 0);
  PushStep(2, 1, 0);
  EXPECT_EQ(Job().summary().step(), 0u);
}

TEST_F(ControllerTest, ATrainJobsTotalStepsComeFromItsSpec) {
  Register(0);
  Register(1);
  auto id = c_->Submit("name: t\nkind: train\nparallel: {dp: 2}\ntrain: {steps: 120}\n", "t.yaml");
  ASSERT_TRUE(id.ok()) << id.status();
  job_ = *id;
  EXPECT_EQ(Job().summary().total_steps(), 120u);
}

// Goodput from the aggregated steps and the attempts: a failure costs the restart and the steps
// redone since the checkpoint; the numbers come back the same from a restarted controller (the
// ledger is rebuilt from the stored steps). checkpoint.every auto's ranks are told the job's MTBF
// and what it measured.
TEST_F(ControllerTest, GoodputCountsRestartAndRedoneStepsAndSurvivesARestart) {
  std::vector<v1::RankTask> tasks;
  StartRunning(kAutoJob, &tasks);
  ASSERT_EQ(tasks.size(), 2u);
  ASSERT_TRUE(tasks[0].has_checkpoint_hint());
  EXPECT_TRUE(tasks[0].checkpoint_hint().mtbf_from_prior());
  EXPECT_DOUBLE_EQ(tasks[0].checkpoint_hint().mtbf_seconds(), kMtbfPriorSeconds);
  EXPECT_DOUBLE_EQ(tasks[0].checkpoint_hint().stall_seconds(), 0);

  const double t0 = clock_.UnixSeconds();  // attempt 1 placed
  // Both ranks report a 1 s step at `reported` (after its checkpoint stall, if any).
  const auto step = [&](uint32_t attempt, uint64_t n, double reported, double stall) {
    for (uint32_t rank = 0; rank < 2; ++rank) {
      v1::TelemetryBatch batch;
      batch.set_worker_id("h/" + std::to_string(rank));  // each rank's own worker
      v1::TelemetryRecord& r = *batch.add_records();
      r.set_job_id(job_);
      r.set_attempt(attempt);
      r.set_rank(rank);
      r.set_step(n);
      r.set_unix_time(reported);
      r.mutable_train()->set_step_seconds(1.0);
      r.mutable_train()->set_checkpoint_stall_seconds(stall);
      ASSERT_TRUE(c_->PushTelemetry(batch).ok());
    }
  };
  // Attempt 1: the first step starts 2 s after placement; a checkpoint (0.5 s) after step 2.
  step(1, 1, t0 + 3, 0);
  step(1, 2, t0 + 4.5, 0.5);
  step(1, 3, t0 + 5.5, 0);
  step(1, 4, t0 + 6.5, 0);
  clock_.Advance(7);
  FailAndRestart();
  EXPECT_GT(Job().goodput().recovering_seconds(), 0);
  for (int s = 0; s < 2; ++s) {
    auto cmds = Commands(s);
    ASSERT_EQ(cmds.size(), 1u);
    const v1::CheckpointHint& hint = cmds[0].start().checkpoint_hint();
    EXPECT_FALSE(hint.mtbf_from_prior());
    EXPECT_EQ(hint.failures(), 1u);
    EXPECT_DOUBLE_EQ(hint.mtbf_seconds(), 7.0);  // attempt 1 ran 7 s before it failed
    EXPECT_DOUBLE_EQ(hint.stall_seconds(), 0.5);
    EXPECT_DOUBLE_EQ(hint.step_seconds(), 1.0);
  }
  Report(0, 2, 0, v1::RANK_STARTED);
  Report(1, 2, 1, v1::RANK_STARTED);
  // Attempt 2 resumed from the checkpoint of step 2: steps 3 and 4 again, then 5.
  step(2, 3, t0 + 11, 0);
  step(2, 4, t0 + 12, 0);
  step(2, 5, t0 + 13, 0);

  const auto expect_numbers = [&](const v1::JobGoodput& g) {
    EXPECT_DOUBLE_EQ(g.productive_seconds(), 5.0);
    EXPECT_EQ(g.productive_steps(), 5u);
    EXPECT_DOUBLE_EQ(g.startup_seconds(), 2.0);
    EXPECT_DOUBLE_EQ(g.restart_seconds(), 3.5);  // step 4 reported at +6.5, step 3 began at +10
    EXPECT_DOUBLE_EQ(g.redone_seconds(), 2.0);
    EXPECT_EQ(g.redone_steps(), 2u);
    EXPECT_DOUBLE_EQ(g.checkpoint_stall_seconds(), 0.5);
    EXPECT_DOUBLE_EQ(g.ratio(), 5.0 / (5.0 + 2.0 + 3.5 + 2.0 + 0.5));
    EXPECT_DOUBLE_EQ(g.recovering_seconds(), 0);
    EXPECT_EQ(g.failures(), 1u);
  };
  expect_numbers(Job().goodput());
  auto snap = c_->Metrics();
  ASSERT_EQ(snap.jobs.size(), 1u);
  expect_numbers(snap.jobs[0].goodput);
  Restart();
  expect_numbers(Job().goodput());
  expect_numbers(c_->Metrics().jobs[0].goodput);
}

// The schema end to end: what a rank's worker makes of its step (worker/step_telemetry.h) is
// JobDetail.telemetry as rank 0 sent it, the series' aggregate over ranks, and the metrics
// snapshot's counters under the Prometheus labels.
// JobDetail.telemetry is the current attempt's: a failed attempt's last loss is shown while the
// job recovers from it, not beside the next attempt's step; that attempt's first step replaces it.
TEST_F(ControllerTest, DetailTelemetryIsTheCurrentAttempts) {
  StartRunning();
  const auto push = [&](uint32_t attempt, uint64_t step, double loss) {
    v1::TelemetryBatch batch;  // from the worker that holds rank 0 of the attempt
    batch.set_worker_id(Job().attempts(attempt - 1).ranks(0).worker_id());
    v1::TelemetryRecord* r = batch.add_records();
    r->set_job_id(job_);
    r->set_attempt(attempt);
    r->set_rank(0);
    r->set_step(step);
    r->mutable_train()->set_loss(loss);
    ASSERT_TRUE(c_->PushTelemetry(batch).ok());
  };
  push(1, 30, 1.8605);
  ASSERT_TRUE(Job().has_telemetry());
  Report(1, 1, 1, v1::RANK_EXITED, v1::EXIT_KIND_SIGNAL, "killed by signal 9 (SIGKILL)");
  Commands(0);
  Report(0, 1, 0, v1::RANK_EXITED, v1::EXIT_KIND_STOPPED, "stopped");
  ASSERT_EQ(Job().summary().state(), v1::JOB_RECOVERING);
  EXPECT_DOUBLE_EQ(Job().telemetry().loss(), 1.8605);  // the attempt it recovers from
  clock_.Advance(1.1);
  HeartbeatAll(2);
  c_->Tick();
  ASSERT_EQ(Job().summary().attempt(), 2u);
  EXPECT_FALSE(Job().has_telemetry());
  push(2, 1, 2.75);
  EXPECT_DOUBLE_EQ(Job().telemetry().loss(), 2.75);
}

TEST_F(ControllerTest, WorkerStepTelemetryReachesDetailSeriesAndMetrics) {
  StartRunning();
  train::StepStats s;
  s.step = 0;
  s.loss = 2.5;
  s.aux_loss = 0.02;
  s.tokens = 4096;
  s.step_seconds = 0.5;
  s.forward_backward_seconds = 0.4;
  s.sync_seconds = 0.06;
  s.optimizer_seconds = 0.04;
  s.tokens_per_second = 8192;
  s.grad_norm = 1.5;
  s.lr = 1e-3;
  s.dropped = 3;
  s.tokens_per_expert = {{30, 10}, {20, 20}};
  s.imbalance = {1.5, 1.0};
  s.activation_peak_bytes = 1 << 20;
  s.model_flops = 1e9;
  s.mfu = 0.25;
  s.in_flight_peak = 2;
  s.routing_spike = true;
  s.memory_actions = {.recomputed_bytes = 300, .offloaded_bytes = 700, .late_reloads = 2};
  s.comm = {{"ep", comm::CollectiveOp::kAllToAll, 4096, 4, 0.01},
            {"tp", comm::CollectiveOp::kAllReduce, 1024, 2, 0.002}};
  s.moe_schedules = {"s1", "s2"};
  s.moe_ops = {{.op = "mp_all_gather(tp)", .bytes = 512, .calls = 2, .seconds = 0.001},
               {.op = "a2a(ep)", .bytes = 2048, .calls = 4, .seconds = 0.02}};
  s.eval = train::EvalResult{.loss = 2.25, .perplexity = 9.4877, .batches = 4, .tokens = 512};
  std::vector<v1::StepTelemetry> sent;
  for (uint32_t rank = 0; rank < 2; ++rank) {
    v1::TelemetryBatch batch;
    batch.set_worker_id("h/" + std::to_string(rank));  // each rank's own worker
    sent.push_back(worker::StepTelemetryOf(
        s, {.reporter = rank == 0, .memory_budget_bytes = 1 << 22, .entropy_floor = 2.0}));
    v1::TelemetryRecord* r = batch.add_records();
    r->set_job_id(job_);
    r->set_attempt(1);
    r->set_rank(rank);
    r->set_step(1);
    *r->mutable_train() = sent.back();
    ASSERT_TRUE(c_->PushTelemetry(batch).ok());
  }

  const v1::JobDetail d = Job();
  ASSERT_TRUE(d.has_telemetry());
  EXPECT_EQ(d.telemetry().SerializeAsString(), sent[0].SerializeAsString());
  const v1::StepTelemetry& t = d.telemetry();
  EXPECT_DOUBLE_EQ(t.entropy_floor(), 2.0);
  EXPECT_EQ(t.tokens(), 4096u);
  EXPECT_EQ(t.dropped_tokens(), 3u);
  EXPECT_EQ(t.memory().budget_bytes(), 1u << 22);
  EXPECT_EQ(t.memory().pipeline_in_flight(), 2u);
  EXPECT_TRUE(t.routing_spike());
  ASSERT_EQ(t.moe_layers_size(), 2);
  EXPECT_EQ(t.moe_layers(1).layer(), 1u);
  EXPECT_EQ(t.moe_layers(0).schedule(), v1::MOE_LAYER_SCHEDULE_S1);
  EXPECT_EQ(t.moe_layers(1).schedule(), v1::MOE_LAYER_SCHEDULE_S2);
  ASSERT_EQ(t.moe_ops_size(), 2);  // the runtime's order
  EXPECT_EQ(t.moe_ops(0).op(), "mp_all_gather(tp)");
  EXPECT_EQ(t.moe_ops(0).bytes(), 512u);
  EXPECT_EQ(t.moe_ops(0).calls(), 2u);
  EXPECT_DOUBLE_EQ(t.moe_ops(0).seconds(), 0.001);
  EXPECT_EQ(t.moe_ops(1).op(), "a2a(ep)");
  EXPECT_EQ(std::vector<uint64_t>(t.moe_layers(0).expert_tokens().begin(),
                                  t.moe_layers(0).expert_tokens().end()),
            (std::vector<uint64_t>{30, 10}));
  ASSERT_EQ(t.comm_size(), 2);
  EXPECT_EQ(t.comm(0).op(), v1::COLLECTIVE_OP_ALL_TO_ALL);
  EXPECT_EQ(t.comm(0).group(), v1::PARALLEL_GROUP_EP);
  EXPECT_EQ(t.comm(1).group(), v1::PARALLEL_GROUP_TP);
  EXPECT_EQ(t.memory().late_reloads(), 2u);
  ASSERT_EQ(t.planner_size(), 2);  // compress had no bytes: left out
  EXPECT_EQ(t.planner(0).action(), v1::PLANNER_ACTION_OFFLOAD);
  EXPECT_EQ(t.planner(0).bytes(), 700u);
  EXPECT_EQ(t.planner(1).action(), v1::PLANNER_ACTION_RECOMPUTE);
  EXPECT_EQ(t.planner(1).bytes(), 300u);
  EXPECT_TRUE(sent[1].moe_layers(0).expert_tokens().empty());  // only rank 0 counts tokens
  EXPECT_EQ(sent[1].tokens(), 0u);

  v1::GetJobSeriesRequest req;
  req.set_job_id(job_);
  const auto series = c_->GetJobSeries(req);
  ASSERT_TRUE(series.ok()) << series.status();
  ASSERT_EQ(series->steps_size(), 1);
  const v1::StepRecord& st = series->steps(0);
  EXPECT_EQ(st.ranks(), 2u);
  // The held-out evaluation after this step: rank 0's, on the step, the detail and the metrics.
  EXPECT_DOUBLE_EQ(st.eval().loss(), 2.25);
  EXPECT_EQ(st.eval().step(), 1u);
  EXPECT_EQ(st.eval().batches(), 4u);
  EXPECT_DOUBLE_EQ(d.last_eval().loss(), 2.25);
  EXPECT_DOUBLE_EQ(d.last_eval().perplexity(), 9.4877);
  ASSERT_TRUE(c_->Metrics().jobs[0].last_eval.has_value());
  EXPECT_DOUBLE_EQ(c_->Metrics().jobs[0].last_eval->loss(), 2.25);
  EXPECT_DOUBLE_EQ(st.loss(), 2.5);
  EXPECT_DOUBLE_EQ(st.tokens(), 4096);
  EXPECT_DOUBLE_EQ(st.step_seconds(), 0.5);
  EXPECT_DOUBLE_EQ(st.tokens_per_second(), 8192);
  EXPECT_DOUBLE_EQ(st.mfu(), 0.25);
  EXPECT_DOUBLE_EQ(st.activation_peak_bytes(), 1 << 20);
  EXPECT_DOUBLE_EQ(st.memory_budget_bytes(), 1 << 22);
  EXPECT_TRUE(st.routing_spike());
  ASSERT_EQ(st.expert_tokens_size(), 2);
  EXPECT_EQ(
      std::vector<double>(st.expert_tokens(0).tokens().begin(), st.expert_tokens(0).tokens().end()),
      (std::vector<double>{30, 10}));
  ASSERT_EQ(st.imbalance_size(), 2);
  EXPECT_DOUBLE_EQ(st.imbalance(0), 1.5);
  EXPECT_DOUBLE_EQ(st.imbalance(1), 1.0);
  // Per (op, group), summed over the two ranks, in enum order.
  ASSERT_EQ(st.comm_size(), 2);
  EXPECT_EQ(st.comm(0).op(), v1::COLLECTIVE_OP_ALL_REDUCE);
  EXPECT_EQ(st.comm(0).group(), v1::PARALLEL_GROUP_TP);
  EXPECT_EQ(st.comm(0).bytes(), 2048u);
  EXPECT_DOUBLE_EQ(st.comm(0).seconds(), 0.004);
  EXPECT_EQ(st.comm(0).calls(), 4u);
  EXPECT_EQ(st.comm(1).op(), v1::COLLECTIVE_OP_ALL_TO_ALL);
  EXPECT_EQ(st.comm(1).bytes(), 8192u);
  ASSERT_EQ(st.planner_size(), 2);  // summed over the two ranks
  EXPECT_EQ(st.planner(0).action(), v1::PLANNER_ACTION_OFFLOAD);
  EXPECT_EQ(st.planner(0).bytes(), 1400u);
  EXPECT_EQ(st.planner(1).bytes(), 600u);
  EXPECT_EQ(std::vector<int>(st.moe_schedules().begin(), st.moe_schedules().end()),
            (std::vector<int>{v1::MOE_LAYER_SCHEDULE_S1, v1::MOE_LAYER_SCHEDULE_S2}));
  // Per op, summed over the two ranks, in op-name order.
  ASSERT_EQ(st.moe_ops_size(), 2);
  EXPECT_EQ(st.moe_ops(0).op(), "a2a(ep)");
  EXPECT_EQ(st.moe_ops(0).bytes(), 4096u);
  EXPECT_EQ(st.moe_ops(0).calls(), 8u);
  EXPECT_DOUBLE_EQ(st.moe_ops(0).seconds(), 0.04);
  EXPECT_EQ(st.moe_ops(1).op(), "mp_all_gather(tp)");
  EXPECT_EQ(st.moe_ops(1).bytes(), 1024u);

  const MetricsSnapshot snap = c_->Metrics();
  ASSERT_EQ(snap.jobs.size(), 1u);
  const JobMetrics& m = snap.jobs[0];
  EXPECT_TRUE(m.has_step);
  EXPECT_DOUBLE_EQ(m.tokens_total, 4096);
  EXPECT_EQ(m.comm_bytes_total,
            (std::map<std::string, double>{{"all_reduce", 2048}, {"all_to_all", 8192}}));
  EXPECT_EQ(m.planner_bytes_total,
            (std::map<std::string, double>{{"offload", 1400}, {"recompute", 600}}));
  EXPECT_EQ(m.moe_op_bytes_total,
            (std::map<std::string, double>{{"a2a(ep)", 4096}, {"mp_all_gather(tp)", 1024}}));
  EXPECT_EQ(m.moe_op_seconds_total,
            (std::map<std::string, double>{{"a2a(ep)", 0.04}, {"mp_all_gather(tp)", 0.002}}));
  EXPECT_EQ(m.last.SerializeAsString(), st.SerializeAsString());
}

TEST_F(ControllerTest, StartTimeout) {
  Register(0);
  Register(1);
  job_ = *c_->Submit(kJob, "t.yaml");
  Report(0, 1, 0, v1::RANK_STARTED);
  clock_.Advance(21);
  HeartbeatAll(2);
  c_->Tick();
  auto d = Job();
  EXPECT_EQ(d.summary().state(), v1::JOB_RECOVERING);
  EXPECT_NE(d.attempts(0).cause().find("ranks 1 (h/1) not running"), std::string::npos);
}

TEST_F(ControllerTest, RestartedControllerReloadsAndReattaches) {
  StartRunning();
  const std::string job = job_;
  Restart();  // same state dir, workers not yet back
  auto d = Job();
  EXPECT_EQ(d.summary().state(), v1::JOB_RUNNING);
  EXPECT_EQ(d.attempts_size(), 1);
  v1::RunningRank r0, r1;
  r0.set_job_id(job);
  r0.set_attempt(1);
  r0.set_rank(0);
  r0.set_pid(1000);
  r1 = r0;
  r1.set_rank(1);
  Register(0, 100, {r0});
  Register(1, 100, {r1});
  // An agent whose Register timed out on its side after we took it registers again: the rank is
  // re-attached once, not twice.
  Register(1, 100, {r1});
  int reattached = 0;
  const v1::JobDetail detail = Job();
  for (const auto& e : detail.events()) reattached += e.kind() == "reattached";
  EXPECT_EQ(reattached, 2);
  EXPECT_TRUE(Commands(0).empty());  // nothing to start or stop: re-attached
  for (auto& w : c_->ListWorkers()) EXPECT_EQ(w.state(), v1::WORKER_STATE_BUSY);
  Report(0, 1, 0, v1::RANK_EXITED, v1::EXIT_KIND_SUCCESS);
  Report(1, 1, 1, v1::RANK_EXITED, v1::EXIT_KIND_SUCCESS);
  EXPECT_EQ(Job().summary().state(), v1::JOB_SUCCEEDED);
}

v1::RunningRank Running(const std::string& job, uint32_t attempt, uint32_t rank) {
  v1::RunningRank r;
  r.set_job_id(job);
  r.set_attempt(attempt);
  r.set_rank(rank);
  r.set_pid(1000 + rank);
  return r;
}

v1::WorkerState WorkerState(Controller& c, const std::string& id) {
  for (auto& w : c.ListWorkers()) {
    if (w.worker_id() == id) return w.state();
  }
  return v1::WORKER_STATE_UNSPECIFIED;
}

// --forget-lost-workers: a lost worker stays listed (and counted as lost) for a while, then is
// forgotten, in memory and in the store (a restarted controller does not bring it back); its agent
// coming back registers as a new worker.
TEST_F(ControllerTest, ALongLostWorkerIsForgotten) {
  forget_lost_s_ = 100;
  Restart();
  Register(0);
  Register(1);
  const auto listed = [&](const std::string& id) {
    return WorkerState(*c_, id) != v1::WORKER_STATE_UNSPECIFIED;
  };
  // h/0 keeps heart-beating; h/1 went silent at 0 s, is lost at 11 s (--worker-timeout 10) and
  // forgotten 100 s after that.
  for (int i = 0; i < 110; ++i) {
    clock_.Advance(1);
    HeartbeatAll(1);
    c_->Tick();
  }
  EXPECT_EQ(WorkerState(*c_, "h/1"), v1::WORKER_STATE_LOST);
  EXPECT_EQ(c_->Metrics().workers_by_state[v1::WORKER_STATE_LOST], 1u);
  clock_.Advance(1.5);
  c_->Tick();
  EXPECT_FALSE(listed("h/1"));
  EXPECT_TRUE(listed("h/0"));
  EXPECT_EQ(c_->Metrics().workers_by_state[v1::WORKER_STATE_LOST], 0u);
  Restart();
  EXPECT_FALSE(listed("h/1"));  // its row is gone too
  EXPECT_TRUE(listed("h/0"));
  Register(1, /*pid=*/300);
  EXPECT_EQ(WorkerState(*c_, "h/1"), v1::WORKER_STATE_READY);
}

// --forget-ended-jobs: a job that ended that long ago is deleted from memory, the store (a
// restarted controller does not bring it back) and its log; a job still running, or ended more
// recently, is kept. Nothing else was ever deleted: every job stayed in memory and in the store.
TEST_F(ControllerTest, AJobThatEndedLongAgoIsForgotten) {
  forget_ended_s_ = 3600;
  Restart();
  StartRunning();  // job_: ends at once
  PushStep(1, 0, 1);
  PushStep(1, 1, 1);
  Report(0, 1, 0, v1::RANK_EXITED, v1::EXIT_KIND_SUCCESS);
  Report(1, 1, 1, v1::RANK_EXITED, v1::EXIT_KIND_SUCCESS);
  ASSERT_EQ(Job().summary().state(), v1::JOB_SUCCEEDED);
  const std::string ended = job_;
  const fs::path log = dir_ / "logs" / "jobs" / (ended + ".log");
  fs::create_directories(log.parent_path());
  std::ofstream(log) << "a line\n";
  clock_.Advance(1800);
  auto later = c_->Submit(absl::StrReplaceAll(kJob, {{"name: t", "name: a"}}), "a.yaml");
  ASSERT_TRUE(later.ok()) << later.status();  // runs (placed) from here on
  const auto tick = [&](double s) {
    clock_.Advance(s);
    HeartbeatAll(2);
    c_->Tick();
  };
  tick(1000);  // 2800 s after the end: kept
  EXPECT_TRUE(c_->GetJob(ended).ok());
  tick(900);  // 3700 s
  EXPECT_TRUE(absl::IsNotFound(c_->GetJob(ended).status())) << c_->GetJob(ended).status();
  EXPECT_FALSE(fs::exists(log));
  EXPECT_TRUE(c_->GetJob(*later).ok());
  for (const v1::JobSummary& j : c_->ListJobs()) EXPECT_NE(j.job_id(), ended);
  Restart();
  EXPECT_TRUE(absl::IsNotFound(c_->GetJob(ended).status()));
  EXPECT_TRUE(c_->GetJob(*later).ok());
}

// An agent stopped cleanly (it said it is leaving) is lost to placement as a silent one is, but
// listed as left, across a controller restart, until it registers again: an operator tells a clean
// stop from a crash.
TEST_F(ControllerTest, ALeavingWorkerIsListedAsLeftASilentOneAsLost) {
  Register(0);
  Register(1);
  v1::HeartbeatRequest h;
  h.set_worker_id("h/0");
  h.set_session_id(sessions_[0]);
  h.set_leaving(true);
  c_->Heartbeat(h);
  clock_.Advance(11);  // h/1 silent past --worker-timeout (10 s)
  c_->Tick();
  const auto info = [&](const std::string& id) {
    for (const v1::WorkerInfo& w : c_->ListWorkers()) {
      if (w.worker_id() == id) return w;
    }
    return v1::WorkerInfo();
  };
  EXPECT_EQ(info("h/0").state(), v1::WORKER_STATE_LOST);
  EXPECT_TRUE(info("h/0").left());
  EXPECT_STREQ(v1::WorkerStateWord(info("h/0")), "left");
  EXPECT_EQ(info("h/1").state(), v1::WORKER_STATE_LOST);
  EXPECT_FALSE(info("h/1").left());
  EXPECT_STREQ(v1::WorkerStateWord(info("h/1")), "lost");
  // The metric tells them apart too (render_metrics_test: state "left"): an alert on lost workers
  // does not fire on a drain.
  EXPECT_EQ(c_->Metrics().workers_by_state[v1::WORKER_STATE_LOST], 2u);
  EXPECT_EQ(c_->Metrics().workers_left, 1u);
  Restart();
  EXPECT_TRUE(info("h/0").left());
  EXPECT_FALSE(info("h/1").left());
  Register(0, /*pid=*/200);
  EXPECT_EQ(info("h/0").state(), v1::WORKER_STATE_READY);
  EXPECT_FALSE(info("h/0").left());
  EXPECT_STREQ(v1::WorkerStateWord(info("h/0")), "ready");
}

// The window counts from when the worker was declared lost, not from its stored last-seen time
// (written only when its state changes): a worker that heart-beat for longer than the window and
// does not come back after a controller restart is shown lost for the whole window.
TEST_F(ControllerTest, AWorkerLostAtAControllerRestartIsShownLostForTheWholeWindow) {
  forget_lost_s_ = 100;
  Restart();
  Register(0);
  Register(1);
  for (int i = 0; i < 150; ++i) {
    clock_.Advance(1);
    HeartbeatAll(2);
    c_->Tick();
  }
  Restart();
  Register(0);
  for (int i = 0; i < 35; ++i) {  // h/1 never comes back: lost after the 30 s re-attach grace
    clock_.Advance(1);
    HeartbeatAll(1);
    c_->Tick();
  }
  EXPECT_EQ(WorkerState(*c_, "h/1"), v1::WORKER_STATE_LOST);
  for (int i = 0; i < 90; ++i) {
    clock_.Advance(1);
    HeartbeatAll(1);
    c_->Tick();
  }
  EXPECT_EQ(WorkerState(*c_, "h/1"), v1::WORKER_STATE_LOST);  // lost about 94 s ago
  clock_.Advance(10);
  HeartbeatAll(1);
  c_->Tick();
  EXPECT_EQ(WorkerState(*c_, "h/1"), v1::WORKER_STATE_UNSPECIFIED);  // forgotten
}

TEST_F(ControllerTest, AfterARestartAgentsGetTheReattachGraceNotTheHeartbeatTimeout) {
  StartRunning();
  Restart();
  // Longer than the job's heartbeat timeout (5 s) and the worker timeout (10 s): the controller
  // was the one away, so nobody is lost yet.
  clock_.Advance(12);
  c_->Tick();
  EXPECT_EQ(Job().summary().state(), v1::JOB_RUNNING);
  Register(0, 100, {Running(job_, 1, 0)});
  // Once registered, worker 0 is held to the job's heartbeat timeout again.
  clock_.Advance(6);
  c_->Tick();
  EXPECT_EQ(WorkerState(*c_, "h/0"), v1::WORKER_STATE_LOST);
  EXPECT_EQ(Job().summary().state(), v1::JOB_RECOVERING);
}

TEST_F(ControllerTest, AnAgentThatNeverComesBackIsLostAfterTheReattachGrace) {
  StartRunning();
  Restart();
  Register(0, 100, {Running(job_, 1, 0)});
  for (int i = 0; i < 29; ++i) {  // worker 0 keeps heart-beating; worker 1 stays silent
    clock_.Advance(1);
    v1::HeartbeatRequest h;
    h.set_worker_id("h/0");
    h.set_session_id(sessions_[0]);
    EXPECT_FALSE(c_->Heartbeat(h).reregister());
    c_->Tick();
  }
  EXPECT_EQ(Job().summary().state(), v1::JOB_RUNNING);
  clock_.Advance(1.5);
  c_->Tick();
  EXPECT_EQ(WorkerState(*c_, "h/1"), v1::WORKER_STATE_LOST);
  auto d = Job();
  EXPECT_EQ(d.summary().state(), v1::JOB_RECOVERING);
  EXPECT_NE(d.attempts(0).cause().find("h/1 lost"), std::string::npos) << d.attempts(0).cause();
}

TEST_F(ControllerTest, RestartedAgentLosesItsRank) {
  StartRunning();
  Register(1, /*pid=*/555);  // same worker id, new agent process, runs nothing
  auto d = Job();
  EXPECT_EQ(d.summary().state(), v1::JOB_RECOVERING);
  EXPECT_NE(d.attempts(0).cause().find("worker h/1 restarted"), std::string::npos);
}

TEST_F(ControllerTest, CancelStopsRanks) {
  StartRunning();
  auto s = c_->Cancel(job_);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->state(), v1::JOB_CANCELLED);
  for (int w = 0; w < 2; ++w) {
    auto cmds = Commands(w);
    ASSERT_EQ(cmds.size(), 1u);
    EXPECT_TRUE(cmds[0].has_stop());
  }
  EXPECT_EQ(c_->Cancel(job_).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(c_->Cancel("nope").status().code(), absl::StatusCode::kNotFound);
}

// A controller restarted while a cancelled train job's ranks write the step they stopped at: the
// stop it sends the re-registering agents keeps that grace (one without it had the agent SIGTERM
// the rank at once).
TEST_F(ControllerTest, AStopSentAfterARestartKeepsACancelledRanksCheckpointGrace) {
  StartRunning("name: t\nkind: train\nparallel: {dp: 2}\n");
  ASSERT_TRUE(c_->Cancel(job_).ok());
  Restart();
  Register(0, 100, {Running(job_, 1, 0)});
  const std::vector<v1::AgentCommand> stop = Commands(0);
  ASSERT_EQ(stop.size(), 1u);
  ASSERT_TRUE(stop[0].has_stop());
  EXPECT_EQ(stop[0].stop().checkpoint_grace_s(), 30);
}

// No job may name the directory a later job without checkpoint.dir gets (it would fill it, and
// the later job resume from it), nor one inside or around a running job's.
TEST_F(ControllerTest, CheckpointDirectoriesCannotBeSquattedOrNested) {
  const std::string train = "name: t\nkind: train\nparallel: {dp: 2}\n";
  const std::string defaults = (dir_ / "checkpoints").string();  // <state-dir>/checkpoints
  Register(0);
  Register(1);
  // The next job's default directory, named ahead of it.
  auto squat = c_->Submit(train + "checkpoint: {dir: " + defaults + "/t-2}\n", "squat.yaml");
  ASSERT_FALSE(squat.ok());
  EXPECT_EQ(squat.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(squat.status().message().find("is under " + defaults +
                                          ", where the controller puts the checkpoints of jobs "
                                          "that name none"),
            std::string::npos)
      << squat.status();
  // A job's own directory and one inside it, or around it.
  const std::string dir = (dir_ / "runs" / "a").string();
  StartRunning((train + "checkpoint: {dir: " + dir + "}\n").c_str());
  for (const std::string& other : {dir + "/inner", (dir_ / "runs").string()}) {
    auto nested = c_->Submit(train + "checkpoint: {dir: " + other + "}\n", "n.yaml");
    ASSERT_FALSE(nested.ok()) << other;
    EXPECT_EQ(nested.status().code(), absl::StatusCode::kFailedPrecondition) << other;
    EXPECT_NE(nested.status().message().find("in use by job " + job_), std::string::npos)
        << nested.status();
  }
  // A sibling whose name only starts like it is another directory.
  EXPECT_TRUE(c_->Submit(train + "checkpoint: {dir: " + dir + "b}\n", "s.yaml").ok());
  // A symlink to the running job's directory (or to its parent) is that directory.
  std::filesystem::create_directories(dir);
  std::filesystem::create_directory_symlink(dir, dir_ / "alias");
  std::filesystem::create_directory_symlink(dir_ / "runs", dir_ / "runs-alias");
  for (const std::string& other : {(dir_ / "alias").string(), (dir_ / "runs-alias" / "a").string(),
                                   (dir_ / "runs-alias" / "a" / "inner").string()}) {
    auto aliased = c_->Submit(train + "checkpoint: {dir: " + other + "}\n", "l.yaml");
    ASSERT_FALSE(aliased.ok()) << other;
    EXPECT_NE(aliased.status().message().find("in use by job " + job_), std::string::npos)
        << aliased.status();
  }
  // The reserved directory of a job that named its own is no way into that job's run: refused.
  auto not_its_own =
      c_->Submit(train + "checkpoint: {dir: " + defaults + "/" + job_ + "}\n", "o.yaml");
  ASSERT_FALSE(not_its_own.ok());
  EXPECT_EQ(not_its_own.status().code(), absl::StatusCode::kInvalidArgument)
      << not_its_own.status();
  // Without --checkpoint-root a relative path names a different directory on every worker.
  auto relative = c_->Submit(train + "checkpoint: {dir: runs/a}\n", "r.yaml");
  ASSERT_FALSE(relative.ok());
  EXPECT_EQ(relative.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(relative.status().message().find("checkpoint.dir runs/a is a relative path"),
            std::string::npos)
      << relative.status();
}

// Each rank learns how many ranks of its attempt share its host (its MFU peak on a CPU is its
// share of the host's cores): both workers here registered host 127.0.0.1.
TEST_F(ControllerTest, EveryRankIsToldTheRanksOnItsHost) {
  std::vector<v1::RankTask> tasks;
  StartRunning(kJob, &tasks);
  ASSERT_EQ(tasks.size(), 2u);
  for (const v1::RankTask& t : tasks) EXPECT_EQ(t.ranks_on_host(), 2u) << t.rank();
}

// A drill aimed at a worker that holds no rank of the attempt does not run: said in an event
// (naming a worker that never registered), not left silently undone.
TEST_F(ControllerTest, AFaultWorkerOutsideThePlacementIsAnEvent) {
  StartRunning(
      "name: t\nkind: train\nparallel: {dp: 2}\nfault: {mode: crash, at_step: 2, "
      "worker: nosuch}\n");
  bool said = false;
  const v1::JobDetail detail = Job();
  for (const auto& e : detail.events()) {
    said |= e.kind() == "fault_not_injected" &&
            e.message() ==
                "fault.worker nosuch holds no rank of attempt 1, so its crash drill does not run "
                "in it (no worker of that name has registered)";
  }
  EXPECT_TRUE(said) << detail.DebugString();
}

TEST_F(ControllerTest, AFaultWorkerInThePlacementIsNoEvent) {
  StartRunning(
      "name: t\nkind: train\nparallel: {dp: 2}\nfault: {mode: crash, at_step: 2, "
      "worker: h/1}\n");
  const v1::JobDetail detail = Job();
  for (const auto& e : detail.events()) EXPECT_NE(e.kind(), "fault_not_injected");
}

// A job's default checkpoint directory may be named to continue its run once it has ended (its id
// is taken: no later job gets that directory); not while it runs, not below it, and not the
// directory of a job that does not exist yet.
TEST_F(ControllerTest, AnEndedJobsDefaultDirectoryCanBeNamedToContinueIt) {
  const std::string train = "name: t\nkind: train\nparallel: {dp: 2}\n";
  StartRunning(train.c_str());
  const std::string first = job_;
  const std::string own = (dir_ / "checkpoints" / first).string();
  EXPECT_EQ(Job().spec().checkpoint().dir(), own);
  const auto with_dir = [&](const std::string& dir) {
    return c_->Submit(train + "checkpoint: {dir: " + dir + "}\n", "c.yaml");
  };
  auto running = with_dir(own);
  ASSERT_FALSE(running.ok());
  EXPECT_NE(running.status().message().find("in use by job " + first), std::string::npos)
      << running.status();
  for (const std::string& other : {own + "/sub", (dir_ / "checkpoints" / "t-99").string()}) {
    auto refused = with_dir(other);
    ASSERT_FALSE(refused.ok()) << other;
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << other;
  }
  ASSERT_TRUE(c_->Cancel(first).ok());
  Report(0, 1, 0, v1::RANK_EXITED, v1::EXIT_KIND_STOPPED);
  Report(1, 1, 1, v1::RANK_EXITED, v1::EXIT_KIND_STOPPED);
  auto resumed = with_dir(own);
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  job_ = *resumed;
  EXPECT_EQ(Job().spec().checkpoint().dir(), own);
}

// Two jobs committing into one checkpoint.dir would uncommit and prune each other's steps: a
// second job naming the directory of one that has not ended is refused at submit; once that one
// has ended, the second waits until its ranks have exited (a stopped single rank still writes).
TEST_F(ControllerTest, OneCheckpointDirectoryHasOneWriter) {
  const std::string dir = (dir_ / "ckpt").string();
  const std::string train = "name: t\nkind: train\nparallel: {dp: 2}\n";
  const std::string yaml = train + "checkpoint: {dir: " + dir + "}\n";
  StartRunning(yaml.c_str());
  const std::string first = job_;
  const std::string same = train + "checkpoint: {dir: " + dir + "/./}\n";
  auto refused = c_->Submit(same, "b.yaml");
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.status().message().find("checkpoint.dir " + dir + "/./ is in use by job " +
                                            first + " (running, checkpoint.dir " + dir + ")"),
            std::string::npos)
      << refused.status();

  ASSERT_TRUE(c_->Cancel(first).ok());  // its ranks are told to stop, and have not yet
  Register(2);
  Register(3);
  auto second = c_->Submit(same, "b.yaml");
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(*second, "t-2");  // the refused submit took no job number
  job_ = *second;
  EXPECT_TRUE(Commands(2).empty());
  EXPECT_TRUE(Commands(3).empty());
  EXPECT_EQ(Job().summary().state(), v1::JOB_PENDING);
  bool said = false;
  const v1::JobDetail pending = Job();
  for (const auto& e : pending.events()) {
    said |= e.kind() == "waiting" &&
            e.message().find("is job " + first + "'s, whose ranks are still stopping") !=
                std::string::npos;
  }
  EXPECT_TRUE(said) << pending.DebugString();
  // A third job of that directory is refused for the second, which has not ended (else the two
  // would each wait for the other once the first's ranks were gone).
  auto third = c_->Submit(same, "c.yaml");
  ASSERT_FALSE(third.ok());
  EXPECT_NE(third.status().message().find("in use by job " + *second + " (pending,"),
            std::string::npos)
      << third.status();

  job_ = first;
  Report(0, 1, 0, v1::RANK_EXITED, v1::EXIT_KIND_STOPPED);
  Report(1, 1, 1, v1::RANK_EXITED, v1::EXIT_KIND_STOPPED);
  job_ = *second;
  c_->Tick();
  size_t starts = 0;
  for (int s = 0; s < 4; ++s) {
    for (const auto& cmd : Commands(s)) starts += cmd.has_start();
  }
  EXPECT_EQ(starts, 2u);
  // A job of another directory was never held back.
  auto other = c_->Submit(train + "checkpoint: {dir: " + dir + "-2}\n", "c.yaml");
  EXPECT_TRUE(other.ok()) << other.status();
}

TEST_F(ControllerTest, CancelledJobsRankStillStoppingAcrossRestartFreesItsWorker) {
  StartRunning();
  ASSERT_TRUE(c_->Cancel(job_).ok());
  Restart();  // before the stop reports arrive
  EXPECT_EQ(WorkerState(*c_, "h/0"), v1::WORKER_STATE_BUSY);
  Register(0, 100, {Running(job_, 1, 0)});
  auto cmds = Commands(0);
  ASSERT_EQ(cmds.size(), 1u);
  EXPECT_TRUE(cmds[0].has_stop());
  Report(0, 1, 0, v1::RANK_EXITED, v1::EXIT_KIND_STOPPED);
  EXPECT_EQ(WorkerState(*c_, "h/0"), v1::WORKER_STATE_READY);
}

// Job A's second attempt is cancelled and its ranks' exits arrive (written behind), job B is
// placed on the freed workers (written at once), and the controller stops before the exits are
// written. Reloaded, both A's attempt 2 and B's attempt 1 claim each worker: B's, the running
// one, holds it (an attempt number of another job says nothing), so when the machine's agents
// come back restarted, B's attempt is the one that fails and restarts. It stayed RUNNING on
// workers that ran nothing, and A's stale rank took the loss.
TEST_F(ControllerTest, ARunningAttemptHoldsItsWorkersOverAnEndedAttemptOfAnotherJob) {
  StartRunning();
  const std::string a = job_;
  FailAndRestart();
  for (int s = 0; s < 2; ++s) ASSERT_EQ(Commands(s).size(), 1u);
  Report(0, 2, 0, v1::RANK_STARTED);
  Report(1, 2, 1, v1::RANK_STARTED);
  ASSERT_EQ(Job().summary().state(), v1::JOB_RUNNING);
  ASSERT_TRUE(c_->Cancel(a).ok());
  for (int s = 0; s < 2; ++s) Commands(s);  // the stops
  Report(0, 2, 0, v1::RANK_EXITED, v1::EXIT_KIND_STOPPED, "stopped");
  Report(1, 2, 1, v1::RANK_EXITED, v1::EXIT_KIND_STOPPED, "stopped");

  auto b = c_->Submit(kJob, "b.yaml");
  ASSERT_TRUE(b.ok()) << b.status();
  job_ = *b;
  for (int s = 0; s < 2; ++s) ASSERT_EQ(Commands(s).size(), 1u) << s;
  Report(0, 1, 0, v1::RANK_STARTED);
  Report(1, 1, 1, v1::RANK_STARTED);
  ASSERT_EQ(Job().summary().state(), v1::JOB_RUNNING);

  Restart();  // before A's exit reports are written
  EXPECT_EQ(WorkerState(*c_, "h/0"), v1::WORKER_STATE_BUSY);
  Register(0, 100, {}, "rebooted");  // the machine's agents, restarted: they run nothing
  Register(1, 100, {}, "rebooted");
  const v1::JobDetail d = Job();
  EXPECT_EQ(d.summary().state(), v1::JOB_RECOVERING);
  ASSERT_EQ(d.attempts_size(), 1);
  EXPECT_NE(d.attempts(0).cause().find("restarted"), std::string::npos) << d.attempts(0).cause();
  job_ = a;
  EXPECT_EQ(Job().summary().state(), v1::JOB_CANCELLED);
}

// The dashboard's job list (polled every 2 s) keeps every job that has not ended and the newest
// that have; the older ended ones are counted, not sent (a controller that ran thousands of jobs
// sent them all to every open tab).
TEST_F(ControllerTest, RecentJobsKeepTheLiveAndTheNewestEnded) {
  Register(0);
  Register(1);
  std::vector<std::string> ids;
  for (int i = 0; i < 5; ++i) {
    clock_.Advance(1);
    auto id = c_->Submit(kJob, "t.yaml");
    ASSERT_TRUE(id.ok()) << id.status();
    ids.push_back(*id);
  }
  for (int i : {0, 1, 3, 4}) ASSERT_TRUE(c_->Cancel(ids[i]).ok()) << i;
  const v1::ListJobsResponse recent = c_->RecentJobs(2);
  EXPECT_EQ(recent.omitted(), 2u);
  std::vector<std::string> shown;
  for (const auto& j : recent.jobs()) shown.push_back(j.job_id());
  EXPECT_EQ(shown, (std::vector<std::string>{ids[2], ids[3], ids[4]}));
  EXPECT_EQ(c_->RecentJobs(10).omitted(), 0u);
  EXPECT_EQ(c_->RecentJobs(10).jobs_size(), 5);
  EXPECT_EQ(c_->ListJobs().size(), 5u);
}

TEST_F(ControllerTest, AgentRestartWithTheSamePidIsStillARestart) {
  StartRunning();
  Register(1, 100, {}, "another-process");  // same pid (containers), new instance, runs nothing
  auto d = Job();
  EXPECT_EQ(d.summary().state(), v1::JOB_RECOVERING);
  EXPECT_NE(d.attempts(0).cause().find("worker h/1 restarted"), std::string::npos);
}

TEST_F(ControllerTest, StartCommandsLostWithTheControllerAreSentAgain) {
  Register(0);
  Register(1);
  job_ = *c_->Submit(kJob, "t.yaml");
  Restart();  // the queued start commands are gone
  Register(0);
  Register(1);
  for (int s = 0; s < 2; ++s) {
    auto cmds = Commands(s);
    ASSERT_EQ(cmds.size(), 1u);
    EXPECT_TRUE(cmds[0].has_start());
    EXPECT_EQ(cmds[0].start().attempt(), 1u);
  }
  Report(0, 1, 0, v1::RANK_STARTED);
  Report(1, 1, 1, v1::RANK_STARTED);
  EXPECT_EQ(Job().summary().state(), v1::JOB_RUNNING);
  EXPECT_EQ(Job().summary().restarts(), 0u);
}

// Placed, then the attempt ended (a cancel) before the agents took their start commands, and the
// controller restarted: start and stop are gone, and the ranks never ran. Their workers must not
// stay busy waiting for exit reports that will never come.
TEST_F(ControllerTest, RanksThatNeverStartedFreeTheirWorkersAfterARestart) {
  Register(0);
  Register(1);
  job_ = *c_->Submit(kJob, "t.yaml");
  ASSERT_TRUE(c_->Cancel(job_).ok());
  Restart();
  EXPECT_EQ(WorkerState(*c_, "h/0"), v1::WORKER_STATE_BUSY);  // as far as the store knows
  Register(0);  // the same agent processes, running nothing
  Register(1);
  for (int s = 0; s < 2; ++s) {
    EXPECT_EQ(WorkerState(*c_, "h/" + std::to_string(s)), v1::WORKER_STATE_READY) << s;
    EXPECT_TRUE(Commands(s).empty()) << s;  // no start for an attempt that is over
  }
  const v1::JobDetail d = Job();
  EXPECT_EQ(d.summary().state(), v1::JOB_CANCELLED);
  for (const auto& rank : d.attempts(0).ranks()) {
    EXPECT_EQ(rank.state(), v1::RANK_STATE_EXITED);
    EXPECT_EQ(rank.exit_kind(), v1::EXIT_KIND_STOPPED);
    EXPECT_NE(rank.exit().find("never started"), std::string::npos) << rank.exit();
  }
  // Written: a second restart does not make them busy again.
  clock_.Advance(2);
  c_->Tick();
  Restart();
  EXPECT_EQ(WorkerState(*c_, "h/0"), v1::WORKER_STATE_READY);
  EXPECT_EQ(WorkerState(*c_, "h/1"), v1::WORKER_STATE_READY);
}

// An agent still running a rank of a job the controller has no record of (its state directory
// lost or restored from an older copy) is told to stop it, and is busy until the rank's exit,
// which frees it.
TEST_F(ControllerTest, TheExitOfAnUnknownJobsRankFreesItsWorker) {
  Register(0, 100, {Running("ghost-1", 3, 1)});
  auto cmds = Commands(0);
  ASSERT_EQ(cmds.size(), 1u);
  EXPECT_TRUE(cmds[0].has_stop());
  EXPECT_EQ(WorkerState(*c_, "h/0"), v1::WORKER_STATE_BUSY);
  v1::RankReport r;
  r.set_worker_id("h/0");
  r.set_job_id("ghost-1");
  r.set_attempt(3);
  r.set_rank(1);
  r.set_event(v1::RANK_EXITED);
  r.set_exit_kind(v1::EXIT_KIND_STOPPED);
  ASSERT_TRUE(c_->ReportRank(r).ok());
  EXPECT_EQ(WorkerState(*c_, "h/0"), v1::WORKER_STATE_READY);
}

// A rank of an attempt older than the newest two (slow to stop while two more attempts ran) whose
// exit report comes late: its record is written too, so a restarted controller neither shows it
// running nor keeps its worker busy.
// Three attempts on six workers; attempt 1's rank 1 still stopping (its worker busy) when attempt
// 3 runs. Returns that rank's slot.
int ControllerTest::ThreeAttemptsWithAStoppingRank() {
  for (int s = 0; s < 6; ++s) Register(s);
  job_ = *c_->Submit(kJob, "t.yaml");
  auto slot_of = [&](uint32_t attempt, uint32_t rank) {
    const std::string id = Job().attempts(attempt - 1).ranks(rank).worker_id();
    return std::stoi(id.substr(id.find('/') + 1));
  };
  auto start = [&](uint32_t attempt) {
    for (uint32_t r = 0; r < 2; ++r) {
      Commands(slot_of(attempt, r));
      Report(slot_of(attempt, r), attempt, r, v1::RANK_STARTED);
    }
    EXPECT_EQ(Job().summary().state(), v1::JOB_RUNNING) << attempt;
  };
  start(1);
  const int slow = slot_of(1, 1);  // attempt 1's rank 1: slow to stop
  Report(slot_of(1, 0), 1, 0, v1::RANK_EXITED, v1::EXIT_KIND_SIGNAL, "killed");
  for (uint32_t attempt = 2; attempt <= 3; ++attempt) {
    clock_.Advance(5);  // past the backoff
    HeartbeatAll(6);
    c_->Tick();
    EXPECT_EQ(Job().attempts_size(), static_cast<int>(attempt));
    start(attempt);
    if (attempt == 2) {
      for (uint32_t r = 0; r < 2; ++r) {
        Report(slot_of(2, r), 2, r, v1::RANK_EXITED, v1::EXIT_KIND_SIGNAL, "killed");
      }
    }
  }
  EXPECT_EQ(WorkerState(*c_, "h/" + std::to_string(slow)), v1::WORKER_STATE_BUSY);
  return slow;
}

TEST_F(ControllerTest, ALateExitOfAnOldAttemptIsWritten) {
  const int slow = ThreeAttemptsWithAStoppingRank();
  Report(slow, 1, 1, v1::RANK_EXITED, v1::EXIT_KIND_STOPPED);  // at last
  EXPECT_EQ(WorkerState(*c_, "h/" + std::to_string(slow)), v1::WORKER_STATE_READY);
  WriteBehindAndRestart(6);
  const v1::JobDetail d = Job();
  ASSERT_EQ(d.attempts_size(), 3);
  EXPECT_EQ(d.attempts(0).ranks(1).state(), v1::RANK_STATE_EXITED);
  EXPECT_EQ(d.attempts(0).ranks(1).exit_kind(), v1::EXIT_KIND_STOPPED);
  EXPECT_NE(WorkerState(*c_, "h/" + std::to_string(slow)), v1::WORKER_STATE_BUSY);
}

// The last telemetry of that stopping rank is written too: its step feeds the no-progress rule
// (the best step before each attempt) and its sequence number the dedup of re-sent batches, so a
// restarted controller must not see them older than they were.
TEST_F(ControllerTest, LateTelemetryOfAnOldAttemptIsWritten) {
  const int slow = ThreeAttemptsWithAStoppingRank();
  v1::TelemetryBatch batch;
  batch.set_worker_id("h/" + std::to_string(slow));
  v1::TelemetryRecord& r = *batch.add_records();
  r.set_job_id(job_);
  r.set_attempt(1);
  r.set_rank(1);
  r.set_seq(9);
  r.set_step(42);
  r.set_unix_time(clock_.UnixSeconds());
  r.mutable_train()->set_tokens(1000);
  r.mutable_train()->set_step_seconds(0.5);
  ASSERT_TRUE(c_->PushTelemetry(batch).ok());
  WriteBehindAndRestart(6);
  const v1::JobDetail d = Job();
  ASSERT_EQ(d.attempts_size(), 3);
  EXPECT_EQ(d.attempts(0).ranks(1).step(), 42u);
  EXPECT_EQ(d.attempts(0).ranks(1).telemetry_seq(), 9u);
  EXPECT_GT(d.attempts(0).ranks(1).first_step_unix(), 0);
}

// An attempt's start-up points are the latest of its ranks' once every rank has them, whatever
// order the ranks report in (the scans resume where the last one stopped: Job::times_prefix).
TEST_F(ControllerTest, AnAttemptsStartUpPointsAreItsRanksLatest) {
  StartRunning();
  auto push = [&](int rank, uint64_t seq, double rendezvous, bool step) {
    v1::TelemetryBatch batch;
    batch.set_worker_id("h/" + std::to_string(rank));
    v1::TelemetryRecord& r = *batch.add_records();
    r.set_job_id(job_);
    r.set_attempt(1);
    r.set_rank(rank);
    r.set_seq(seq);
    r.set_unix_time(clock_.UnixSeconds());
    if (rendezvous > 0) {
      r.mutable_startup()->set_rendezvous_unix(rendezvous);
      r.mutable_startup()->set_setup_unix(rendezvous + 1);
      r.mutable_startup()->set_checkpoint_load_unix(rendezvous + 2);
    }
    if (step) {
      r.set_step(1);
      r.mutable_train()->set_tokens(100);
      r.mutable_train()->set_step_seconds(0.5);
    }
    ASSERT_TRUE(c_->PushTelemetry(batch).ok());
  };
  push(1, 1, 50, false);  // rank 1 first: rank 0 still has none
  EXPECT_EQ(Job().attempts(0).rendezvous_unix(), 0);
  push(0, 1, 40, false);
  v1::JobDetail d = Job();
  EXPECT_EQ(d.attempts(0).rendezvous_unix(), 50);
  EXPECT_EQ(d.attempts(0).setup_unix(), 51);
  EXPECT_EQ(d.attempts(0).checkpoint_load_unix(), 52);
  EXPECT_EQ(d.attempts(0).first_step_unix(), 0);
  push(0, 2, 60, false);  // a later start-up record of rank 0 moves the latest
  EXPECT_EQ(Job().attempts(0).rendezvous_unix(), 60);
  push(1, 2, 0, true);
  EXPECT_EQ(Job().attempts(0).first_step_unix(), 0);
  clock_.Advance(2);
  push(0, 3, 0, true);
  d = Job();
  EXPECT_EQ(d.attempts(0).first_step_unix(), clock_.UnixSeconds());
}

// One worker cannot speak for another's ranks: a report on a rank placed elsewhere is refused
// (InvalidArgument: the agent drops it) and changes nothing; telemetry records and log lines of
// such ranks are not taken. (auth_processor.h holds a worker to its host's certificate.)
TEST_F(ControllerTest, AWorkerCannotSpeakForAnothersRanks) {
  StartRunning();
  v1::RankReport r;
  r.set_worker_id("h/0");
  r.set_job_id(job_);
  r.set_attempt(1);
  r.set_rank(1);  // on h/1
  r.set_event(v1::RANK_EXITED);
  r.set_exit_kind(v1::EXIT_KIND_CODE);
  r.set_exit_code(v1::RANK_EXIT_BAD_INPUT);
  const absl::Status refused = c_->ReportRank(r);
  EXPECT_TRUE(absl::IsInvalidArgument(refused)) << refused;
  EXPECT_NE(refused.message().find("which runs on h/1"), std::string::npos) << refused;
  EXPECT_EQ(Job().summary().state(), v1::JOB_RUNNING);

  v1::TelemetryBatch batch;
  batch.set_worker_id("h/0");
  v1::TelemetryRecord* rec = batch.add_records();
  rec->set_job_id(job_);
  rec->set_attempt(1);
  rec->set_rank(1);
  rec->set_seq(UINT64_MAX);  // would shadow every real record of rank 1
  rec->set_step(5);
  ASSERT_TRUE(c_->PushTelemetry(batch).ok());
  EXPECT_EQ(Job().attempts(0).ranks(1).step(), 0u);

  v1::LogBatch logs;
  logs.set_worker_id("h/0");
  v1::LogLine* line = logs.add_lines();
  line->set_job_id(job_);
  line->set_attempt(1);
  line->set_rank(1);
  line->set_text("forged");
  line = logs.add_lines();
  line->set_job_id(job_);
  line->set_attempt(1);
  line->set_rank(0);
  line->set_text("its own");
  ASSERT_TRUE(c_->PushLogs(logs).ok());
  v1::GetLogsRequest req;
  req.set_job_id(job_);
  req.set_rank(-1);
  const auto page = c_->GetLogs(req);
  ASSERT_TRUE(page.ok()) << page.status();
  ASSERT_EQ(page->lines_size(), 1);
  EXPECT_EQ(page->lines(0), "[attempt 1 rank 0] its own");

  // Its own rank's report is taken.
  Report(1, 1, 1, v1::RANK_EXITED, v1::EXIT_KIND_SIGNAL, "killed");
  EXPECT_EQ(Job().summary().state(), v1::JOB_RECOVERING);
}

// A rank or attempt the job does not have is NotFound naming what it has, not an empty page that
// reads as a rank that wrote nothing.
TEST_F(ControllerTest, LogsOfARankOrAttemptTheJobDoesNotHaveAreNotFound) {
  StartRunning();
  FailAndRestart();
  const auto logs = [&](const std::string& job, int rank, int attempt) {
    v1::GetLogsRequest req;
    req.set_job_id(job);
    req.set_rank(rank);
    req.set_attempt(attempt);
    return c_->GetLogs(req).status();
  };
  EXPECT_TRUE(logs(job_, -1, 0).ok());
  EXPECT_TRUE(logs(job_, 1, 2).ok());
  absl::Status s = logs(job_, 9, 0);
  EXPECT_TRUE(absl::IsNotFound(s)) << s;
  EXPECT_EQ(s.message(), "job " + job_ + " has no rank 9; it has ranks 0..1");
  s = logs(job_, -1, 3);
  EXPECT_TRUE(absl::IsNotFound(s)) << s;
  EXPECT_EQ(s.message(), "job " + job_ + " has no attempt 3; it has attempts 1..2");
  s = logs(job_, 2, 1);
  EXPECT_EQ(s.message(), "attempt 1 of job " + job_ + " has no rank 2; it has ranks 0..1");

  // Both workers busy: a second job waits with no attempt.
  const auto pending = c_->Submit(kJob, "t.yaml");
  ASSERT_TRUE(pending.ok()) << pending.status();
  s = logs(*pending, -1, 1);
  EXPECT_TRUE(absl::IsNotFound(s)) << s;
  EXPECT_EQ(s.message(), "job " + *pending + " has no attempt 1; it has no attempt yet (pending)");
  EXPECT_TRUE(logs(*pending, 1, 0).ok());
}

TEST_F(ControllerTest, LostWorkerStaysBusyUntilItsOldRankExits) {
  StartRunning();
  clock_.Advance(5.5);  // both silent past the job's heartbeat timeout
  c_->Tick();
  EXPECT_EQ(Job().summary().state(), v1::JOB_RECOVERING);
  Register(0, 100, {Running(job_, 1, 0)});  // back, still running the old rank
  Register(1, 100, {Running(job_, 1, 1)});
  clock_.Advance(2);
  HeartbeatAll(2);
  c_->Tick();
  // Draining: no second rank is placed beside the old one.
  EXPECT_EQ(Job().summary().state(), v1::JOB_RECOVERING);
  EXPECT_EQ(WorkerState(*c_, "h/0"), v1::WORKER_STATE_BUSY);
  for (int s = 0; s < 2; ++s) {
    auto cmds = Commands(s);
    ASSERT_EQ(cmds.size(), 1u);
    EXPECT_TRUE(cmds[0].has_stop());
  }
  Report(0, 1, 0, v1::RANK_EXITED, v1::EXIT_KIND_STOPPED);
  Report(1, 1, 1, v1::RANK_EXITED, v1::EXIT_KIND_STOPPED);
  HeartbeatAll(2);
  c_->Tick();
  EXPECT_EQ(Job().summary().state(), v1::JOB_STARTING);
  EXPECT_EQ(Job().summary().attempt(), 2u);
}

TEST_F(ControllerTest, RestartedAgentDrainingAnOldRankDoesNotFailTheNewAttempt) {
  Register(0);
  Register(1);
  Register(2);
  job_ = *c_->Submit(kJob, "t.yaml");  // ranks on h/0 and h/1
  Commands(0);
  Commands(1);
  Report(0, 1, 0, v1::RANK_STARTED);
  Report(1, 1, 1, v1::RANK_STARTED);
  Report(1, 1, 1, v1::RANK_EXITED, v1::EXIT_KIND_SIGNAL, "killed by signal 9 (SIGKILL)");
  clock_.Advance(1.1);
  HeartbeatAll(3);
  c_->Tick();  // attempt 2 avoids h/1: h/0 still drains rank 0 of attempt 1, so h/1 and h/2 it is
  auto d = Job();
  ASSERT_EQ(d.summary().attempt(), 2u);
  EXPECT_EQ(d.attempts(1).ranks(0).worker_id(), "h/1");
  EXPECT_EQ(d.attempts(1).ranks(1).worker_id(), "h/2");
  Register(0, /*pid=*/777);  // h/0's agent restarts; its attempt-1 rank died with it
  d = Job();
  EXPECT_EQ(d.summary().state(), v1::JOB_STARTING);
  EXPECT_EQ(d.summary().restarts(), 1u);
  EXPECT_EQ(WorkerState(*c_, "h/0"), v1::WORKER_STATE_READY);
}

TEST_F(ControllerTest, GracefulShutdownInterruptsWithoutSpendingRestarts) {
  StartRunning();
  // h/0 and h/1 are the launcher's (Register gives slot s the pid 100 + s).
  ASSERT_TRUE(c_->RecordLocalWorker(0, 100).ok());
  ASSERT_TRUE(c_->RecordLocalWorker(1, 101).ok());
  c_->Shutdown(/*stopping_workers=*/true);
  Report(0, 1, 0, v1::RANK_EXITED, v1::EXIT_KIND_STOPPED);  // ignored: our own doing
  Restart();
  auto d = Job();
  EXPECT_EQ(d.summary().state(), v1::JOB_RECOVERING);
  EXPECT_EQ(d.summary().restarts(), 0u);
  EXPECT_EQ(d.attempts(0).state(), v1::ATTEMPT_STATE_INTERRUPTED);
  Register(0, 200, {}, "new0");  // fresh local workers
  Register(1, 200, {}, "new1");
  c_->Tick();
  d = Job();
  EXPECT_EQ(d.summary().state(), v1::JOB_STARTING);
  EXPECT_EQ(d.summary().attempt(), 2u);
}

// A graceful shutdown asks a train job's ranks on the local workers to stop keeping their
// progress (they write the step they reach), and no heartbeat's view cuts that short: the records,
// which no longer list those ranks, give the agents none (it had them stopped as unknown, SIGTERM
// at once, before their step was written).
TEST_F(ControllerTest, AGracefulShutdownLetsTheLocalRanksWriteTheirStep) {
  StartRunning("name: t\nkind: train\nparallel: {dp: 2}\n");
  ASSERT_TRUE(c_->RecordLocalWorker(0, 100).ok());  // h/1 is an agent started by hand
  c_->Shutdown(/*stopping_workers=*/true);
  for (int slot : {0, 1}) {
    const std::vector<v1::AgentCommand> commands = Commands(slot);
    ASSERT_EQ(commands.size(), 1u);
    ASSERT_TRUE(commands[0].has_stop());
    EXPECT_EQ(commands[0].stop().checkpoint_grace_s(), 30);  // the default
  }
  const v1::HeartbeatResponse local = Beat(0);
  EXPECT_FALSE(local.reconcile());
  EXPECT_EQ(local.ranks_size(), 0);
  // The agent the controller does not stop still gets its view, with the grace in it.
  const v1::HeartbeatResponse other = Beat(1);
  EXPECT_TRUE(other.reconcile());
  ASSERT_EQ(other.ranks_size(), 1);
  EXPECT_FALSE(other.ranks(0).wanted());
  EXPECT_EQ(other.ranks(0).checkpoint_grace_s(), 30);
  // Its rank's end is recorded (not acknowledged and dropped: it would be lost); the local
  // worker's rank is ended in the records already.
  Report(1, 1, 1, v1::RANK_EXITED, v1::EXIT_KIND_STOPPED, "stopped: after step 9, its checkpoint");
  Report(0, 1, 0, v1::RANK_EXITED, v1::EXIT_KIND_STOPPED, "stopped: after step 9, its checkpoint");
  Restart();  // (in the store: no flush comes after the shutdown's)
  const v1::JobDetail d = Job();
  EXPECT_EQ(d.attempts(0).ranks(0).exit(), "stopped: the controller shut down");
  EXPECT_EQ(d.attempts(0).ranks(1).state(), v1::RANK_STATE_EXITED);
  EXPECT_EQ(d.attempts(0).ranks(1).exit(), "stopped: after step 9, its checkpoint");
}

// resources.time_limit_s: past it, a running train job ends FAILED at once (no restart), its ranks
// stopped as at a cancel: each gets checkpoint.stop_grace_s to write the step it reaches, by
// command and in the heartbeat's view, which may come first.
TEST_F(ControllerTest, ATrainJobPastItsTimeLimitEndsAndItsRanksKeepTheirStep) {
  StartRunning("name: t\nkind: train\nparallel: {dp: 2}\nresources: {time_limit_s: 60}\n");
  clock_.Advance(59);
  HeartbeatAll(2);
  c_->Tick();
  EXPECT_EQ(Job().summary().state(), v1::JOB_RUNNING);
  EXPECT_TRUE(Commands(0).empty());
  clock_.Advance(1);
  HeartbeatAll(2);
  c_->Tick();
  const v1::JobDetail d = Job();
  EXPECT_EQ(d.summary().state(), v1::JOB_FAILED);
  EXPECT_EQ(d.summary().restarts(), 0u);
  EXPECT_EQ(d.summary().cause(),
            "time limit reached: 60 s since its first attempt started (resources.time_limit_s "
            "60); its ranks stop after their step and write its checkpoint");
  EXPECT_EQ(d.attempts(0).state(), v1::ATTEMPT_STATE_FAILED);
  EXPECT_EQ(d.attempts(0).failure_kind(), "time_limit");
  for (int slot : {0, 1}) {
    const std::vector<v1::AgentCommand> stop = Commands(slot);
    ASSERT_EQ(stop.size(), 1u);
    ASSERT_TRUE(stop[0].has_stop());
    EXPECT_EQ(stop[0].stop().reason(), "job time limit reached");
    EXPECT_EQ(stop[0].stop().checkpoint_grace_s(), 30);
    const v1::HeartbeatResponse view = Beat(slot);
    ASSERT_EQ(view.ranks_size(), 1);
    EXPECT_FALSE(view.ranks(0).wanted());
    EXPECT_EQ(view.ranks(0).checkpoint_grace_s(), 30);
  }
}

// A failure pending at the limit (a rank's error exit in its settle window) ends the attempt as
// the failure it is, with no grace for a step its peers cannot finish; the limit then ends the
// recovering job.
TEST_F(ControllerTest, AFailurePendingAtTheTimeLimitEndsTheAttemptFirst) {
  StartRunning("name: t\nkind: train\nparallel: {dp: 2}\nresources: {time_limit_s: 60}\n");
  clock_.Advance(59.5);
  HeartbeatAll(2);
  Report(0, 1, 0, v1::RANK_EXITED, v1::EXIT_KIND_CODE, "exited with code 1", 1);
  clock_.Advance(0.6);  // past the limit, inside the settle window
  HeartbeatAll(2);
  c_->Tick();
  EXPECT_EQ(Job().summary().state(), v1::JOB_RUNNING);
  clock_.Advance(0.5);
  HeartbeatAll(2);
  c_->Tick();
  const v1::JobDetail d = Job();
  EXPECT_EQ(d.summary().state(), v1::JOB_FAILED);
  EXPECT_EQ(d.summary().cause(),
            "time limit reached: 61 s since its first attempt started (resources.time_limit_s 60)");
  EXPECT_EQ(d.attempts(0).failure_kind(), "exit");
  const std::vector<v1::AgentCommand> stop = Commands(1);
  ASSERT_EQ(stop.size(), 1u);
  ASSERT_TRUE(stop[0].has_stop());
  EXPECT_EQ(stop[0].stop().checkpoint_grace_s(), 0);
}

// After a controller restart the limit waits for the running attempt's agents: their ranks may
// have ended while it was away (a success among them, its report on its way).
TEST_F(ControllerTest, TheTimeLimitWaitsForTheRanksAgentsAfterARestart) {
  StartRunning("name: t\nkind: commcheck\nparallel: {dp: 2}\nresources: {time_limit_s: 60}\n");
  clock_.Advance(50);
  HeartbeatAll(2);
  Restart();
  clock_.Advance(15);
  c_->Tick();
  EXPECT_EQ(Job().summary().state(), v1::JOB_RUNNING);
  Register(0, 100, {Running(job_, 1, 0)});
  c_->Tick();
  EXPECT_EQ(Job().summary().state(), v1::JOB_RUNNING);  // rank 1's agent not heard from yet
  Register(1, 100);  // without its rank, which ended meanwhile: its exit report is to come
  c_->Tick();
  EXPECT_EQ(Job().summary().state(), v1::JOB_RUNNING);
  Report(1, 1, 1, v1::RANK_EXITED, v1::EXIT_KIND_SUCCESS);
  c_->Tick();
  const v1::JobDetail d = Job();
  EXPECT_EQ(d.summary().state(), v1::JOB_FAILED);
  EXPECT_EQ(d.attempts(0).failure_kind(), "time_limit");
  EXPECT_EQ(d.attempts(0).ranks(1).exit_kind(), v1::EXIT_KIND_SUCCESS);
}

// The limit counts from the first attempt's start, recoveries included, and holds across a
// controller restart (the start time is in the store): a job still recovering at it ends there.
TEST_F(ControllerTest, TheTimeLimitCountsRecoveriesAndSurvivesARestart) {
  StartRunning(
      "name: t\nkind: commcheck\nparallel: {dp: 2}\nresources: {time_limit_s: 100}\n"
      "recovery:\n  max_restarts: 5\n  backoff: {initial_s: 60.0, max_s: 60.0}\n");
  clock_.Advance(50);
  HeartbeatAll(2);
  Report(0, 1, 0, v1::RANK_EXITED, v1::EXIT_KIND_SIGNAL, "killed by signal 9");
  Report(1, 1, 1, v1::RANK_EXITED, v1::EXIT_KIND_STOPPED, "stopped");
  clock_.Advance(2);
  HeartbeatAll(2);
  c_->Tick();
  ASSERT_EQ(Job().summary().state(), v1::JOB_RECOVERING);  // backoff: 60 s
  const double deadline = Job().attempts(0).started_unix() + 100;
  EXPECT_EQ(Job().summary().deadline_unix(), deadline);
  Restart();
  Register(0, 100, {}, "r0");
  Register(1, 101, {}, "r1");
  clock_.Advance(47);
  c_->Tick();
  EXPECT_EQ(Job().summary().state(), v1::JOB_RECOVERING);
  // The deadline, as the summary and /metrics give it, is the stored start's plus the limit.
  EXPECT_EQ(Job().summary().deadline_unix(), deadline);
  ASSERT_EQ(c_->Metrics().jobs.size(), 1u);
  EXPECT_EQ(c_->Metrics().jobs[0].deadline_unix, deadline);
  clock_.Advance(1);
  c_->Tick();
  const v1::JobDetail d = Job();
  EXPECT_EQ(d.summary().state(), v1::JOB_FAILED);
  EXPECT_EQ(d.summary().cause(),
            "time limit reached: 100 s since its first attempt started (resources.time_limit_s "
            "100)");
  ASSERT_EQ(d.attempts_size(), 1);  // no attempt started past it
  EXPECT_EQ(d.attempts(0).failure_kind(), "signal");
  EXPECT_EQ(c_->Metrics().jobs[0].deadline_unix, 0);  // an ended job has none left
}

// --max-time-limit / --default-time-limit: a job asking more than the maximum, or none at all (an
// explicit 0), is refused at submit (naming the field, the flag and what is allowed); one leaving
// the field out gets the default, or else the maximum, written into its stored spec (recovery,
// backfill and status read one limit there), said to the submitter and in its submitted event,
// and enforced from its start; one asking less keeps its own. Without a maximum, an explicit 0
// keeps no limit, and a limit above the default is the job's own.
TEST_F(ControllerTest, TheControllersTimeLimitsBoundAJobsAndFillInAMissingOne) {
  const auto with_limit = [](const std::string& limit) {
    return absl::StrCat("name: t\nkind: commcheck\nparallel: {dp: 1}\n",
                        limit.empty() ? "" : "resources: {time_limit_s: " + limit + "}\n");
  };
  // What job `id` got, and how its submitted event says so.
  const auto limit_of = [&](const std::string& id) {
    const absl::StatusOr<v1::JobDetail> d = c_->GetJob(id);
    EXPECT_TRUE(d.ok()) << d.status();
    std::string submitted;
    if (d.ok()) {
      for (const v1::JobEvent& e : d->events()) {
        if (e.kind() == "submitted") submitted = e.message();
      }
    }
    return std::pair{d.ok() ? d->spec().resources().time_limit_s() : -1.0, submitted};
  };
  const auto refusal = [&](const std::string& limit) {
    const absl::StatusOr<std::string> id = c_->Submit(with_limit(limit), "r.yaml");
    EXPECT_EQ(id.status().code(), absl::StatusCode::kInvalidArgument) << id.status();
    return std::string(id.status().message());
  };
  default_time_limit_s_ = 3600;
  max_time_limit_s_ = 7200;
  Restart();
  Register(0);
  EXPECT_EQ(refusal("9000"),
            "r.yaml: resources.time_limit_s: 9000 s is more than this controller allows "
            "(--max-time-limit 7200 s); allowed: more than 0 and at most 7200, or leave it out "
            "for the controller's default (3600 s)");
  EXPECT_EQ(refusal("0"),
            "r.yaml: resources.time_limit_s: 0 (no limit) is more than this controller allows "
            "(--max-time-limit 7200 s); allowed: more than 0 and at most 7200, or leave it out "
            "for the controller's default (3600 s)");
  EXPECT_TRUE(c_->ListJobs().empty());
  std::vector<std::string> defaults;  // what the submitter is told (SubmitJobResponse.defaults)
  const absl::StatusOr<std::string> unset = c_->Submit(with_limit(""), "unset.yaml", &defaults);
  ASSERT_TRUE(unset.ok()) << unset.status();
  EXPECT_EQ(defaults, std::vector<std::string>{"resources.time_limit_s 3600 s from the "
                                               "controller's --default-time-limit"});
  EXPECT_EQ(limit_of(*unset),
            std::pair(3600.0, std::string("from unset.yaml, 1 rank; resources.time_limit_s 3600 s "
                                          "from the controller's --default-time-limit")));
  // Enforced as a limit the file gave: the deadline counts from the first attempt's start.
  job_ = *unset;
  Report(0, 1, 0, v1::RANK_STARTED);
  EXPECT_EQ(Job().summary().deadline_unix(), Job().attempts(0).started_unix() + 3600);
  const absl::StatusOr<std::string> own = c_->Submit(with_limit("7200"), "own.yaml", &defaults);
  ASSERT_TRUE(own.ok()) << own.status();
  EXPECT_TRUE(defaults.empty());
  EXPECT_EQ(limit_of(*own), std::pair(7200.0, std::string("from own.yaml, 1 rank")));
  // The limit it got is the stored one: a controller restart with other flags does not change it.
  default_time_limit_s_ = 0;
  max_time_limit_s_ = 1209600;  // two weeks: whole seconds in every message, never 1.2096e+06
  Restart();
  EXPECT_EQ(limit_of(*unset).first, 3600.0);
  Register(0);
  const absl::StatusOr<std::string> at_most = c_->Submit(with_limit(""), "at_most.yaml");
  ASSERT_TRUE(at_most.ok()) << at_most.status();
  EXPECT_EQ(limit_of(*at_most).second,
            "from at_most.yaml, 1 rank; resources.time_limit_s 1209600 s from the controller's "
            "--max-time-limit");
  EXPECT_EQ(refusal("1209601"),
            "r.yaml: resources.time_limit_s: 1209601 s is more than this controller allows "
            "(--max-time-limit 1209600 s); allowed: more than 0 and at most 1209600, or leave it "
            "out for the controller's maximum (1209600 s)");
  // A default without a maximum: an explicit 0 keeps no limit, a longer limit is the job's own.
  default_time_limit_s_ = 3600;
  max_time_limit_s_ = 0;
  Restart();
  Register(0);
  const absl::StatusOr<std::string> unlimited = c_->Submit(with_limit("0"), "unlimited.yaml");
  ASSERT_TRUE(unlimited.ok()) << unlimited.status();
  EXPECT_EQ(limit_of(*unlimited), std::pair(0.0, std::string("from unlimited.yaml, 1 rank")));
  const absl::StatusOr<std::string> longer = c_->Submit(with_limit("86400"), "longer.yaml");
  ASSERT_TRUE(longer.ok()) << longer.status();
  EXPECT_EQ(limit_of(*longer).first, 86400.0);
  // Without either, a job without a limit has none.
  default_time_limit_s_ = 0;
  Restart();
  Register(0);
  const absl::StatusOr<std::string> none = c_->Submit(with_limit(""), "none.yaml");
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_EQ(limit_of(*none), std::pair(0.0, std::string("from none.yaml, 1 rank")));
}

// A dry run (JobService.CheckJob, `furnace submit --dry-run=server`) is checked as a
// submission: the controller's time limits fill in what the file left out, and what a submission
// would be refused for is refused in the same words. It stores nothing, uses no job number and
// writes no audit record.
TEST_F(ControllerTest, ADryRunChecksAsASubmitAndStoresNothing) {
  default_time_limit_s_ = 3600;
  max_time_limit_s_ = 7200;
  Restart();
  Register(0);
  const std::string one_rank = "name: t\nkind: commcheck\nparallel: {dp: 1}\n";
  const absl::StatusOr<v1::SubmitJobResponse> checked =
      c_->CheckSubmitAs("alice", one_rank, "/home/alice/t.yaml");
  ASSERT_TRUE(checked.ok()) << checked.status();
  EXPECT_TRUE(checked->job_id().empty());
  ASSERT_EQ(checked->defaults_size(), 1);
  EXPECT_EQ(checked->defaults(0),
            "resources.time_limit_s 3600 s from the controller's --default-time-limit");
  EXPECT_EQ(checked->spec().name(), "t");
  EXPECT_EQ(checked->spec().resources().time_limit_s(), 3600);
  EXPECT_TRUE(checked->spec().checkpoint().dir().empty());  // named after the id it has not got
  // Refused as the submission would be, naming the file's base name.
  for (const std::string& file :
       {std::string("name: t\nkind: commcheck\nparallel: {dp: 2}\n"),
        one_rank + "resources: {time_limit_s: 9000}\n", std::string("name: t\nkind: nope\n")}) {
    const absl::StatusOr<v1::SubmitJobResponse> dry = c_->CheckSubmitAs("alice", file, "/x/r.yaml");
    const absl::StatusOr<std::string> real = c_->Submit(file, "r.yaml");
    EXPECT_EQ(dry.status().code(), absl::StatusCode::kInvalidArgument) << dry.status();
    EXPECT_EQ(dry.status(), real.status());
  }
  EXPECT_TRUE(c_->ListJobs().empty());
  // A checkpoint.dir a job that has not ended writes into.
  const std::string dir = (dir_ / "ck").string();
  const std::string named =
      "name: t\nkind: train\nparallel: {dp: 1}\ncheckpoint: {dir: " + dir + "}\n";
  const absl::StatusOr<std::string> first = c_->SubmitAs("bob", named, "first.yaml");
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(*first, "t-1");  // the dry runs used no number
  const absl::StatusOr<v1::SubmitJobResponse> clash = c_->CheckSubmitAs("alice", named, "r.yaml");
  EXPECT_EQ(clash.status().code(), absl::StatusCode::kFailedPrecondition) << clash.status();
  EXPECT_TRUE(absl::StrContains(clash.status().message(),
                                "r.yaml: checkpoint.dir " + dir + " is in use by job t-1"))
      << clash.status();
  EXPECT_EQ(c_->ListJobs().size(), 1u);
  const absl::StatusOr<v1::ListAuditEventsResponse> audit = c_->ListAuditEvents({});
  ASSERT_TRUE(audit.ok()) << audit.status();
  ASSERT_EQ(audit->events_size(), 1);  // bob's submission
  EXPECT_EQ(audit->events(0).identity(), "bob");
}

// A job whose ranks all run on agents the launcher did not start (started by hand) is not stopped
// by a graceful shutdown: it trains on and re-attaches to the restarted controller. Its cause
// said "the controller shut down and stopped its local workers", which was not so.
TEST_F(ControllerTest, GracefulShutdownLeavesJobsOnOtherAgentsRunning) {
  StartRunning();
  ASSERT_TRUE(c_->RecordLocalWorker(0, 555).ok());  // slot 0's local worker is another process
  c_->Shutdown(/*stopping_workers=*/true);
  Restart();
  EXPECT_EQ(Job().summary().state(), v1::JOB_RUNNING);
  Register(0, 100, {Running(job_, 1, 0)});
  Register(1, 100, {Running(job_, 1, 1)});
  c_->Tick();
  auto d = Job();
  EXPECT_EQ(d.summary().state(), v1::JOB_RUNNING);
  EXPECT_EQ(d.summary().attempt(), 1u);
  EXPECT_EQ(d.attempts(0).state(), v1::ATTEMPT_STATE_RUNNING);
  EXPECT_TRUE(Commands(0).empty());
}

// What the agent server takes after Shutdown's flush and writes behind (here the ranks' progress
// on agents the shutdown left running) is in the store once the server has stopped (FlushRecords):
// no flush would come after it.
TEST_F(ControllerTest, TheLastFlushWritesWhatCameAfterTheShutdown) {
  StartRunning();
  c_->Shutdown(/*stopping_workers=*/false);
  PushStep(1, 0, 5);
  PushStep(1, 1, 5);
  c_->FlushRecords();
  Restart();
  auto d = Job();
  EXPECT_EQ(d.attempts(0).ranks(0).step(), 5u);
  EXPECT_EQ(d.attempts(0).ranks(1).step(), 5u);
  EXPECT_EQ(d.summary().step(), 5u);
}

TEST_F(ControllerTest, AStartReportTheStoreCannotRecordIsRefusedAndUndone) {
  Register(0);
  Register(1);
  auto id = c_->Submit(kJob, "t.yaml");
  ASSERT_TRUE(id.ok()) << id.status();
  job_ = *id;
  Commands(0);
  Commands(1);
  Report(0, 1, 0, v1::RANK_STARTED);
  FailJobWrites(true);
  v1::RankReport r;
  r.set_worker_id("h/1");
  r.set_job_id(job_);
  r.set_attempt(1);
  r.set_rank(1);
  r.set_event(v1::RANK_STARTED);
  r.set_pid(1001);
  EXPECT_FALSE(c_->ReportRank(r).ok());  // the agent re-sends it
  auto d = Job();
  EXPECT_EQ(d.summary().state(), v1::JOB_STARTING);
  EXPECT_EQ(d.attempts(0).ranks(1).state(), v1::RANK_STATE_ASSIGNED);
  FailJobWrites(false);
  EXPECT_TRUE(c_->ReportRank(r).ok());
  EXPECT_EQ(Job().summary().state(), v1::JOB_RUNNING);
}

TEST_F(ControllerTest, AReattachTransitionTheStoreCannotRecordIsRetriedByTick) {
  Register(0);
  Register(1);
  auto id = c_->Submit(kJob, "t.yaml");
  ASSERT_TRUE(id.ok()) << id.status();
  job_ = *id;
  Commands(0);
  Commands(1);
  Report(0, 1, 0, v1::RANK_STARTED);  // rank 1's start report is lost with the controller
  Restart();
  FailJobWrites(true);
  Register(0, 100, {Running(job_, 1, 0)});
  Register(1, 100, {Running(job_, 1, 1)});
  EXPECT_EQ(Job().summary().state(), v1::JOB_STARTING);  // not recorded, so not taken
  c_->Tick();
  EXPECT_EQ(Job().summary().state(), v1::JOB_STARTING);
  FailJobWrites(false);
  c_->Tick();
  auto d = Job();
  EXPECT_EQ(d.summary().state(), v1::JOB_RUNNING);
  EXPECT_GT(d.attempts(0).all_running_unix(), 0);
  EXPECT_EQ(d.attempts(0).state(), v1::ATTEMPT_STATE_RUNNING);
}

// Only the first three leaving agents of a job spend no restart, and the count is stored with the
// job: a restarted controller does not start it again from zero.
TEST_F(ControllerTest, OnlyTheFirstThreeLeavingAgentsAreFreeAcrossAControllerRestart) {
  StartRunning();
  std::map<int, int> pids = {{0, 100}, {1, 100}};
  const auto slot_of = [](const std::string& worker) { return std::stoi(worker.substr(2)); };
  // The agent of rank 1 says it is leaving; both ranks end; it comes back as a new process.
  const auto leave = [&](uint32_t attempt) {
    const v1::JobDetail d = Job();
    const int slot = slot_of(d.attempts(attempt - 1).ranks(1).worker_id());
    const int other = slot_of(d.attempts(attempt - 1).ranks(0).worker_id());
    v1::HeartbeatRequest h;
    h.set_worker_id("h/" + std::to_string(slot));
    h.set_session_id(sessions_[slot]);
    h.set_leaving(true);
    c_->Heartbeat(h);
    ASSERT_EQ(Job().summary().state(), v1::JOB_RECOVERING);
    Report(slot, attempt, 1, v1::RANK_EXITED, v1::EXIT_KIND_STOPPED, "stopped: leaving");
    Report(other, attempt, 0, v1::RANK_EXITED, v1::EXIT_KIND_STOPPED, "stopped");
    pids[slot] += 10;
    Register(slot, pids[slot]);
  };
  const auto place = [&](uint32_t attempt) {
    clock_.Advance(5);  // past any backoff (at most 4 s)
    HeartbeatAll(2);
    c_->Tick();
    const v1::JobDetail d = Job();
    ASSERT_EQ(d.summary().attempt(), attempt);
    for (uint32_t r = 0; r < 2; ++r) {
      const int slot = slot_of(d.attempts(attempt - 1).ranks(r).worker_id());
      Commands(slot);
      Report(slot, attempt, r, v1::RANK_STARTED);
    }
    ASSERT_EQ(Job().summary().state(), v1::JOB_RUNNING);
  };
  for (uint32_t attempt = 1; attempt <= 3; ++attempt) {
    leave(attempt);
    EXPECT_EQ(Job().attempts(attempt - 1).state(), v1::ATTEMPT_STATE_INTERRUPTED);
    if (attempt < 3) place(attempt + 1);
  }
  EXPECT_EQ(Job().summary().restarts(), 0u);
  EXPECT_EQ(Job().summary().leaving_interruptions(), 3u);
  const v1::JobDetail before = Job();
  Restart();
  Register(0, pids[0]);
  Register(1, pids[1]);
  // The ranks' stop reports were written behind (maybe lost with the controller): their agents
  // send them again when the controller lists the ranks (worker/agent.cc, Reconcile).
  for (uint32_t r = 0; r < 2; ++r) {
    Report(slot_of(before.attempts(2).ranks(r).worker_id()), 3, r, v1::RANK_EXITED,
           v1::EXIT_KIND_STOPPED, "stopped");
  }
  place(4);
  leave(4);
  const v1::JobDetail d = Job();
  EXPECT_EQ(d.attempts(3).state(), v1::ATTEMPT_STATE_FAILED);
  EXPECT_EQ(d.summary().restarts(), 1u);  // the fourth is a restart, whatever restarted between
  EXPECT_EQ(d.summary().leaving_interruptions(), 3u);
}

}  // namespace
}  // namespace furnace::controller

namespace furnace::controller {
namespace {

// A rank that exits with an error code waits the settle window for a root cause; when the other
// ranks finish inside it, the attempt failed all the same: a job succeeds only if every rank did.
TEST_F(ControllerTest, ARankThatFailedBeforeTheOthersFinishedFailsTheAttempt) {
  StartRunning();
  Report(1, 1, 1, v1::RANK_EXITED, v1::EXIT_KIND_CODE, "exited with code 7", 7);
  Report(0, 1, 0, v1::RANK_EXITED, v1::EXIT_KIND_SUCCESS, "exited with code 0");
  auto d = Job();
  EXPECT_EQ(d.summary().state(), v1::JOB_RECOVERING);
  EXPECT_EQ(d.summary().restarts(), 1u);
  EXPECT_EQ(d.attempts(0).state(), v1::ATTEMPT_STATE_FAILED);
  EXPECT_EQ(d.attempts(0).cause(), "rank 1 on h/1: exited with code 7");
  EXPECT_EQ(d.attempts(0).ranks(1).exit_kind(), v1::EXIT_KIND_CODE);
}

// A rank whose own watchdog found it hung inside a collective is likely a victim (every rank's
// watchdog fires within about a second of the others'): the attempt waits for the report of the
// rank that hung in its own work, and that one is the cause.
TEST_F(ControllerTest, AHangInsideACollectiveWaitsForTheRankThatHungInItsOwnWork) {
  StartRunning();
  ReportHang(1, 1, "hung in step 3: all_reduce on group dp[0,1] (2 ranks) for 8.0 s", true);
  EXPECT_EQ(Job().summary().state(), v1::JOB_RUNNING);
  clock_.Advance(1.5);  // past an error exit's settle window, inside a hang's
  HeartbeatAll(2);
  c_->Tick();
  EXPECT_EQ(Job().summary().state(), v1::JOB_RUNNING);
  ReportHang(0, 0, "hung in step 3: not in a collective (its own compute, I/O or a lock) for 8.0 s",
             false);
  auto d = Job();
  EXPECT_EQ(d.summary().state(), v1::JOB_RECOVERING);
  EXPECT_EQ(d.attempts(0).failure_kind(), "hang");
  EXPECT_EQ(d.attempts(0).cause(),
            "rank 0 on h/0: hung in step 3: not in a collective (its own compute, I/O or a lock) "
            "for 8.0 s");
}

// furnace_recovery_seconds counts from the failure as the culprit's agent saw it (the start of the
// phase a hang overran), so the time to detect it is in, as in the recovery's phases.
TEST_F(ControllerTest, RecoverySecondsCountFromTheFailure) {
  StartRunning();
  v1::RankReport r = HangReport(
      1, 1, "hung in step 3: not in a collective (its own compute, I/O or a lock) for 8.0 s",
      false);
  r.set_failed_unix(clock_.UnixSeconds() - 8);  // the step began 8 s before it was reported
  ASSERT_TRUE(c_->ReportRank(r).ok());
  ASSERT_EQ(Job().summary().state(), v1::JOB_RECOVERING);
  Report(0, 1, 0, v1::RANK_EXITED, v1::EXIT_KIND_STOPPED);
  clock_.Advance(10);
  HeartbeatAll(2);
  c_->Tick();
  Commands(0);
  Commands(1);
  clock_.Advance(2);
  Report(0, 2, 0, v1::RANK_STARTED);
  Report(1, 2, 1, v1::RANK_STARTED);
  ASSERT_EQ(Job().summary().state(), v1::JOB_RUNNING);
  const MetricsSnapshot snap = c_->Metrics();
  ASSERT_EQ(snap.jobs.size(), 1u);
  EXPECT_DOUBLE_EQ(snap.jobs[0].last_recovery_seconds, 8 + 10 + 2);
}

// With no other report the victim's hang is the cause, once the window has passed, as a hang.
TEST_F(ControllerTest, AHangInsideACollectiveAloneFailsTheAttemptAfterTheWindow) {
  StartRunning();
  ReportHang(1, 1, "hung in step 3: recv with peer 0 on group pp[0,1] (2 ranks) for 8.0 s", true);
  clock_.Advance(2.9);
  HeartbeatAll(2);
  c_->Tick();
  EXPECT_EQ(Job().summary().state(), v1::JOB_RUNNING);
  clock_.Advance(0.2);
  HeartbeatAll(2);
  c_->Tick();
  auto d = Job();
  EXPECT_EQ(d.summary().state(), v1::JOB_RECOVERING);
  EXPECT_EQ(d.attempts(0).failure_kind(), "hang");
  EXPECT_EQ(d.attempts(0).cause(),
            "rank 1 on h/1: hung in step 3: recv with peer 0 on group pp[0,1] (2 ranks) for 8.0 s");
}

// A job waiting for workers another job's ranks hold says which job holds them (it named only the
// lost workers, if any, so the reason read as if they were the cause).
TEST_F(ControllerTest, AWaitingJobSaysWhichJobsHoldTheWorkers) {
  StartRunning();
  auto later = c_->Submit(absl::StrReplaceAll(kJob, {{"name: t", "name: a"}}), "a.yaml");
  ASSERT_TRUE(later.ok()) << later.status();
  auto pending = c_->GetJob(*later);
  ASSERT_TRUE(pending.ok());
  EXPECT_EQ(pending->summary().state(), v1::JOB_PENDING);
  std::string reason;
  for (const auto& e : pending->events()) {
    if (e.kind() == "waiting") reason = e.message();
  }
  EXPECT_NE(reason.find("(busy with job " + job_ + " (2))"), std::string::npos) << reason;
  // The summary says it too (furnace jobs, the dashboard's list), while the job waits.
  EXPECT_EQ(pending->summary().waiting(), reason);
  bool listed = false;
  for (const v1::JobSummary& j : c_->ListJobs()) listed |= j.waiting() == reason;
  EXPECT_TRUE(listed);
  EXPECT_TRUE(Job().summary().waiting().empty());  // the running one
}

// A pending job accepted when the controller had the workers for it, which lost them since: the
// reason says no job's end frees enough, only workers joining.
TEST_F(ControllerTest, AWaitingJobSaysWhenTooFewWorkersAreLeftForIt) {
  StartRunning();
  auto later = c_->Submit(absl::StrReplaceAll(kJob, {{"name: t", "name: a"}}), "a.yaml");
  ASSERT_TRUE(later.ok()) << later.status();
  clock_.Advance(11);  // past --worker-timeout: h/1 is lost, h/0 heard from
  Beat(0);
  c_->Tick();
  auto pending = c_->GetJob(*later);
  ASSERT_TRUE(pending.ok());
  EXPECT_EQ(pending->summary().state(), v1::JOB_PENDING);
  EXPECT_NE(pending->summary().waiting().find(
                "only 1 cpu worker is not lost: it starts once 1 more join"),
            std::string::npos)
      << pending->summary().waiting();
}

// A job recovering (its backoff running, its workers free meanwhile) keeps its claim on them: a job
// submitted then waits, saying why, and the recovering one gets its workers back first, though
// its id sorts after the newer one's ("t-1" after "a-2"; they were tried in id order).
TEST_F(ControllerTest, ARecoveringJobKeepsItsWorkersFromAJobSubmittedAfterIt) {
  StartRunning();
  Report(0, 1, 0, v1::RANK_EXITED, v1::EXIT_KIND_SIGNAL);  // a crash: root cause
  Report(1, 1, 1, v1::RANK_EXITED, v1::EXIT_KIND_STOPPED);
  ASSERT_EQ(Job().summary().state(), v1::JOB_RECOVERING);
  auto later = c_->Submit(absl::StrReplaceAll(kJob, {{"name: t", "name: a"}}), "a.yaml");
  ASSERT_TRUE(later.ok()) << later.status();
  auto pending = c_->GetJob(*later);
  ASSERT_TRUE(pending.ok());
  EXPECT_EQ(pending->summary().state(), v1::JOB_PENDING);
  bool said = false;
  for (const auto& e : pending->events()) {
    said |= e.kind() == "waiting" &&
            e.message() == "waits behind recovering job " + job_ +
                               ", which claims 2 cpu workers first: 2 are free or freeing up, 4 "
                               "are needed for both";
  }
  EXPECT_TRUE(said) << pending->DebugString();
  clock_.Advance(1.5);  // past the backoff
  HeartbeatAll(2);
  c_->Tick();
  EXPECT_EQ(Job().summary().state(), v1::JOB_STARTING);
  EXPECT_EQ(Job().summary().attempt(), 2u);
  EXPECT_EQ(c_->GetJob(*later)->summary().state(), v1::JOB_PENDING);
}

// The claim holds while the failed attempt's ranks still drain: a job pending beside it does not
// take the first worker that frees up (it took the workers of a recovering job mid-training, which
// then waited for them), nor, after a controller restart, the first that registers again.
TEST_F(ControllerTest, ARecoveringJobKeepsItsWorkersWhileItsRanksStillDrain) {
  StartRunning();
  auto later =
      c_->Submit(absl::StrReplaceAll(kJob, {{"name: t", "name: a"}, {"dp: 2", "dp: 1"}}), "a.yaml");
  ASSERT_TRUE(later.ok()) << later.status();
  Report(0, 1, 0, v1::RANK_EXITED, v1::EXIT_KIND_SIGNAL);  // rank 1 still drains on h/1
  ASSERT_EQ(Job().summary().state(), v1::JOB_RECOVERING);
  HeartbeatAll(2);
  c_->Tick();
  auto waiting = [&] {
    auto d = c_->GetJob(*later);
    EXPECT_TRUE(d.ok());
    std::string reason;
    for (const auto& e : d->events()) {
      if (e.kind() == "waiting") reason = e.message();
    }
    return std::make_pair(d->summary().state(), reason);
  };
  EXPECT_EQ(waiting().first, v1::JOB_PENDING);
  EXPECT_EQ(waiting().second, "waits behind recovering job " + job_ +
                                  ", which claims 2 cpu workers first: 2 are free or freeing up, "
                                  "3 are needed for both");
  Report(1, 1, 1, v1::RANK_EXITED, v1::EXIT_KIND_STOPPED);
  c_->Tick();
  EXPECT_EQ(waiting().first, v1::JOB_PENDING);

  // The controller restarts during the backoff; one worker registers again, the other not yet.
  Restart();
  Register(0);
  clock_.Advance(0.5);
  c_->Tick();
  EXPECT_EQ(waiting().first, v1::JOB_PENDING) << waiting().second;
  Register(1);
  Report(1, 1, 1, v1::RANK_EXITED, v1::EXIT_KIND_STOPPED);  // (agents re-send unacked reports)
  clock_.Advance(1.5);                                      // past the backoff
  HeartbeatAll(2);
  c_->Tick();
  EXPECT_EQ(Job().summary().state(), v1::JOB_STARTING);
  EXPECT_EQ(c_->GetJob(*later)->summary().state(), v1::JOB_PENDING);
}

// A tick weighs every waiting job against one scan of the workers, taken again after a job starts:
// the jobs after it see the workers it took as busy, not the scan's stale free ones.
TEST_F(ControllerTest, OneTickStartsWaitingJobsOnlyOnWorkersStillFree) {
  for (int s = 0; s < 3; ++s) Register(s);
  const std::string running = SubmitNamed("run", 3);
  ReportAll(running, v1::RANK_STARTED);
  const std::string a = SubmitNamed("a", 2);
  const std::string b = SubmitNamed("b", 2);
  const std::string c = SubmitNamed("c", 1);
  ReportAll(running, v1::RANK_EXITED);
  for (const std::string& id : {a, b, c}) ASSERT_EQ(SummaryOf(id).state(), v1::JOB_PENDING);
  HeartbeatAll(3);
  c_->Tick();  // a takes two of the three, b does not fit the one left, c takes it
  EXPECT_EQ(SummaryOf(a).state(), v1::JOB_STARTING);
  EXPECT_EQ(SummaryOf(b).state(), v1::JOB_PENDING);
  EXPECT_EQ(SummaryOf(c).state(), v1::JOB_STARTING);
  std::set<std::string> placed;
  for (const std::string& id : {a, c}) {
    const v1::JobDetail detail = *c_->GetJob(id);
    for (const v1::RankInfo& r : detail.attempts(0).ranks()) {
      EXPECT_TRUE(placed.insert(r.worker_id()).second) << r.worker_id() << " placed twice";
    }
  }
  EXPECT_EQ(placed.size(), 3u);
}

// A waiting reason names the first 8 jobs holding reservations ahead (kNamedReserved), and counts
// the rest: behind a thousand, naming each made every tick O(pending^2) bytes.
TEST_F(ControllerTest, AWaitingReasonNamesTheFirstReservedJobsAndCountsTheRest) {
  for (int s = 0; s < 3; ++s) Register(s);
  const std::string running = SubmitNamed("run", 2);
  ReportAll(running, v1::RANK_STARTED);
  std::vector<std::string> big;
  for (int i = 0; i < 10; ++i) {
    big.push_back(SubmitNamed(absl::StrCat("big", i), 3));
    clock_.Advance(1);  // submitted one after the other
  }
  clock_.Advance(601);
  HeartbeatAll(3);
  c_->Tick();
  const std::string late = SubmitNamed("late", 1);
  EXPECT_EQ(SummaryOf(late).waiting(),
            "waits behind jobs " + absl::StrJoin(big.begin(), big.begin() + 8, ", ") +
                " and 2 more, pending over 600 s: the next 30 cpu workers to free up are reserved "
                "for them (--reserve-after); 1 free, 31 needed for both; no backfill: when the "
                "reserved workers free up is unknown (job " +
                running + " has no resources.time_limit_s)");
}

// --reserve-after: a job pending that long has the next workers to free up reserved for it. Before
// that, a job submitted after it starts on what it cannot use yet; after, no longer, so a stream of
// small jobs cannot hold the large one back forever. It starts as soon as enough are free.
TEST_F(ControllerTest, AJobPendingLongHasTheNextWorkersToFreeUpReservedForIt) {
  for (int s = 0; s < 3; ++s) Register(s);
  const std::string running = SubmitNamed("run", 2);
  ReportAll(running, v1::RANK_STARTED);
  const std::string big = SubmitNamed("big", 3);
  EXPECT_EQ(SummaryOf(big).state(), v1::JOB_PENDING);
  const std::string early = SubmitNamed("early", 1);  // big has waited less than 600 s
  EXPECT_EQ(SummaryOf(early).state(), v1::JOB_STARTING);
  ReportAll(early, v1::RANK_STARTED);
  ReportAll(early, v1::RANK_EXITED);
  EXPECT_EQ(SummaryOf(early).state(), v1::JOB_SUCCEEDED);

  clock_.Advance(601);
  HeartbeatAll(3);
  c_->Tick();
  EXPECT_EQ(SummaryOf(big).state(), v1::JOB_PENDING);
  EXPECT_NE(SummaryOf(big).waiting().find(
                "; the next workers to free up are reserved for it (pending over 600 s: "
                "--reserve-after)"),
            std::string::npos)
      << SummaryOf(big).waiting();
  const std::string late = SubmitNamed("late", 1);  // one worker free, but it is big's
  EXPECT_EQ(SummaryOf(late).state(), v1::JOB_PENDING);
  EXPECT_EQ(SummaryOf(late).waiting(),
            "waits behind job " + big +
                ", pending over 600 s: the next 3 cpu workers to free up are reserved for it "
                "(--reserve-after); 1 free, 4 needed for both; no backfill: when the reserved "
                "workers free up is unknown (job " +
                running + " has no resources.time_limit_s)");

  ReportAll(running, v1::RANK_EXITED);  // three free: big starts, late still waits
  HeartbeatAll(3);
  c_->Tick();
  EXPECT_EQ(SummaryOf(big).state(), v1::JOB_STARTING);
  EXPECT_EQ(SummaryOf(late).state(), v1::JOB_PENDING);
}

// Backfill: a job held back by a reservation starts anyway when it cannot delay the reserved job.
// The reserved workers are free at the latest when the time limits of the jobs on them end (plus
// the stop graces and a margin: the shadow time); a job whose own limit ends it by then starts,
// one whose limit ends later waits and is told by when it would have to end, and behind a job
// without a time limit there is no shadow time. Taking only workers the reserved job will not
// need then, a job starts whatever its limit. The reserved job starts when the limits end.
TEST_F(ControllerTest, ABackfillStartsWhereItCannotDelayTheReservedJob) {
  for (int s = 0; s < 4; ++s) Register(s);
  const auto events = [&](const std::string& id, const std::string& kind) {
    std::vector<std::string> out;
    const v1::JobDetail detail = *c_->GetJob(id);
    for (const v1::JobEvent& e : detail.events()) {
      if (e.kind() == kind) out.push_back(e.message());
    }
    return out;
  };
  const std::string run = SubmitNamed("run", 2, "1000");  // on 2 of the 4 workers until t0 + 1000
  const double t0 = c_->GetJob(run)->attempts(0).started_unix();
  ReportAll(run, v1::RANK_STARTED);
  const std::string forever = SubmitNamed("forever", 1, "");  // a third, with no time limit
  ReportAll(forever, v1::RANK_STARTED);
  const std::string big = SubmitNamed("big", 3, "");
  clock_.Advance(601);  // big holds a reservation: 1 free, 3 reserved
  HeartbeatAll(4);
  c_->Tick();
  ASSERT_EQ(SummaryOf(big).state(), v1::JOB_PENDING);
  // Shadow time: run's 2 workers free by t0 + 1000 + 5 (SIGTERM grace) + 15 (margin); with the
  // free one, 3: enough for big. A 1-rank job ending by then (its own 20 s after its limit) may
  // use the free worker meanwhile.
  const std::string shadow = UnixClock(t0 + 1020);
  const std::string late = SubmitNamed("late", 1, "500");  // ends by t0 + 601 + 520 > shadow
  EXPECT_EQ(SummaryOf(late).state(), v1::JOB_PENDING);
  EXPECT_EQ(SummaryOf(late).waiting(),
            "waits behind job " + big +
                ", pending over 600 s: the next 3 cpu workers to free up are reserved for it "
                "(--reserve-after); 1 free, 4 needed for both; it could start beside job " +
                big + " as a backfill if resources.time_limit_s ended it by " +
                UnixClock(t0 + 1000));
  const std::string brief = SubmitNamed("brief", 1, "300");  // ends by t0 + 601 + 320: before it
  EXPECT_EQ(SummaryOf(brief).state(), v1::JOB_STARTING);
  EXPECT_EQ(events(brief, "backfill"),
            std::vector<std::string>{"backfilled beside job " + big +
                                     "'s reservation: resources.time_limit_s 300 ends it by " +
                                     UnixClock(t0 + 921) + ", before the workers for job " + big +
                                     " are free (by " + shadow +
                                     " at the latest, as the jobs on them end)"});
  EXPECT_EQ(SummaryOf(big).state(), v1::JOB_PENDING);
  ReportAll(brief, v1::RANK_STARTED);

  // The limits end: run at t0 + 1000 (FAILED, its ranks stopped), brief before; big starts on
  // their workers and forever's is still forever's.
  clock_.Advance(400);
  HeartbeatAll(4);
  c_->Tick();
  ASSERT_EQ(SummaryOf(run).state(), v1::JOB_FAILED);
  ASSERT_EQ(SummaryOf(brief).state(), v1::JOB_FAILED);
  ReportAll(run, v1::RANK_EXITED);
  ReportAll(brief, v1::RANK_EXITED);
  HeartbeatAll(4);
  c_->Tick();
  EXPECT_EQ(SummaryOf(big).state(), v1::JOB_STARTING);
  EXPECT_EQ(SummaryOf(late).state(), v1::JOB_PENDING);  // no worker left for it
}

// Behind workers whose jobs have no time limit there is no shadow time: no backfill, and the
// waiting job is told why. Workers beyond what the reserved job needs at the shadow time are
// free to any job (here 4 free by then, 3 reserved: one job of one rank without a limit).
TEST_F(ControllerTest, ABackfillNeedsTheTimeLimitsOfTheJobsOnTheReservedWorkers) {
  for (int s = 0; s < 4; ++s) Register(s);
  const std::string run = SubmitNamed("run", 2, "");
  ReportAll(run, v1::RANK_STARTED);
  const std::string big = SubmitNamed("big", 3, "");
  clock_.Advance(601);
  HeartbeatAll(4);
  c_->Tick();
  ASSERT_EQ(SummaryOf(big).state(), v1::JOB_PENDING);
  const std::string brief = SubmitNamed("brief", 1, "60");
  EXPECT_EQ(SummaryOf(brief).state(), v1::JOB_PENDING);
  EXPECT_EQ(SummaryOf(brief).waiting(),
            "waits behind job " + big +
                ", pending over 600 s: the next 3 cpu workers to free up are reserved for it "
                "(--reserve-after); 2 free, 4 needed for both; no backfill: when the reserved "
                "workers free up is unknown (job " +
                run + " has no resources.time_limit_s)");
  ASSERT_TRUE(c_->Cancel(brief).ok());
  ASSERT_TRUE(c_->Cancel(run).ok());  // its ranks stop: free by now + 5 + 15 at the latest
  const std::string spare = SubmitNamed("spare", 1, "");
  EXPECT_EQ(SummaryOf(spare).state(), v1::JOB_STARTING);
  std::vector<std::string> backfill;
  const v1::JobDetail detail = *c_->GetJob(spare);
  for (const v1::JobEvent& e : detail.events()) {
    if (e.kind() == "backfill") backfill.push_back(e.message());
  }
  EXPECT_EQ(backfill,
            std::vector<std::string>{
                "backfilled beside job " + big +
                "'s reservation: it takes 1 worker beyond what the reserved jobs need once enough "
                "are free for them (by " +
                UnixClock(clock_.UnixSeconds() + 20) + " at the latest, as the jobs on them end)"});
}

// Several reservations: each reserved job may start once the workers for it and every older one
// are free, so a backfill must not hold the oldest back past its own, earlier shadow time (here
// the 2 workers for b1 are free when x's limit ends, long before the 4 for b1 and b2 when y's
// does): a job whose limit ends between the two waits, one ending before the first starts.
TEST_F(ControllerTest, ABackfillHoldsNoReservedJobPastItsOwnShadowTime) {
  for (int s = 0; s < 5; ++s) Register(s);
  const std::string x = SubmitStarted("x", 1, "2000");  // frees 1 worker by t0 + 2020
  const double t0 = c_->GetJob(x)->attempts(0).started_unix();
  const std::string y = SubmitStarted("y", 3, "5000");  // frees 3 by t0 + 5020; 1 worker free
  const std::string b1 = SubmitStarted("b1", 2, "");
  const std::string b2 = SubmitStarted("b2", 2, "");
  clock_.Advance(601);
  HeartbeatAll(5);
  c_->Tick();
  ASSERT_EQ(SummaryOf(b1).state(), v1::JOB_PENDING);
  ASSERT_EQ(SummaryOf(b2).state(), v1::JOB_PENDING);
  // Ends by t0 + 601 + 1520: after b1's shadow time (t0 + 2020), before b2's (t0 + 5020).
  const std::string middle = SubmitStarted("middle", 1, "1500");
  EXPECT_EQ(SummaryOf(middle).state(), v1::JOB_PENDING);
  EXPECT_NE(SummaryOf(middle).waiting().find("; it could start beside jobs " + b1 + ", " + b2 +
                                             " as a backfill if resources.time_limit_s ended it "
                                             "by " +
                                             UnixClock(t0 + 2000)),
            std::string::npos)
      << SummaryOf(middle).waiting();
  const std::string brief = SubmitStarted("brief", 1, "1000");  // by t0 + 1621: before both
  EXPECT_EQ(SummaryOf(brief).state(), v1::JOB_RUNNING);
  EXPECT_EQ(SummaryOf(middle).state(), v1::JOB_PENDING);
}

// Reserved jobs that together need more workers than there are: the younger starts only after
// the older ends, which no time limit says; a job ending by the oldest's shadow time still
// backfills (the younger ones start after that), one ending later waits and is told by when.
TEST_F(ControllerTest, ABackfillEndingByTheOldestsShadowTimeIsSafeForEveryReservedJob) {
  for (int s = 0; s < 3; ++s) Register(s);
  const std::string x = SubmitStarted("x", 2, "2000");  // frees 2 workers by t0 + 2020; 1 free
  const double t0 = c_->GetJob(x)->attempts(0).started_unix();
  const std::string b1 = SubmitStarted("b1", 3, "");
  const std::string b2 = SubmitStarted("b2", 3, "");  // b1 and b2: 6 of 3 workers
  clock_.Advance(601);
  HeartbeatAll(3);
  c_->Tick();
  ASSERT_EQ(SummaryOf(b2).state(), v1::JOB_PENDING);
  const std::string late =
      SubmitStarted("late", 1, "1500");  // by t0 + 2121: after b1's shadow time
  EXPECT_EQ(SummaryOf(late).state(), v1::JOB_PENDING);
  EXPECT_NE(SummaryOf(late).waiting().find("as a backfill if resources.time_limit_s ended it by " +
                                           UnixClock(t0 + 2000)),
            std::string::npos)
      << SummaryOf(late).waiting();
  const std::string brief = SubmitStarted("brief", 1, "1000");  // by t0 + 1621
  EXPECT_EQ(SummaryOf(brief).state(), v1::JOB_RUNNING);
}

// An agent killed outright takes its rank with it; the peer's collective fails at once with a
// broken connection, an error exit that looks like the root cause. While the dead agent has missed
// its heartbeats the failure waits: its restart (or its loss) is the cause, and the peer's worker
// is not blamed (it was: "rank 0 on h/0: exited with code 1", kind exit).
TEST_F(ControllerTest, APeersBrokenConnectionWaitsForTheSilentAgentThatCausedIt) {
  for (const bool restarts : {true, false}) {
    SCOPED_TRACE(restarts ? "the agent restarts" : "the agent is lost");
    if (!restarts) {
      TearDown();
      SetUp();
    }
    StartRunning();
    HeartbeatAll(2);
    clock_.Advance(1.0);  // h/1's agent is killed: only h/0 beats from here on
    const auto beat0 = [&] {
      v1::HeartbeatRequest h;
      h.set_worker_id("h/0");
      h.set_session_id(sessions_[0]);
      EXPECT_FALSE(c_->Heartbeat(h).reregister());
    };
    beat0();
    Report(0, 1, 0, v1::RANK_EXITED, v1::EXIT_KIND_CODE,
           "exited with code 1: gloo all_to_all: Connection reset by peer", 1);
    for (int i = 0; i < 4; ++i) {  // 2 s: past the 1 s settle window
      clock_.Advance(0.5);
      beat0();
      c_->Tick();
    }
    EXPECT_EQ(Job().summary().state(), v1::JOB_RUNNING);
    if (restarts) {
      Register(1, /*pid=*/900);  // the launcher's new agent on slot 1
    } else {
      for (int i = 0; i < 8; ++i) {  // past recovery.heartbeat_timeout_s (5 s)
        clock_.Advance(0.5);
        beat0();
        c_->Tick();
      }
    }
    const v1::JobDetail d = Job();
    EXPECT_EQ(d.summary().state(), v1::JOB_RECOVERING);
    EXPECT_EQ(d.attempts(0).failure_kind(), restarts ? "agent_restart" : "lost");
    EXPECT_EQ(d.attempts(0).culprit_worker(), "h/1") << d.attempts(0).cause();
  }
}

// The wait ends when the quiet agent is heard from again: then the peer's exit is the cause.
TEST_F(ControllerTest, APeersErrorExitFailsTheAttemptOnceEveryAgentIsHeardFrom) {
  StartRunning();
  HeartbeatAll(2);
  clock_.Advance(1.0);
  Report(0, 1, 0, v1::RANK_EXITED, v1::EXIT_KIND_CODE, "exited with code 1: bad things", 1);
  clock_.Advance(1.1);
  c_->Tick();  // neither agent has beaten for 2.1 s: held
  EXPECT_EQ(Job().summary().state(), v1::JOB_RUNNING);
  HeartbeatAll(2);
  c_->Tick();
  const v1::JobDetail d = Job();
  EXPECT_EQ(d.summary().state(), v1::JOB_RECOVERING);
  EXPECT_EQ(d.attempts(0).failure_kind(), "exit");
  EXPECT_EQ(d.attempts(0).culprit_worker(), "h/0");
}

// A rank frozen (SIGSTOP) sends nothing, not even its watchdog's heartbeat; its peers hang inside a
// collective waiting for it and report first, and its own agent calls it hung only at 1.5 x
// hang_timeout_s, after the window. Its agent's heartbeats say how long it has been silent, so the
// attempt blames it and its worker, not the peer that reported (which was blamed before).
TEST_F(ControllerTest, AFrozenRankIsBlamedNotThePeerThatHungWaitingForIt) {
  StartRunning();
  const auto beat = [&](int slot, double silent_s) {
    v1::HeartbeatRequest h;
    h.set_worker_id("h/" + std::to_string(slot));
    h.set_session_id(sessions_[slot]);
    v1::RunningRank r = Running(job_, 1, slot);
    r.set_silent_s(silent_s);
    *h.add_running() = r;
    EXPECT_FALSE(c_->Heartbeat(h).reregister());
  };
  beat(0, 0.4);  // alive: its watchdog's heartbeat came 0.4 s ago
  ReportHang(1, 1, "hung in step 3: all_reduce on group world[0,1] (2 ranks) for 10.0 s", true);
  beat(0, 10.2);  // frozen since shortly before its peer's collective began
  clock_.Advance(3.1);
  beat(0, 13.3);
  c_->Tick();
  const v1::JobDetail d = Job();
  EXPECT_EQ(d.summary().state(), v1::JOB_RECOVERING);
  EXPECT_EQ(d.attempts(0).failure_kind(), "hang");
  EXPECT_EQ(d.attempts(0).cause(),
            "rank 0 on h/0: sent nothing for 13.3 s, not even its watchdog's heartbeat (frozen: "
            "stopped, or every thread blocked); the ranks hung in a collective waited for it "
            "(rank 1 on h/1: hung in step 3: all_reduce on group world[0,1] (2 ranks) for 10.0 s)");
}

// Silence is what the agent saw, never the age of its last heartbeat: a live rank (0.9 s since its
// watchdog's last heartbeat) whose agent's beats then stop coming is no frozen rank, and the
// victim is blamed as before.
TEST_F(ControllerTest, ALateHeartbeatIsNoEvidenceOfAFrozenRank) {
  StartRunning();
  v1::HeartbeatRequest h;
  h.set_worker_id("h/0");
  h.set_session_id(sessions_[0]);
  v1::RunningRank r = Running(job_, 1, 0);
  r.set_silent_s(0.9);
  *h.add_running() = r;
  EXPECT_FALSE(c_->Heartbeat(h).reregister());
  ReportHang(1, 1, "hung in step 3: all_reduce on group world[0,1] (2 ranks) for 10.0 s", true);
  clock_.Advance(3.1);  // no beat from h/0 since
  c_->Tick();
  const v1::JobDetail d = Job();
  EXPECT_EQ(d.summary().state(), v1::JOB_RECOVERING);
  EXPECT_EQ(d.attempts(0).cause(),
            "rank 1 on h/1: hung in step 3: all_reduce on group world[0,1] (2 ranks) for 10.0 s");
}

// A success that leaves ranks running is in the store before it is acknowledged (its worker is
// freed at once and may take another job's rank: an exit lost in a crash would then never be
// reported again). After a restart, the agent's report sent again changes nothing, and the job
// ends as it should.
TEST_F(ControllerTest, ASuccessBeforeARestartIsKept) {
  StartRunning();
  Report(0, 1, 0, v1::RANK_EXITED, v1::EXIT_KIND_SUCCESS);
  EXPECT_EQ(Job().summary().state(), v1::JOB_RUNNING);
  Restart();
  Register(0);
  Register(1, 100, {Running(job_, 1, 1)});
  ASSERT_EQ(Job().summary().state(), v1::JOB_RUNNING);
  Report(0, 1, 0, v1::RANK_EXITED, v1::EXIT_KIND_SUCCESS);  // sent again
  Report(1, 1, 1, v1::RANK_EXITED, v1::EXIT_KIND_SUCCESS);
  auto d = Job();
  EXPECT_EQ(d.summary().state(), v1::JOB_SUCCEEDED);
  EXPECT_EQ(d.attempts(0).state(), v1::ATTEMPT_STATE_SUCCEEDED);
}

// The settle window is in memory only: the failed rank's exit kind, in the store, still fails
// the attempt when the last rank finishes after a controller restart.
TEST_F(ControllerTest, ARankThatFailedBeforeAControllerRestartStillFailsTheAttempt) {
  StartRunning();
  Report(1, 1, 1, v1::RANK_EXITED, v1::EXIT_KIND_CODE, "exited with code 7", 7);
  Restart();
  Register(0, 100, {Running(job_, 1, 0)});
  Register(1);
  ASSERT_EQ(Job().summary().state(), v1::JOB_RUNNING);
  Report(0, 1, 0, v1::RANK_EXITED, v1::EXIT_KIND_SUCCESS, "exited with code 0");
  auto d = Job();
  EXPECT_EQ(d.summary().state(), v1::JOB_RECOVERING);
  EXPECT_EQ(d.attempts(0).cause(), "rank 1 on h/1: exited with code 7");
}

// A failure the store cannot record is never acknowledged (the agent re-sends the report) nor
// forgotten (Tick retries the settle window's failure until it is written).
TEST_F(ControllerTest, AFailureTheStoreCannotRecordIsRetried) {
  StartRunning();
  FailJobWrites(true);
  v1::RankReport r;
  r.set_worker_id("h/0");
  r.set_job_id(job_);
  r.set_attempt(1);
  r.set_rank(0);
  r.set_event(v1::RANK_EXITED);
  r.set_exit_kind(v1::EXIT_KIND_CODE);
  r.set_exit_code(v1::RANK_EXIT_BAD_INPUT);
  r.set_reason("exited with code 4: bad input");
  EXPECT_FALSE(c_->ReportRank(r).ok());
  EXPECT_EQ(Job().summary().state(), v1::JOB_RUNNING);
  FailJobWrites(false);
  EXPECT_TRUE(c_->ReportRank(r).ok());
  EXPECT_EQ(Job().summary().state(), v1::JOB_FAILED);
}

TEST_F(ControllerTest, ASettleWindowFailureTheStoreCannotRecordIsRetriedByTick) {
  StartRunning();
  Report(0, 1, 0, v1::RANK_EXITED, v1::EXIT_KIND_CODE, "exited with code 1", 1);
  FailJobWrites(true);
  clock_.Advance(1.1);
  HeartbeatAll(2);
  c_->Tick();
  EXPECT_EQ(Job().summary().state(), v1::JOB_RUNNING);
  FailJobWrites(false);
  c_->Tick();
  auto d = Job();
  EXPECT_EQ(d.summary().state(), v1::JOB_RECOVERING);
  EXPECT_EQ(d.attempts(0).cause(), "rank 0 on h/0: exited with code 1");
}

}  // namespace
}  // namespace furnace::controller

namespace furnace::controller {
namespace {

// recovery.heartbeat_timeout_s is the limit for the job's workers either way: here 30 s, longer
// than the controller's --worker-timeout (10 s), which it replaced only when shorter before.
TEST_F(ControllerTest, AJobsHeartbeatTimeoutCanBeLongerThanTheControllers) {
  StartRunning(R"(name: t
kind: commcheck
parallel: {dp: 2}
recovery:
  heartbeat_timeout_s: 30
)");
  const auto beat = [&](int slot) {
    v1::HeartbeatRequest h;
    h.set_worker_id("h/" + std::to_string(slot));
    h.set_session_id(sessions_[slot]);
    c_->Heartbeat(h);
  };
  for (int i = 0; i < 5; ++i) {  // worker 1 silent for 25 s
    clock_.Advance(5);
    beat(0);
    c_->Tick();
  }
  EXPECT_EQ(Job().summary().state(), v1::JOB_RUNNING);
  clock_.Advance(6);
  beat(0);
  c_->Tick();
  EXPECT_NE(Job().attempts(0).cause().find("worker h/1 lost (no heartbeat for 31.0 s)"),
            std::string::npos)
      << Job().attempts(0).cause();
}

// Shorter than two heartbeats (every 0.75 s here) is refused at submit: a healthy agent would be
// declared lost.
TEST_F(ControllerTest, AHeartbeatTimeoutShorterThanTwoHeartbeatsIsRefused) {
  Register(0);
  auto id = c_->Submit("name: t\nkind: commcheck\nrecovery: {heartbeat_timeout_s: 1}\n", "t.yaml");
  ASSERT_FALSE(id.ok());
  EXPECT_EQ(id.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(id.status().message(),
            "t.yaml: recovery.heartbeat_timeout_s: 1 s is shorter than two heartbeats of this "
            "controller's agents (every 0.75 s); allowed: at least 1.5, or leave it out for the "
            "controller's --worker-timeout (10 s)");
}

}  // namespace
}  // namespace furnace::controller

namespace furnace::controller {
namespace {

// furnace_job_restarts_total never goes down: a restart is recorded when the attempt fails, so
// a job cancelled while it recovers keeps the restart it made.
TEST_F(ControllerTest, TheRestartCountStaysWhenARecoveringJobEnds) {
  StartRunning();
  Report(0, 1, 0, v1::RANK_EXITED, v1::EXIT_KIND_SIGNAL, "killed by signal 9 (SIGKILL)");
  ASSERT_EQ(Job().summary().state(), v1::JOB_RECOVERING);
  EXPECT_EQ(c_->Metrics().jobs[0].restarts_by_cause,
            (std::map<std::string, uint64_t>{{"signal", 1}}));
  ASSERT_TRUE(c_->Cancel(job_).ok());
  ASSERT_EQ(Job().summary().state(), v1::JOB_CANCELLED);
  EXPECT_EQ(c_->Metrics().jobs[0].restarts_by_cause,
            (std::map<std::string, uint64_t>{{"signal", 1}}));
}

// An agent that shuts down (SIGTERM: a node drained) says so in a last heartbeat: its worker is
// lost at once, nothing is placed on it, and the attempt it held a rank of is interrupted, which
// spends no restart. Before, the attempt failed, the next one was placed on the departing worker
// and failed again: one agent stop cost two restarts.
// A victim's error exit waits in the settle window for a root cause. A root cause that the store
// cannot take at once (the leaving agent's interruption, retried by Tick) replaces it: the attempt
// is interrupted, spending no restart, not failed as the victim's exit.
TEST_F(ControllerTest, ARootCauseRetriedByTickReplacesAVictimsPendingFailure) {
  StartRunning();
  Register(2);
  clock_.Advance(5);  // (a settle deadline of 0 means none: the fake clock starts at 0)
  Report(0, 1, 0, v1::RANK_EXITED, v1::EXIT_KIND_CODE, "exited with code 1", 1);
  FailJobWrites(true);
  v1::HeartbeatRequest h;
  h.set_worker_id("h/1");
  h.set_session_id(sessions_[1]);
  h.set_leaving(true);
  c_->Heartbeat(h);
  EXPECT_EQ(Job().summary().state(), v1::JOB_RUNNING);
  FailJobWrites(false);
  c_->Tick();  // (an interruption has no backoff: the next attempt may be placed at once)
  auto d = Job();
  EXPECT_EQ(d.summary().restarts(), 0u);
  EXPECT_EQ(d.attempts(0).state(), v1::ATTEMPT_STATE_INTERRUPTED);
  EXPECT_EQ(d.attempts(0).failure_kind(), "interrupted");
  EXPECT_NE(d.attempts(0).cause().find("worker h/1 left"), std::string::npos)
      << d.attempts(0).cause();
  // Free, but one of the job's three free leavings, written with the interruption: an agent
  // that leaves whenever the store falters cannot restart the job forever.
  EXPECT_EQ(d.summary().leaving_interruptions(), 1u);
}

// A rank's successful exit that leaves others running is written behind: its report is answered,
// and its worker freed, only once the exit is in the store (the next flush, or the job's next
// write), so the exits at the end of a large job share a few writes and no agent hears "recorded"
// before it is. A re-sent report waits for the same write; a store that refuses the flush keeps
// them waiting; the worker lost meanwhile does not undo the success.
class ExitWriteBehindTest : public ControllerTest {
 protected:
  v1::RankReport Exit(int slot, uint32_t rank) {
    return MakeReport(slot, 1, rank, v1::RANK_EXITED, v1::EXIT_KIND_SUCCESS, "exited with code 0");
  }
  // The answers a report got so far.
  struct Answers {
    std::vector<absl::Status> got;
    std::function<void(absl::Status)> Sink() {
      return [this](absl::Status s) { got.push_back(std::move(s)); };
    }
  };
  v1::WorkerState StateOf(const std::string& worker) {
    for (const auto& w : c_->ListWorkers()) {
      if (w.worker_id() == worker) return w.state();
    }
    return v1::WORKER_STATE_UNSPECIFIED;
  }
  void Flush() {
    clock_.Advance(1.0);  // the controller writes jobs behind about once a second
    HeartbeatAll(static_cast<int>(sessions_.size()));
    c_->Tick();
  }
};

TEST_F(ExitWriteBehindTest, TheAnswerAndTheWorkerWaitForTheWrite) {
  StartRunning();
  Register(2);
  Answers first, again;
  c_->ReportRank(Exit(0, 0), first.Sink());
  EXPECT_TRUE(first.got.empty()) << "answered before the exit was written";
  EXPECT_EQ(StateOf("h/0"), v1::WORKER_STATE_BUSY);
  // Its answer did not come in time: sent again. The first call (its client gave up) is
  // answered now, the second waits for the write in its place.
  c_->ReportRank(Exit(0, 0), again.Sink());
  ASSERT_EQ(first.got.size(), 1u);
  EXPECT_EQ(first.got[0].code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(again.got.empty());
  EXPECT_EQ(StateOf("h/0"), v1::WORKER_STATE_BUSY);
  Flush();
  EXPECT_EQ(first.got.size(), 1u);
  ASSERT_EQ(again.got.size(), 1u);
  EXPECT_TRUE(again.got[0].ok());
  EXPECT_EQ(StateOf("h/0"), v1::WORKER_STATE_READY);
  // In the store: a restarted controller sees rank 0 ended.
  Restart();
  EXPECT_EQ(Job().attempts(0).ranks(0).state(), v1::RANK_STATE_EXITED);
  EXPECT_EQ(Job().attempts(0).ranks(0).exit_kind(), v1::EXIT_KIND_SUCCESS);
}

TEST_F(ExitWriteBehindTest, AStoreThatRefusesTheFlushKeepsTheAnswerWaiting) {
  StartRunning();
  Answers a;
  FailJobWrites(true);
  c_->ReportRank(Exit(0, 0), a.Sink());
  Flush();
  EXPECT_TRUE(a.got.empty()) << "answered though the write failed";
  EXPECT_EQ(StateOf("h/0"), v1::WORKER_STATE_BUSY);
  FailJobWrites(false);
  Flush();
  ASSERT_EQ(a.got.size(), 1u);
  EXPECT_TRUE(a.got[0].ok());
  EXPECT_EQ(StateOf("h/0"), v1::WORKER_STATE_READY);
}

TEST_F(ExitWriteBehindTest, TheLastRanksExitWritesAndAnswersThemAll) {
  StartRunning();
  Answers a0, a1;
  c_->ReportRank(Exit(0, 0), a0.Sink());
  EXPECT_TRUE(a0.got.empty());
  c_->ReportRank(Exit(1, 1), a1.Sink());  // the last: the attempt ends, written at once
  ASSERT_EQ(a1.got.size(), 1u);
  EXPECT_TRUE(a1.got[0].ok());
  ASSERT_EQ(a0.got.size(), 1u) << "the write that ended the attempt carried rank 0's exit";
  EXPECT_EQ(Job().summary().state(), v1::JOB_SUCCEEDED);
  EXPECT_EQ(StateOf("h/0"), v1::WORKER_STATE_READY);
  EXPECT_EQ(StateOf("h/1"), v1::WORKER_STATE_READY);
}

TEST_F(ExitWriteBehindTest, AWorkerLostAfterItsRankSucceededDoesNotFailTheAttempt) {
  StartRunning();
  Answers a;
  c_->ReportRank(Exit(0, 0), a.Sink());
  v1::HeartbeatRequest h;
  h.set_worker_id("h/0");
  h.set_session_id(sessions_[0]);
  h.set_leaving(true);
  c_->Heartbeat(h);  // its agent stops before the exit is written
  auto d = Job();
  EXPECT_EQ(d.summary().state(), v1::JOB_RUNNING);
  EXPECT_EQ(d.attempts(0).state(), v1::ATTEMPT_STATE_RUNNING);
  EXPECT_EQ(d.attempts(0).ranks(0).exit_kind(), v1::EXIT_KIND_SUCCESS);
  Report(1, 1, 1, v1::RANK_EXITED, v1::EXIT_KIND_SUCCESS, "exited with code 0");
  EXPECT_EQ(Job().summary().state(), v1::JOB_SUCCEEDED);
  EXPECT_EQ(Job().summary().leaving_interruptions(), 0u);
}

// After the last flush at shutdown an exit that leaves others running is written at once: it does
// not end the attempt, and the last one does.
TEST_F(ExitWriteBehindTest, AfterShutdownAnExitIsWrittenAtOnce) {
  StartRunning();
  c_->Shutdown(/*stopping_workers=*/false);
  Answers a0, a1;
  c_->ReportRank(Exit(0, 0), a0.Sink());
  ASSERT_EQ(a0.got.size(), 1u);
  EXPECT_TRUE(a0.got[0].ok()) << a0.got[0];
  EXPECT_EQ(Job().attempts(0).state(), v1::ATTEMPT_STATE_RUNNING);
  EXPECT_EQ(Job().summary().state(), v1::JOB_RUNNING);
  c_->ReportRank(Exit(1, 1), a1.Sink());
  ASSERT_EQ(a1.got.size(), 1u);
  EXPECT_EQ(Job().summary().state(), v1::JOB_SUCCEEDED);
}

// At shutdown, exits the store would not take are answered Unavailable (the agents send them
// again to the next controller), so no call waits forever.
TEST_F(ExitWriteBehindTest, ShutdownAnswersTheExitsItCouldNotWrite) {
  StartRunning();
  Answers a;
  FailJobWrites(true);
  c_->ReportRank(Exit(0, 0), a.Sink());
  c_->Shutdown(/*stopping_workers=*/false);
  ASSERT_EQ(a.got.size(), 1u);
  EXPECT_EQ(a.got[0].code(), absl::StatusCode::kUnavailable);
  FailJobWrites(false);
  // The agent server still takes calls until it stops, and no flush comes any more: the exit
  // sent again now is written at once and answered; so is a new one (the last rank's here).
  Answers again, other;
  c_->ReportRank(Exit(0, 0), again.Sink());
  ASSERT_EQ(again.got.size(), 1u);
  EXPECT_TRUE(again.got[0].ok()) << again.got[0];
  c_->ReportRank(Exit(1, 1), other.Sink());
  ASSERT_EQ(other.got.size(), 1u);
  EXPECT_TRUE(other.got[0].ok()) << other.got[0];
  Restart();  // in the store
  EXPECT_EQ(Job().attempts(0).ranks(0).exit_kind(), v1::EXIT_KIND_SUCCESS);
  EXPECT_EQ(Job().attempts(0).ranks(1).exit_kind(), v1::EXIT_KIND_SUCCESS);
}

// A second leaving agent while the first one's interruption is pending (the store could not take
// it): the first, the root cause, ends the attempt, whether the store is back for the second or
// only at the next tick, and the second spends none of the free leavings.
class LeavingWhilePendingTest : public ControllerTest {
 protected:
  void Run(bool store_back_first) {
    StartRunning();
    Register(2);
    clock_.Advance(5);  // (a settle deadline of 0 means none: the fake clock starts at 0)
    FailJobWrites(true);
    v1::HeartbeatRequest h0;
    h0.set_worker_id("h/0");
    h0.set_session_id(sessions_[0]);
    h0.set_leaving(true);
    c_->Heartbeat(h0);  // pending: h/0's interruption
    EXPECT_EQ(Job().summary().state(), v1::JOB_RUNNING);
    if (store_back_first) FailJobWrites(false);
    v1::HeartbeatRequest h1;
    h1.set_worker_id("h/1");
    h1.set_session_id(sessions_[1]);
    h1.set_leaving(true);
    c_->Heartbeat(h1);
    if (!store_back_first) FailJobWrites(false);
    c_->Tick();
    const auto d = Job();
    ASSERT_GE(d.attempts_size(), 1);
    EXPECT_EQ(d.attempts(0).state(), v1::ATTEMPT_STATE_INTERRUPTED);
    EXPECT_NE(d.attempts(0).cause().find("worker h/0 left"), std::string::npos)
        << d.attempts(0).cause();
    EXPECT_EQ(d.summary().restarts(), 0u);
    EXPECT_EQ(d.summary().leaving_interruptions(), 1u);
  }
};

TEST_F(LeavingWhilePendingTest, TheStoreBackAtTheNextTick) { Run(false); }
TEST_F(LeavingWhilePendingTest, TheStoreBackForTheSecondLeaving) { Run(true); }

TEST_F(ControllerTest, AnAgentThatSaysItIsLeavingInterruptsTheAttemptAndGetsNoMoreWork) {
  StartRunning();
  Register(2);
  Beat(1, /*leaving=*/true);
  auto d = Job();
  EXPECT_EQ(d.summary().state(), v1::JOB_RECOVERING);
  EXPECT_EQ(d.summary().restarts(), 0u);
  EXPECT_EQ(d.attempts(0).state(), v1::ATTEMPT_STATE_INTERRUPTED);
  EXPECT_NE(d.attempts(0).cause().find("worker h/1 left (its agent is shutting down)"),
            std::string::npos)
      << d.attempts(0).cause();
  Report(1, 1, 1, v1::RANK_EXITED, v1::EXIT_KIND_STOPPED, "stopped: the agent is shutting down");
  Report(0, 1, 0, v1::RANK_EXITED, v1::EXIT_KIND_STOPPED, "stopped");
  clock_.Advance(1.1);
  Beat(0);
  Beat(2);
  c_->Tick();
  d = Job();
  ASSERT_EQ(d.summary().attempt(), 2u);
  for (const auto& r : d.attempts(1).ranks()) EXPECT_NE(r.worker_id(), "h/1");
  bool lost = false;
  for (auto& w : c_->ListWorkers())
    lost |= w.worker_id() == "h/1" && w.state() == v1::WORKER_STATE_LOST;
  EXPECT_TRUE(lost);
}

// A train job's attempt interrupted by a leaving agent: every rank is stopped keeping the
// progress (checkpoint.stop_grace_s, so it writes the step it reached), and the next attempt starts
// only once those ranks are out, the leaving worker's included (it reports its rank's end, or its
// time runs out): two attempts never write the checkpoint directory at once.
TEST_F(ControllerTest, AnInterruptedTrainJobRestartsOnceItsRanksHaveWrittenTheirCheckpoint) {
  for (const bool leaver_reports : {true, false}) {
    SCOPED_TRACE(leaver_reports ? "the leaving agent reports" : "the leaving agent goes quiet");
    if (!leaver_reports) {
      TearDown();
      SetUp();
    }
    StartRunning(
        "name: t\nkind: train\nparallel: {dp: 2}\nrecovery:\n  max_restarts: 2\n"
        "  backoff: {initial_s: 1.0, max_s: 4.0, multiplier: 2.0}\n");
    Register(2);
    Beat(1, /*leaving=*/true);
    ASSERT_EQ(Job().summary().state(), v1::JOB_RECOVERING);
    const std::vector<v1::AgentCommand> stop = Commands(0);
    ASSERT_EQ(stop.size(), 1u);
    ASSERT_TRUE(stop[0].has_stop());
    EXPECT_EQ(stop[0].stop().checkpoint_grace_s(), 30);  // the default checkpoint.stop_grace_s
    {  // and so does a heartbeat's view of it (it may come before the command)
      const v1::HeartbeatResponse view = Beat(0);
      ASSERT_EQ(view.ranks_size(), 1);
      EXPECT_FALSE(view.ranks(0).wanted());
      EXPECT_EQ(view.ranks(0).checkpoint_grace_s(), 30);
    }

    const auto tick = [&](double seconds) {
      clock_.Advance(seconds);
      Beat(0);
      Beat(2);
      c_->Tick();
    };
    tick(1.1);  // past the backoff: both ranks still write
    EXPECT_EQ(Job().summary().state(), v1::JOB_RECOVERING);
    EXPECT_EQ(Job().summary().waiting(),
              "waits for 2 ranks of its last attempt to stop (each may be writing the checkpoint "
              "of the step it stopped at)");
    Report(0, 1, 0, v1::RANK_EXITED, v1::EXIT_KIND_STOPPED, "stopped: attempt 1 interrupted");
    tick(0.5);
    EXPECT_EQ(Job().summary().state(), v1::JOB_RECOVERING);
    EXPECT_EQ(Job().summary().waiting(),
              "waits for 1 rank of its last attempt to stop (each may be writing the checkpoint "
              "of the step it stopped at)");
    if (leaver_reports) {
      Report(1, 1, 1, v1::RANK_EXITED, v1::EXIT_KIND_STOPPED, "stopped: the agent is stopping");
      tick(0.5);
    } else {
      tick(30 + 15);  // checkpoint.stop_grace_s, then the margin for its agent's own grace
    }
    EXPECT_EQ(Job().summary().state(), v1::JOB_STARTING);
    EXPECT_EQ(Job().summary().attempt(), 2u);
  }
}

}  // namespace
}  // namespace furnace::controller
