#include "worker/agent.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "fake_agent_service.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/log_capture.h"
#include "tests/testing/test_dir.h"
#include "transport/dev_certs.h"
#include "worker/controller_channel.h"
#include "worker/telemetry_pipe.h"

namespace furnace::worker {
namespace {

using ::testing::HasSubstr;

class AgentTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("agent_test-" + std::to_string(getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
  }
  void TearDown() override {
    StopAgent();
    std::filesystem::remove_all(dir_);
  }

  // The rank is `sh -c script sh TASK_FILE`.
  void StartAgent(const std::string& address, const std::string& script) {
    StartAgentWith(address, {"/bin/sh", "-c", script, "sh"});
  }
  // The rank is `rank_command... TASK_FILE`.
  void StartAgentWith(const std::string& address, std::vector<std::string> rank_command,
                      const Clock& clock = RealClock()) {
    AgentOptions options;
    options.controller = address;
    options.slot = 4;
    options.worker_id = "test/4";
    options.work_dir = dir_.string();
    options.rank_command = std::move(rank_command);
    options.flush_interval_s = 0.05;
    options.shutdown_grace_s = 1;
    agent_ = std::make_unique<Agent>(
        options, furnace::v1::AgentService::NewStub(MakeControllerChannel(address)), clock);
    runner_ = std::thread([this] { run_status_ = agent_->Run(); });
  }
  void StopAgent() {
    if (!agent_) return;
    agent_->Shutdown();
    runner_.join();
    EXPECT_TRUE(run_status_.ok()) << run_status_;
    agent_.reset();
  }

  static furnace::v1::AgentCommand Start(uint32_t rank) {
    furnace::v1::AgentCommand command;
    furnace::v1::RankTask* task = command.mutable_start();
    task->set_job_id("job-1");
    task->set_attempt(1);
    task->set_rank(rank);
    task->set_world_size(2);
    task->mutable_spec()->set_kind("commcheck");
    return command;
  }
  static furnace::v1::AgentCommand Stop(uint32_t rank, double grace_s) {
    furnace::v1::AgentCommand command;
    furnace::v1::StopRank* stop = command.mutable_stop();
    stop->set_job_id("job-1");
    stop->set_attempt(1);
    stop->set_rank(rank);
    stop->set_grace_s(grace_s);
    stop->set_reason("job cancelled");
    return command;
  }

  std::filesystem::path dir_;
  std::unique_ptr<Agent> agent_;
  std::thread runner_;
  absl::Status run_status_;
};

TEST_F(AgentTest, RegistersRunsARankAndReportsIt) {
  testing::FakeController controller;
  StartAgent(controller.address(), "echo task=$1; exit 0");
  auto& fake = controller.service;
  ASSERT_TRUE(fake.AwaitLocked([&] { return fake.watchers > 0; }));
  {
    std::lock_guard<std::mutex> lock(fake.mu);
    const furnace::v1::RegisterRequest& registration = fake.registrations.at(0);
    EXPECT_EQ(registration.worker_id(), "test/4");
    EXPECT_EQ(registration.slot(), 4u);
    EXPECT_EQ(registration.host(), "127.0.0.1");
    EXPECT_EQ(registration.device_kind(), "cpu");
    EXPECT_EQ(registration.pid(), getpid());
  }
  fake.Push(Start(0));
  ASSERT_TRUE(fake.AwaitLocked([&] { return fake.reports.size() >= 2; }));
  const std::string task_path = (dir_ / "tasks/job-1-a1-r0.pb").string();
  ASSERT_TRUE(fake.AwaitLocked([&] {
    for (const auto& line : fake.logs) {
      if (line.text() == "task=" + task_path) return true;
    }
    return false;
  }));
  {
    std::lock_guard<std::mutex> lock(fake.mu);
    EXPECT_EQ(fake.reports[0].event(), furnace::v1::RANK_STARTED);
    EXPECT_EQ(fake.reports[0].worker_id(), "test/4");
    EXPECT_GT(fake.reports[0].pid(), 0);
    EXPECT_EQ(fake.reports[1].event(), furnace::v1::RANK_EXITED);
    EXPECT_EQ(fake.reports[1].exit_kind(), furnace::v1::EXIT_KIND_SUCCESS);
    EXPECT_EQ(fake.reports[1].pid(), fake.reports[0].pid());
  }
  furnace::v1::RankTask task;
  std::ifstream in(task_path, std::ios::binary);
  ASSERT_TRUE(task.ParseFromIstream(&in));
  EXPECT_EQ(task.job_id(), "job-1");
  EXPECT_EQ(task.controller_address(), controller.address());  // filled in by the agent
  EXPECT_TRUE(std::filesystem::exists(dir_ / "logs/job-1/attempt-1/rank-0.log"));
}

// The controller tells the agent how often to push its telemetry and logs (RegisterResponse
// telemetry_flush_s, the controller's --telemetry-flush): the agent's own 0.05 s gives way to it.
// The agent waits the interval between pushes, so a loaded machine can only widen the gaps.
TEST_F(AgentTest, PushesAtTheFlushIntervalTheControllerTells) {
  testing::FakeController controller;
  auto& fake = controller.service;
  fake.telemetry_flush_s = 0.5;
  StartAgent(controller.address(), "while true; do echo line; sleep 0.01; done");
  fake.Push(Start(0));
  // A flush drains the queue, so lines written during its first push make a second one, sent as
  // soon as the first is answered; the next flush comes only after the agent has waited the
  // interval (0.5 s) since the flush before ended. So a push starts a flush when the push before
  // it was answered more than half the interval earlier.
  const auto flushes = [&fake] {
    std::vector<std::chrono::steady_clock::time_point> starts;
    for (size_t i = 0; i < fake.log_pushes.size(); ++i) {
      if (i == 0 || fake.log_pushes[i].came - fake.log_pushes[i - 1].answered >
                        std::chrono::milliseconds(250)) {
        starts.push_back(fake.log_pushes[i].came);
      }
    }
    return starts;
  };
  ASSERT_TRUE(fake.AwaitLocked([&] { return flushes().size() >= 5; }));
  std::lock_guard<std::mutex> lock(fake.mu);
  const std::vector<std::chrono::steady_clock::time_point> starts = flushes();
  // The first wait may have begun before the registration's answer came.
  for (size_t i = 2; i < starts.size(); ++i) {
    EXPECT_GE(starts[i] - starts[i - 1], std::chrono::milliseconds(450)) << "flush " << i;
  }
}

TEST_F(AgentTest, StartIsIdempotentAndStopEndsTheRank) {
  testing::FakeController controller;
  StartAgent(controller.address(), "echo ready; exec sleep 30");
  auto& fake = controller.service;
  ASSERT_TRUE(fake.AwaitLocked([&] { return fake.watchers > 0; }));
  fake.Push(Start(1));
  fake.Push(Start(1));
  ASSERT_TRUE(fake.AwaitLocked([&] { return fake.reports.size() >= 2; }));
  ASSERT_TRUE(fake.AwaitLocked(
      [&] { return !fake.heartbeats.empty() && fake.heartbeats.back().running_size() == 1; }));
  {
    std::lock_guard<std::mutex> lock(fake.mu);
    EXPECT_EQ(fake.reports[1].event(), furnace::v1::RANK_STARTED);
    EXPECT_EQ(fake.reports[1].pid(), fake.reports[0].pid());  // the same process
    EXPECT_EQ(fake.heartbeats.back().running(0).pid(), fake.reports[0].pid());
  }
  fake.Push(Stop(1, 0.2));
  fake.Push(Stop(7, 0.2));  // never started here
  ASSERT_TRUE(fake.AwaitLocked([&] { return fake.reports.size() >= 4; }));
  std::lock_guard<std::mutex> lock(fake.mu);
  // Rank 7's answer is immediate, rank 1's comes when it has exited: either order.
  for (int i : {2, 3}) {
    const furnace::v1::RankReport& report = fake.reports[i];
    EXPECT_EQ(report.event(), furnace::v1::RANK_EXITED);
    EXPECT_EQ(report.exit_kind(), furnace::v1::EXIT_KIND_STOPPED);
    EXPECT_THAT(report.reason(), HasSubstr("job cancelled"));
    if (report.rank() == 7) {
      EXPECT_THAT(report.reason(), HasSubstr("not running"));
    } else {
      EXPECT_EQ(report.rank(), 1u);
      EXPECT_EQ(report.pid(), fake.reports[0].pid());
    }
  }
  EXPECT_NE(fake.reports[2].rank(), fake.reports[3].rank());
}

TEST_F(AgentTest, LaunchFailureIsReported) {
  testing::FakeController controller;
  StartAgent(controller.address(), "unused");
  agent_->Shutdown();
  runner_.join();
  agent_.reset();
  AgentOptions bad;
  bad.controller = controller.address();
  bad.worker_id = "test/4";
  bad.work_dir = dir_.string();
  bad.rank_command = {"/nonexistent/furnace-worker", "rank", "--task"};
  agent_ = std::make_unique<Agent>(
      bad, furnace::v1::AgentService::NewStub(MakeControllerChannel(controller.address())));
  runner_ = std::thread([this] { run_status_ = agent_->Run(); });
  auto& fake = controller.service;
  ASSERT_TRUE(fake.AwaitLocked([&] { return fake.watchers > 0; }));
  fake.Push(Start(0));
  ASSERT_TRUE(fake.AwaitLocked([&] { return !fake.reports.empty(); }));
  std::lock_guard<std::mutex> lock(fake.mu);
  EXPECT_EQ(fake.reports[0].event(), furnace::v1::RANK_EXITED);
  EXPECT_EQ(fake.reports[0].exit_kind(), furnace::v1::EXIT_KIND_LAUNCH);
  EXPECT_THAT(fake.reports[0].reason(), HasSubstr("/nonexistent/furnace-worker"));
}

TEST_F(AgentTest, ReportsAreRetriedUntilAcked) {
  testing::FakeController controller;
  controller.service.unavailable_reports = 3;
  StartAgent(controller.address(), "exit 5");
  auto& fake = controller.service;
  ASSERT_TRUE(fake.AwaitLocked([&] { return fake.watchers > 0; }));
  fake.Push(Start(0));
  ASSERT_TRUE(fake.AwaitLocked([&] { return fake.reports.size() >= 2; }));
  std::lock_guard<std::mutex> lock(fake.mu);
  EXPECT_EQ(fake.report_calls, 5);
  EXPECT_EQ(fake.reports[0].event(), furnace::v1::RANK_STARTED);  // order kept
  EXPECT_EQ(fake.reports[1].exit_kind(), furnace::v1::EXIT_KIND_CODE);
  EXPECT_EQ(fake.reports[1].exit_code(), 5);
}

// A log batch the controller cannot take (its log store fails, the batch is over its request
// limit) would be refused the same way forever: it is dropped, not retried, so it holds back
// neither the records behind it nor the exit report the report loop flushes before.
TEST_F(AgentTest, LogsTheControllerRefusesDoNotHoldBackTheExitReport) {
  testing::FakeController controller;
  controller.service.refuse_logs = grpc::StatusCode::INTERNAL;
  StartAgent(controller.address(), "echo last words; exit 0");
  auto& fake = controller.service;
  ASSERT_TRUE(fake.AwaitLocked([&] { return fake.watchers > 0; }));
  fake.Push(Start(0));
  ASSERT_TRUE(fake.AwaitLocked([&] { return fake.reports.size() >= 2; }));
  std::lock_guard<std::mutex> lock(fake.mu);
  EXPECT_EQ(fake.reports[1].event(), furnace::v1::RANK_EXITED);
  EXPECT_EQ(fake.reports[1].exit_kind(), furnace::v1::EXIT_KIND_SUCCESS);
  EXPECT_GE(fake.refused_log_pushes, 1);
  EXPECT_TRUE(fake.logs.empty());
}

TEST_F(AgentTest, RanksSurviveAControllerRestartAndAreReattached) {
  auto first = std::make_unique<testing::FakeController>();
  const int port = first->port();
  StartAgent(first->address(), "echo ready; exec sleep 30");
  ASSERT_TRUE(first->service.AwaitLocked([&] { return first->service.watchers > 0; }));
  first->service.Push(Start(0));
  ASSERT_TRUE(first->service.AwaitLocked([&] { return !first->service.reports.empty(); }));
  const int pid = first->service.reports[0].pid();
  first.reset();  // the controller goes away

  testing::FakeController second(port);
  auto& fake = second.service;
  // The agent registers again, listing the rank that kept running.
  ASSERT_TRUE(fake.AwaitLocked([&] {
    return !fake.registrations.empty() && fake.registrations[0].running_size() == 1 &&
           fake.watchers > 0;
  }));
  EXPECT_EQ(fake.registrations[0].running(0).pid(), pid);
  EXPECT_EQ(kill(pid, 0), 0);
  fake.Push(Stop(0, 0.2));
  ASSERT_TRUE(fake.AwaitLocked([&] {
    for (const auto& report : fake.reports) {
      if (report.event() == furnace::v1::RANK_EXITED) return true;
    }
    return false;
  }));
}

// The controller acknowledges a step record before it stores the step (it merges every rank's
// first). The agent holds it until an answer says the step is stored, and pushes it again to the
// controller it registers with next: a controller killed while merging loses none of the step.
TEST_F(AgentTest, StepRecordsAreHeldUntilStoredAndSentAgainToARestartedController) {
  auto first = std::make_unique<testing::FakeController>();
  const int port = first->port();
  furnace::v1::TelemetryRecord step;
  step.set_step(3);
  step.set_seq(1);
  step.mutable_train()->set_loss(2.5);
  std::string emit;
  for (unsigned char c : FrameRecord(step)) emit += absl::StrFormat("\\%03o", c);
  StartAgent(first->address(), "printf '" + emit + "' >&3; exec sleep 30");
  ASSERT_TRUE(first->service.AwaitLocked([&] { return first->service.watchers > 0; }));
  first->service.Push(Start(0));
  ASSERT_TRUE(first->service.AwaitLocked([&] { return !first->service.telemetry.empty(); }));
  // Nothing stored yet (the answers settle nothing): the agent asks after the job's steps.
  ASSERT_TRUE(first->service.AwaitLocked([&] {
    const auto& batches = first->service.telemetry_batches;
    return batches.size() >= 2 && batches.back().records().empty() &&
           batches.back().unsettled_jobs_size() == 1 && batches.back().unsettled_jobs(0) == "job-1";
  }));
  first.reset();  // the controller dies with the step it was merging

  testing::FakeController second(port);
  auto& fake = second.service;
  ASSERT_TRUE(fake.AwaitLocked([&] { return !fake.telemetry.empty(); }));
  size_t before_settled = 0;
  {
    std::lock_guard<std::mutex> lock(fake.mu);
    const furnace::v1::TelemetryBatch& again = fake.telemetry_batches[0];
    ASSERT_EQ(again.records_size(), 1);
    EXPECT_EQ(again.records(0).job_id(), "job-1");
    EXPECT_EQ(again.records(0).step(), 3u);
    EXPECT_EQ(again.records(0).seq(), 1u);
    // Stored now: the answers say so, and the agent lets go of it.
    furnace::v1::SettledSteps& settled = fake.settled.emplace_back();
    settled.set_job_id("job-1");
    settled.set_attempt(1);
    settled.set_step(3);
    before_settled = fake.telemetry_batches.size();
  }
  // The next question (at most a second later) is answered so; then it holds nothing more, and
  // asks no more (it asks every second while it holds records).
  ASSERT_TRUE(fake.AwaitLocked([&] { return fake.telemetry_batches.size() > before_settled; }));
  const size_t asked = [&] {
    std::lock_guard<std::mutex> lock(fake.mu);
    return fake.telemetry_batches.size();
  }();
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  std::lock_guard<std::mutex> lock(fake.mu);
  EXPECT_EQ(fake.telemetry_batches.size(), asked);
}

furnace::v1::ControllerRankView View(uint32_t rank, bool wanted, bool started = true) {
  furnace::v1::ControllerRankView view;
  view.set_job_id("job-1");
  view.set_attempt(1);
  view.set_rank(rank);
  view.set_wanted(wanted);
  view.set_started(started);
  return view;
}

// Reports for `rank` that say it ended.
int ExitReports(const testing::FakeAgentService& fake, uint32_t rank) {
  return static_cast<int>(std::count_if(
      fake.reports.begin(), fake.reports.end(),
      [&](const auto& r) { return r.rank() == rank && r.event() == furnace::v1::RANK_EXITED; }));
}

// Rank 1 started by `start` under heartbeats whose controller view wants it, still running
// `beats` heartbeats later.
::testing::AssertionResult RunWantedRank(testing::FakeAgentService& fake,
                                         const furnace::v1::AgentCommand& start, size_t beats) {
  if (!fake.AwaitLocked([&] { return fake.watchers > 0; })) {
    return ::testing::AssertionFailure() << "the agent never opened its command stream";
  }
  {
    std::lock_guard<std::mutex> lock(fake.mu);
    fake.reconcile = true;
    fake.rank_view = {View(1, /*wanted=*/true)};
  }
  fake.Push(start);
  if (!fake.AwaitLocked([&] { return !fake.reports.empty(); })) {
    return ::testing::AssertionFailure() << "rank 1 never reported its start";
  }
  size_t seen = 0;
  {
    std::lock_guard<std::mutex> lock(fake.mu);
    seen = fake.heartbeats.size();
  }
  if (!fake.AwaitLocked([&] {
        return fake.heartbeats.size() >= seen + beats && fake.heartbeats.back().running_size() == 1;
      })) {
    return ::testing::AssertionFailure() << "rank 1 not running " << beats << " heartbeats later";
  }
  return ::testing::AssertionSuccess();
}

TEST_F(AgentTest, HeartbeatStopsARankTheControllerNoLongerWants) {
  testing::FakeController controller;
  StartAgent(controller.address(), "echo ready; exec sleep 30");
  auto& fake = controller.service;
  // Wanted: several heartbeats listing it leave it running.
  ASSERT_TRUE(RunWantedRank(fake, Start(1), 3));
  {
    std::lock_guard<std::mutex> lock(fake.mu);
    EXPECT_EQ(ExitReports(fake, 1), 0);
    // The StopRank command of the failed attempt was lost: only the heartbeat says so. Once the
    // exit is reported the view no longer lists the rank (else the next heartbeat, racing the
    // check below, brings the report again).
    fake.rank_view = {View(1, /*wanted=*/false)};
    fake.view_forgets_reported_exits = true;
  }
  ASSERT_TRUE(fake.AwaitLocked([&] { return ExitReports(fake, 1) == 1; }));
  std::lock_guard<std::mutex> lock(fake.mu);
  const furnace::v1::RankReport& exit = fake.reports.back();
  EXPECT_EQ(exit.exit_kind(), furnace::v1::EXIT_KIND_STOPPED);
  EXPECT_THAT(exit.reason(), HasSubstr("its attempt is over (the controller's view at heartbeat)"));
}

// A cancel or an interruption keeps the progress: the heartbeat that says the rank is no longer
// wanted carries the checkpoint grace too, so when it comes before the StopRank command (or the
// command was lost) the rank still gets SIGUSR1 and its grace, not SIGTERM after a second.
TEST_F(AgentTest, AHeartbeatStoppingARankKeepingItsProgressSendsUsr1First) {
  testing::FakeController controller;
  StartAgent(controller.address(),
             "trap 'echo usr1; exit 82' USR1; trap 'echo term; exit 7' TERM; echo ready; "
             "while :; do sleep 0.05; done");
  auto& fake = controller.service;
  ASSERT_TRUE(RunWantedRank(fake, Start(1), 2));
  {
    std::lock_guard<std::mutex> lock(fake.mu);
    furnace::v1::ControllerRankView cancelled = View(1, /*wanted=*/false);
    cancelled.set_checkpoint_grace_s(600);  // only the rank's own exit ends the wait
    fake.rank_view = {cancelled};
    fake.view_forgets_reported_exits = true;  // as a controller that recorded the exit
  }
  ASSERT_TRUE(fake.AwaitLocked([&] { return ExitReports(fake, 1) == 1; }));
  std::lock_guard<std::mutex> lock(fake.mu);
  const furnace::v1::RankReport& exit = fake.reports.back();
  EXPECT_EQ(exit.exit_kind(), furnace::v1::EXIT_KIND_STOPPED);
  EXPECT_EQ(exit.exit_code(), 82) << exit.reason();
}

TEST_F(AgentTest, HeartbeatStopsARankTheControllerHasNoRecordOf) {
  testing::FakeController controller;
  StartAgent(controller.address(), "echo ready; exec sleep 30");
  auto& fake = controller.service;
  ASSERT_TRUE(fake.AwaitLocked([&] { return fake.watchers > 0; }));
  fake.Push(Start(2));
  ASSERT_TRUE(fake.AwaitLocked([&] { return !fake.reports.empty(); }));
  {
    std::lock_guard<std::mutex> lock(fake.mu);
    fake.reconcile = true;  // and lists nothing
  }
  ASSERT_TRUE(fake.AwaitLocked([&] { return ExitReports(fake, 2) == 1; }));
  std::lock_guard<std::mutex> lock(fake.mu);
  EXPECT_EQ(fake.reports.back().exit_kind(), furnace::v1::EXIT_KIND_STOPPED);
  EXPECT_THAT(fake.reports.back().reason(), HasSubstr("the controller has no record of it"));
}

TEST_F(AgentTest, HeartbeatReportsARankTheControllerBelievesAliveButThisWorkerNeverRan) {
  testing::FakeController controller;
  StartAgent(controller.address(), "exit 0");
  auto& fake = controller.service;
  ASSERT_TRUE(fake.AwaitLocked([&] { return fake.watchers > 0; }));
  {
    std::lock_guard<std::mutex> lock(fake.mu);
    fake.reconcile = true;
    // Rank 5 started here as far as the controller knows; rank 6's start may still be on its way.
    fake.rank_view = {View(5, true), View(6, true, /*started=*/false)};
  }
  ASSERT_TRUE(fake.AwaitLocked([&] { return ExitReports(fake, 5) == 1; }));
  const size_t seen = fake.heartbeats.size();
  ASSERT_TRUE(fake.AwaitLocked([&] { return fake.heartbeats.size() >= seen + 5; }));
  std::lock_guard<std::mutex> lock(fake.mu);
  EXPECT_EQ(ExitReports(fake, 5), 1);  // answered once, however often it is listed
  EXPECT_EQ(ExitReports(fake, 6), 0);
  const furnace::v1::RankReport& lost = fake.reports[0];
  EXPECT_EQ(lost.exit_kind(), furnace::v1::EXIT_KIND_LOST);
  EXPECT_EQ(lost.worker_id(), "test/4");
  EXPECT_GT(lost.failed_unix(), 0);
  EXPECT_THAT(lost.reason(), HasSubstr("does not run this rank"));
}

TEST_F(AgentTest, HeartbeatSendsAgainAnExitReportTheControllerLost) {
  testing::FakeController controller;
  StartAgent(controller.address(), "exit 5");
  auto& fake = controller.service;
  ASSERT_TRUE(fake.AwaitLocked([&] { return fake.watchers > 0; }));
  fake.Push(Start(0));
  ASSERT_TRUE(fake.AwaitLocked([&] { return ExitReports(fake, 0) == 1; }));
  {
    std::lock_guard<std::mutex> lock(fake.mu);
    fake.reconcile = true;
    fake.rank_view = {View(0, true)};  // acked, but the controller still has it running
  }
  ASSERT_TRUE(fake.AwaitLocked([&] { return ExitReports(fake, 0) == 2; }));
  std::lock_guard<std::mutex> lock(fake.mu);
  EXPECT_EQ(fake.reports.back().exit_kind(), furnace::v1::EXIT_KIND_CODE);
  EXPECT_EQ(fake.reports.back().exit_code(), 5);
  EXPECT_EQ(fake.reports.back().pid(), fake.reports[0].pid());
}

// A rank that ended, whose exit the controller acknowledged and no longer lists, is forgotten: its
// entry and task file go (an agent running for months must not grow with every attempt); a
// repeated start or a late stop of it is still answered as before, and a controller that lists it
// again (it lost the report, restarting before writing it) gets its exit report again.
TEST_F(AgentTest, AnEndedRankTheControllerNoLongerListsIsForgotten) {
  testing::FakeController controller;
  StartAgent(controller.address(), "exit 0");
  auto& fake = controller.service;
  ASSERT_TRUE(fake.AwaitLocked([&] { return fake.watchers > 0; }));
  fake.Push(Start(0));
  ASSERT_TRUE(fake.AwaitLocked([&] { return ExitReports(fake, 0) == 1; }));
  const std::filesystem::path tasks = dir_ / "tasks";
  const auto task_files = [&] {
    size_t n = 0;
    for (const auto& entry : std::filesystem::directory_iterator(tasks))
      n += entry.is_regular_file();
    return n;
  };
  EXPECT_EQ(task_files(), 1u);
  EXPECT_EQ(agent_->KnownRanks(), 1u);  // no reconciling heartbeat yet: remembered
  {
    std::lock_guard<std::mutex> lock(fake.mu);
    fake.reconcile = true;  // the controller's view: nothing runs here
  }
  for (int i = 0; i < 200 && agent_->KnownRanks() > 0; ++i) {  // heartbeats every 0.1 s
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(agent_->KnownRanks(), 0u);
  EXPECT_EQ(task_files(), 0u);
  size_t seen = 0;
  ASSERT_TRUE(fake.AwaitLocked([&] { return (seen = fake.heartbeats.size()) > 0; }));
  fake.Push(Start(0));      // a start of the same rank again: still recognised
  fake.Push(Stop(0, 0.2));  // a late stop: its exit was reported, nothing more to say
  ASSERT_TRUE(fake.AwaitLocked([&] { return fake.heartbeats.size() >= seen + 5; }));
  {
    std::lock_guard<std::mutex> lock(fake.mu);
    EXPECT_EQ(fake.reports.size(), 2u);            // its started and exited reports only
    fake.rank_view = {View(0, /*wanted=*/false)};  // a restarted controller believes it runs
  }
  ASSERT_TRUE(fake.AwaitLocked([&] { return ExitReports(fake, 0) == 2; }));
  std::lock_guard<std::mutex> lock(fake.mu);
  EXPECT_EQ(fake.reports.back().exit_kind(), furnace::v1::EXIT_KIND_SUCCESS);  // not LOST
  EXPECT_EQ(fake.reports.back().pid(), fake.reports[0].pid());
  EXPECT_EQ(agent_->KnownRanks(), 0u);
}

TEST_F(AgentTest, ShutdownStopsRanksAndFlushesTheirReports) {
  testing::FakeController controller;
  StartAgent(controller.address(),
             "trap 'echo bye; exit 0' TERM; echo ready; while :; do sleep 0.05; done");
  auto& fake = controller.service;
  ASSERT_TRUE(fake.AwaitLocked([&] { return fake.watchers > 0; }));
  fake.Push(Start(0));
  ASSERT_TRUE(fake.AwaitLocked([&] { return !fake.reports.empty(); }));
  ASSERT_TRUE(fake.AwaitLocked([&] {
    for (const auto& line : fake.logs) {
      if (line.text() == "ready") return true;
    }
    return false;
  }));
  StopAgent();
  std::lock_guard<std::mutex> lock(fake.mu);
  ASSERT_EQ(fake.reports.size(), 2u);
  EXPECT_EQ(fake.reports[1].exit_kind(), furnace::v1::EXIT_KIND_STOPPED);
  EXPECT_EQ(fake.reports[1].exit_code(), 0);
  // It said it was leaving, once, before stopping the rank.
  ASSERT_FALSE(fake.heartbeats.empty());
  const furnace::v1::HeartbeatRequest& last = fake.heartbeats.back();
  EXPECT_TRUE(last.leaving());
  EXPECT_EQ(std::count_if(fake.heartbeats.begin(), fake.heartbeats.end(),
                          [](const furnace::v1::HeartbeatRequest& h) { return h.leaving(); }),
            1);
}

// A rank SIGKILL does not end (stuck in the kernel; here a zombie its own child holds by ptrace,
// tests/worker/held_rank.cc) is reported 30 s after the SIGKILL, so the controller recovers the
// job without it. Its slot stays taken: another rank's start here is refused (a launch failure
// the controller places elsewhere) while it holds the device, and an agent that exits meanwhile
// does not wait on it. The kernel lets it go later, and it is reaped then.
TEST_F(AgentTest, ARankSigkillDoesNotEndHoldsItsSlotButNotTheAgent) {
  testing::FakeController controller;
  FakeClock clock;
  const std::string release = (dir_ / "release").string();
  StartAgentWith(controller.address(), {FURNACE_HELD_RANK_BIN, release}, clock);
  auto& fake = controller.service;
  ASSERT_TRUE(fake.AwaitLocked([&] { return fake.watchers > 0; }));
  fake.Push(Start(0));
  std::string said;
  ASSERT_TRUE(fake.AwaitLocked([&] {
    for (const auto& line : fake.logs) {
      if (line.text() == "held" || line.text().rfind("untraceable", 0) == 0) said = line.text();
    }
    return !said.empty();
  }));
  if (said != "held") GTEST_SKIP() << "ptrace refused here: " << said;
  int pid;
  {
    std::lock_guard<std::mutex> lock(fake.mu);
    pid = fake.reports.at(0).pid();
  }
  fake.Push(Stop(0, 0));  // SIGTERM (ignored), then SIGKILL at once
  // The fake clock moves a second every 10 ms until the report: 30 s after the SIGKILL.
  for (int s = 0; s < 120; ++s) {
    {
      std::lock_guard<std::mutex> lock(fake.mu);
      if (ExitReports(fake, 0) > 0) break;
    }
    clock.Advance(1);
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_TRUE(fake.AwaitLocked([&] { return ExitReports(fake, 0) == 1; }));
  {
    std::lock_guard<std::mutex> lock(fake.mu);
    const furnace::v1::RankReport& exit = fake.reports.back();
    EXPECT_EQ(exit.exit_kind(), furnace::v1::EXIT_KIND_STOPPED);
    EXPECT_EQ(exit.pid(), pid);
    EXPECT_THAT(exit.reason(), HasSubstr("keeps its slot until the kernel lets it go"));
  }
  EXPECT_EQ(kill(pid, 0), 0);  // not reaped

  fake.Push(Start(1));  // another rank on this slot's device: refused while rank 0 holds it
  ASSERT_TRUE(fake.AwaitLocked([&] { return ExitReports(fake, 1) == 1; }));
  {
    std::lock_guard<std::mutex> lock(fake.mu);
    const furnace::v1::RankReport& refused = fake.reports.back();
    EXPECT_EQ(refused.exit_kind(), furnace::v1::EXIT_KIND_LAUNCH);
    EXPECT_THAT(refused.reason(),
                HasSubstr(absl::StrCat("(pid ", pid,
                                       ") of this worker did not end after SIGKILL and still "
                                       "holds its slot")));
  }

  StopAgent();  // returns without waiting for the stuck rank
  EXPECT_EQ(kill(pid, 0), 0);
  std::ofstream(release).put('\n');  // the kernel lets it go: the left supervisor reaps it
  for (int i = 0; i < 500 && kill(pid, 0) == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(kill(pid, 0), -1);
}

// The work directory holds the task files ranks start from: one that exists must be this user's
// and writable by no one else; a missing one is made 0700.
TEST(WorkDirTest, AnExistingWorkDirMustBeOwnAndPrivate) {
  testing_util::TestDir dir;
  EXPECT_TRUE(CheckWorkDir(dir / "missing").ok());
  EXPECT_TRUE(CheckWorkDir(dir.path()).ok());
  for (const auto mode : {std::filesystem::perms::all,
                          std::filesystem::perms::owner_all | std::filesystem::perms::group_all}) {
    std::filesystem::permissions(dir.path(), mode);
    const absl::Status open = CheckWorkDir(dir.path());
    EXPECT_TRUE(absl::IsFailedPrecondition(open)) << open;
    EXPECT_THAT(std::string(open.message()), HasSubstr("--work-dir " + dir.path() + ": mode 07"));
    EXPECT_THAT(std::string(open.message()), HasSubstr("chmod go-w"));
  }
  std::filesystem::permissions(dir.path(), std::filesystem::perms::owner_all);
  std::ofstream(dir / "file") << "x";
  EXPECT_THAT(std::string(CheckWorkDir(dir / "file").message()), HasSubstr("not a directory"));
  if (geteuid() == 0) {  // only root can give a directory to another user
    std::filesystem::create_directory(dir / "theirs");
    ASSERT_EQ(chown((dir / "theirs").c_str(), 65534, 65534), 0);
    EXPECT_THAT(std::string(CheckWorkDir(dir / "theirs").message()),
                HasSubstr("owned by uid 65534, not by this user"));
  }

  // The agent refuses to run in such a directory, and makes a missing one private.
  AgentOptions options;
  options.work_dir = dir / "made";
  Agent agent(options, nullptr);
  agent.Shutdown();  // Run returns at once after its setup
  ASSERT_TRUE(agent.Run().ok());
  EXPECT_EQ(std::filesystem::status(dir / "made").permissions(), std::filesystem::perms::owner_all);
}

// An agent killed outright leaves the task files of its ranks (which died with it); the next
// agent on the work dir removes them at start (one per rank the killed agent held piled up).
TEST(WorkDirTest, TaskFilesAPreviousAgentLeftAreRemovedAtStart) {
  testing_util::TestDir dir;
  std::filesystem::create_directories(dir / "work/tasks");
  std::filesystem::permissions(dir / "work", std::filesystem::perms::owner_all);
  for (const char* name : {"job-1-a1-r0.pb", "job-1-a2-r0.pb.tmp"}) {
    std::ofstream(dir / (std::string("work/tasks/") + name)) << "x";
  }
  std::ofstream(dir / "work/logs-note") << "kept";
  AgentOptions options;
  options.work_dir = dir / "work";
  Agent agent(options, nullptr);
  agent.Shutdown();
  ASSERT_TRUE(agent.Run().ok());
  EXPECT_TRUE(std::filesystem::is_empty(dir / "work/tasks"));
  EXPECT_TRUE(std::filesystem::exists(dir / "work/logs-note"));
}

// --keep-rank-logs: at start (then every kRankLogSweepEveryS) the agent removes the rank logs of
// jobs unchanged for longer; 0 keeps them.
TEST(WorkDirTest, RankLogsUnchangedForLongerThanKeptAreRemovedAtStart) {
  testing_util::TestDir dir;
  for (const char* job : {"old-job", "new-job"}) {
    std::filesystem::create_directories(dir / (std::string("work/logs/") + job + "/attempt-1"));
    std::ofstream(dir / (std::string("work/logs/") + job + "/attempt-1/rank-0.log")) << "x\n";
  }
  std::filesystem::permissions(dir / "work", std::filesystem::perms::owner_all);
  // old-job: every entry last changed two hours ago.
  const auto two_hours_ago = std::filesystem::file_time_type::clock::now() - std::chrono::hours(2);
  for (const char* path : {"work/logs/old-job/attempt-1/rank-0.log", "work/logs/old-job/attempt-1",
                           "work/logs/old-job"}) {
    std::filesystem::last_write_time(dir / path, two_hours_ago);
  }
  AgentOptions options;
  options.work_dir = dir / "work";
  {
    Agent keeps(options, nullptr);  // keep_rank_logs_s 0: every log stays
    keeps.Shutdown();
    ASSERT_TRUE(keeps.Run().ok());
    EXPECT_TRUE(std::filesystem::exists(dir / "work/logs/old-job"));
  }
  options.keep_rank_logs_s = 3600;
  Agent agent(options, nullptr);
  agent.Shutdown();
  ASSERT_TRUE(agent.Run().ok());
  EXPECT_FALSE(std::filesystem::exists(dir / "work/logs/old-job"));
  EXPECT_TRUE(std::filesystem::exists(dir / "work/logs/new-job/attempt-1/rank-0.log"));
}

// Agent "test/4" dialling `controller` over TLS with the dev certificates written under
// <dir>/certs (WriteDevCerts), its work directory <dir>/work.
AgentOptions TlsAgentOptions(const testing_util::TestDir& dir, const std::string& controller,
                             double rpc_timeout_s) {
  AgentOptions options;
  options.controller = controller;
  options.worker_id = "test/4";
  options.work_dir = dir / "work";
  options.rpc_timeout_s = rpc_timeout_s;
  options.channel_security.set_tls_ca(dir / "certs/ca.pem");
  options.channel_security.set_tls_cert(dir / "certs/worker.pem");
  options.channel_security.set_tls_key(dir / "certs/worker.key");
  return options;
}

// A TLS handshake that fails (an expired or wrong certificate, a CA that did not sign the
// controller's; here a worker that dials a plaintext controller with TLS) looks to the agent like
// a controller not up yet. After a few registrations in a row fail so it says it, with the
// channel's own error and what to check, at most once a minute.
TEST(AgentRegisterTest, FailedHandshakesAreSaidWithWhatToCheckOnceAMinute) {
  testing_util::TestDir dir;
  transport::DevCertsOptions certs;
  certs.dir = dir / "certs";
  ASSERT_TRUE(transport::WriteDevCerts(certs).ok());
  testing::FakeController controller;  // plaintext
  AgentOptions options = TlsAgentOptions(dir, controller.address(), 0.3);
  options.slot = 4;
  auto channel = MakeControllerChannel(options.controller, options.channel_security, "test/4");
  ASSERT_TRUE(channel.ok()) << channel.status();
  FakeClock clock;
  testing_util::LogCapture log(spdlog::level::debug);
  Agent agent(options, furnace::v1::AgentService::NewStub(*channel), clock);
  absl::Status run;
  std::thread runner([&] { run = agent.Run(); });
  const std::string warning = "cannot register with the controller at " + controller.address();
  const auto await = [&](const std::string& needle, int n) {
    for (int i = 0; i < 400 && log.Count(needle) < n; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return log.Count(needle) >= n;
  };

  EXPECT_TRUE(await(warning, 1)) << log.Text();
  // The channel's own error (the attempt that warns fails fast to get it) and what it means.
  EXPECT_THAT(log.Text(), HasSubstr("4 registrations in a row failed, the last with: 14 "));
  EXPECT_THAT(log.Text(), HasSubstr("Ssl handshake failed"));
  EXPECT_THAT(log.Text(), HasSubstr("The controller does not speak TLS"));
  // Within the minute, the failures that follow are not said again.
  const int failed = log.Count("register failed");
  EXPECT_TRUE(await("register failed", failed + 1)) << log.Text();
  EXPECT_EQ(log.Count(warning), 1) << log.Text();
  clock.Advance(61);
  EXPECT_TRUE(await(warning, 2)) << log.Text();

  agent.Shutdown();
  runner.join();
  EXPECT_TRUE(run.ok()) << run;
  std::lock_guard<std::mutex> lock(controller.service.mu);
  EXPECT_TRUE(controller.service.registrations.empty());
}

// The hint names the files and the name the controller's certificate must carry when the
// handshake fails otherwise (a CA that did not sign the controller's certificate, an expired one).
TEST(AgentRegisterTest, AControllerNobodyAnswersForIsSaidWithTheTlsFilesToCheck) {
  testing_util::TestDir dir;
  transport::DevCertsOptions certs;
  certs.dir = dir / "certs";
  ASSERT_TRUE(transport::WriteDevCerts(certs).ok());
  const int port = testing::FakeController().port();  // then nothing listens there
  AgentOptions options = TlsAgentOptions(dir, "localhost:" + std::to_string(port), 0.2);
  auto channel = MakeControllerChannel(options.controller, options.channel_security, "test/4");
  ASSERT_TRUE(channel.ok()) << channel.status();
  testing_util::LogCapture log;
  Agent agent(options, furnace::v1::AgentService::NewStub(*channel));
  absl::Status run;
  std::thread runner([&] { run = agent.Run(); });
  for (int i = 0; i < 400 && log.Count("cannot register") == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  agent.Shutdown();
  runner.join();
  const std::string text = log.Text();
  EXPECT_THAT(text, HasSubstr("[warning] cannot register with the controller at localhost:"));
  EXPECT_THAT(text, HasSubstr("--tls-ca " + (dir / "certs/ca.pem")));
  EXPECT_THAT(text, HasSubstr("--tls-cert " + (dir / "certs/worker.pem")));
  EXPECT_THAT(text, HasSubstr("that the controller's certificate names localhost,"));
  EXPECT_THAT(text, HasSubstr("openssl x509 -noout -dates"));
}

}  // namespace
}  // namespace furnace::worker
