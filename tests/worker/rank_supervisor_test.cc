#include "worker/rank_supervisor.h"

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/telemetry_pipe.h"

namespace furnace::worker {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

// What the sinks saw.
struct Seen {
  std::mutex mu;
  std::vector<std::string> lines;
  std::vector<furnace::v1::TelemetryRecord> records;
  int exits = 0;
  furnace::v1::RankReport exit;  // the exit sink's last report

  bool HasLine(const std::string& text) {
    std::lock_guard<std::mutex> lock(mu);
    return std::find(lines.begin(), lines.end(), text) != lines.end();
  }
};

// A shell printf that writes `record`, framed, to fd 3.
std::string EmitRecordCommand(const furnace::v1::TelemetryRecord& record) {
  std::string escaped;
  for (unsigned char c : FrameRecord(record)) {
    char octal[8];
    std::snprintf(octal, sizeof(octal), "\\%03o", c);
    escaped += octal;
  }
  return "printf '" + escaped + "' >&3";
}

furnace::v1::TelemetryRecord Record(uint64_t step, const std::string& message = "") {
  furnace::v1::TelemetryRecord record;
  record.set_job_id("spoofed");
  record.set_step(step);
  record.set_phase("running");
  record.set_message(message);
  return record;
}

class RankSupervisorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("rank_supervisor_test-" + std::to_string(getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string LogPath() const { return (dir_ / "logs/job-1/attempt-2/rank-1.log").string(); }

  absl::StatusOr<std::unique_ptr<RankSupervisor>> Run(const std::string& script,
                                                      double hang_timeout_s = 0,
                                                      double start_timeout_s = 0) {
    return Launch({"/bin/sh", "-c", script}, hang_timeout_s, start_timeout_s);
  }

  absl::StatusOr<std::unique_ptr<RankSupervisor>> Launch(std::vector<std::string> argv,
                                                         double hang_timeout_s = 0,
                                                         double start_timeout_s = 0,
                                                         const Clock& clock = RealClock()) {
    RankLaunch launch;
    launch.job_id = "job-1";
    launch.attempt = 2;
    launch.rank = 1;
    launch.argv = std::move(argv);
    launch.log_path = LogPath();
    launch.hang_timeout_s = hang_timeout_s;
    launch.start_timeout_s = start_timeout_s;
    RankSinks sinks;
    sinks.on_log = [this](furnace::v1::LogLine line) {
      EXPECT_EQ(line.job_id(), "job-1");
      EXPECT_EQ(line.attempt(), 2u);
      EXPECT_EQ(line.rank(), 1u);
      std::lock_guard<std::mutex> lock(seen_.mu);
      seen_.lines.push_back(line.text());
    };
    sinks.on_telemetry = [this](furnace::v1::TelemetryRecord record) {
      std::lock_guard<std::mutex> lock(seen_.mu);
      seen_.records.push_back(std::move(record));
    };
    sinks.on_exit = [this](const furnace::v1::RankReport& report) {
      std::lock_guard<std::mutex> lock(seen_.mu);
      ++seen_.exits;
      seen_.exit = report;
    };
    return RankSupervisor::Start(std::move(launch), std::move(sinks), clock);
  }

  furnace::v1::RankReport RunToEnd(const std::string& script, double hang_timeout_s = 0,
                                   double start_timeout_s = 0) {
    auto supervisor = Run(script, hang_timeout_s, start_timeout_s);
    EXPECT_TRUE(supervisor.ok()) << supervisor.status();
    if (!supervisor.ok()) return {};
    (*supervisor)->Wait();
    EXPECT_TRUE((*supervisor)->done());
    EXPECT_EQ(seen_.exits, 1);
    return *(*supervisor)->exit_report();
  }

  // Waits until the sink saw `text` (the child is then surely set up, e.g. its traps).
  void AwaitLine(const std::string& text) {
    for (int i = 0; i < 200 && !seen_.HasLine(text); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ASSERT_TRUE(seen_.HasLine(text)) << "never saw " << text;
  }

  std::filesystem::path dir_;
  Seen seen_;
};

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

TEST_F(RankSupervisorTest, ExitZeroIsSuccess) {
  const furnace::v1::RankReport report = RunToEnd("echo hello; echo oops >&2; exit 0");
  EXPECT_EQ(report.event(), furnace::v1::RANK_EXITED);
  EXPECT_EQ(report.exit_kind(), furnace::v1::EXIT_KIND_SUCCESS);
  EXPECT_EQ(report.exit_code(), 0);
  EXPECT_EQ(report.job_id(), "job-1");
  EXPECT_EQ(report.attempt(), 2u);
  EXPECT_EQ(report.rank(), 1u);
  EXPECT_GT(report.pid(), 0);
  EXPECT_EQ(report.reason(), "exited with code 0");
  EXPECT_TRUE(seen_.HasLine("hello"));
  EXPECT_TRUE(seen_.HasLine("oops"));
}

TEST_F(RankSupervisorTest, ExitThreeIsOutOfMemoryWithTheRanksLastWord) {
  const furnace::v1::RankReport report = RunToEnd(
      EmitRecordCommand(Record(4, "device arena exhausted: 3 GiB requested")) + "; exit 3");
  EXPECT_EQ(report.exit_kind(), furnace::v1::EXIT_KIND_OOM);
  EXPECT_EQ(report.exit_code(), 3);
  EXPECT_THAT(report.reason(), StartsWith("exited with code 3"));
  EXPECT_THAT(report.reason(), HasSubstr("device arena exhausted: 3 GiB requested"));
}

TEST_F(RankSupervisorTest, OtherExitCodesAreCode) {
  const furnace::v1::RankReport report = RunToEnd("exit 7");
  EXPECT_EQ(report.exit_kind(), furnace::v1::EXIT_KIND_CODE);
  EXPECT_EQ(report.exit_code(), 7);
  EXPECT_EQ(report.reason(), "exited with code 7");
}

TEST_F(RankSupervisorTest, KilledBySignal) {
  const furnace::v1::RankReport report = RunToEnd("kill -KILL $$");
  EXPECT_EQ(report.exit_kind(), furnace::v1::EXIT_KIND_SIGNAL);
  EXPECT_EQ(report.signal(), SIGKILL);
  EXPECT_THAT(report.reason(), StartsWith("killed by signal 9 (SIGKILL)"));
}

TEST_F(RankSupervisorTest, SegfaultIsSignal) {
  const furnace::v1::RankReport report = RunToEnd("ulimit -c 0; kill -SEGV $$");
  EXPECT_EQ(report.exit_kind(), furnace::v1::EXIT_KIND_SIGNAL);
  EXPECT_EQ(report.signal(), SIGSEGV);
  EXPECT_THAT(report.reason(), StartsWith("killed by signal 11 (SIGSEGV)"));
}

TEST_F(RankSupervisorTest, StoppedChildIsHungAndReaped) {
  const double start = Now();
  const furnace::v1::RankReport report =
      RunToEnd(EmitRecordCommand(Record(5)) + "; kill -STOP $$; echo never", /*hang=*/1.0);
  const double elapsed = Now() - start;
  EXPECT_EQ(report.exit_kind(), furnace::v1::EXIT_KIND_HANG);
  EXPECT_EQ(report.signal(), SIGKILL);
  EXPECT_THAT(report.reason(), StartsWith("hung: no progress for 1."));
  EXPECT_THAT(report.reason(), HasSubstr("(last step 5)"));
  EXPECT_GE(elapsed, 1.0);  // not before the hang timeout (ctest's timeout catches a hang)
  EXPECT_FALSE(seen_.HasLine("never"));
  EXPECT_EQ(kill(report.pid(), 0), -1);  // reaped: the pid is gone
}

furnace::v1::TelemetryRecord WatchdogRecord(furnace::v1::RankWatchdogRecord::Kind kind,
                                            const std::string& reason = "", double phase_s = 0,
                                            uint32_t in_flight = 0) {
  furnace::v1::TelemetryRecord record;
  record.mutable_watchdog()->set_collectives_in_flight(in_flight);
  if (in_flight > 0) {
    furnace::v1::InFlightCollective* c = record.mutable_watchdog()->mutable_collective();
    c->set_op("all_reduce");
    c->set_group("dp[0,1]");
    c->set_group_size(2);
    c->set_for_s(phase_s);
  }
  record.set_step(12);
  record.mutable_watchdog()->set_kind(kind);
  record.mutable_watchdog()->set_phase("step");
  record.mutable_watchdog()->set_step(12);
  record.mutable_watchdog()->set_phase_s(phase_s);
  record.mutable_watchdog()->set_reason(reason);
  return record;
}

TEST_F(RankSupervisorTest, TheRanksWatchdogHangReportKillsItWithThatReason) {
  const std::string reason =
      "hung in step 12: all_reduce on group dp[0,1] (2 ranks) for 8.0 s; the step had run 8.0 s";
  const double before = RealClock().UnixSeconds();
  const furnace::v1::RankReport report = RunToEnd(
      EmitRecordCommand(Record(11)) + "; " +
          EmitRecordCommand(WatchdogRecord(furnace::v1::RankWatchdogRecord::KIND_HEARTBEAT)) +
          "; " +
          EmitRecordCommand(
              WatchdogRecord(furnace::v1::RankWatchdogRecord::KIND_HUNG, reason, 8.0, 1)) +
          "; sleep 30; echo never",
      /*hang=*/20);
  EXPECT_EQ(report.exit_kind(), furnace::v1::EXIT_KIND_HANG);
  EXPECT_EQ(report.signal(), SIGKILL);
  EXPECT_EQ(report.reason(), reason);
  // It hung waiting on its peers: maybe a victim (the controller waits for a root cause).
  EXPECT_TRUE(report.hang_in_collective());
  // The failure began when the phase did: 8 s before the report arrived.
  EXPECT_LT(report.failed_unix(), report.unix_time() - 7.0);
  EXPECT_GT(report.failed_unix(), before - 9.0);
  EXPECT_TRUE(seen_.HasLine("[furnace-worker] the rank's watchdog: " + reason + "; killing it"));
  EXPECT_FALSE(seen_.HasLine("never"));
  // Watchdog records are the agent's: only the step record went on to the controller.
  std::lock_guard<std::mutex> lock(seen_.mu);
  ASSERT_EQ(seen_.records.size(), 1u);
  EXPECT_EQ(seen_.records[0].step(), 11u);
}

TEST_F(RankSupervisorTest, ARankWithAWatchdogGetsLongerBeforeItCountsAsFrozen) {
  // Heartbeats every 0.2 s for 1.5 s with no step record: alive, not hung (hang_timeout_s 1);
  // then it stops, and is called frozen after 1.5 x hang_timeout_s of silence.
  std::string script;
  for (int i = 0; i < 8; ++i) {
    script += EmitRecordCommand(WatchdogRecord(furnace::v1::RankWatchdogRecord::KIND_HEARTBEAT)) +
              "; sleep 0.2; ";
  }
  const double start = Now();
  const furnace::v1::RankReport report = RunToEnd(script + "kill -STOP $$", /*hang=*/1.0);
  const double elapsed = Now() - start;
  EXPECT_EQ(report.exit_kind(), furnace::v1::EXIT_KIND_HANG);
  EXPECT_THAT(report.reason(), StartsWith("hung: no sign of life for 1.5"));
  EXPECT_THAT(report.reason(), HasSubstr("the process is stopped (state T"));
  // The last heartbeat left at about 1.4 s: killed 1.5 s after it (not 1 s, nor at 1 s for
  // want of a step record).
  EXPECT_GE(elapsed, 2.8);
  EXPECT_GT(report.failed_unix(), 0);
  EXPECT_LT(report.failed_unix(), report.unix_time() - 1.4);
  EXPECT_TRUE(seen_.records.empty());
}

TEST_F(RankSupervisorTest, RecordsAreProgressForTheWatchdog) {
  std::string script;
  for (int step = 1; step <= 4; ++step) {
    script += EmitRecordCommand(Record(step)) + "; sleep 0.3; ";
  }
  const furnace::v1::RankReport report = RunToEnd(script + "exit 0", /*hang=*/0.8);
  EXPECT_EQ(report.exit_kind(), furnace::v1::EXIT_KIND_SUCCESS) << report.reason();
  ASSERT_EQ(seen_.records.size(), 4u);
  for (const auto& record : seen_.records) {
    EXPECT_EQ(record.job_id(), "job-1");  // the supervisor's identity, not the rank's claim
    EXPECT_EQ(record.attempt(), 2u);
    EXPECT_EQ(record.rank(), 1u);
  }
  EXPECT_EQ(seen_.records.back().step(), 4u);
}

// Before its first record a rank is starting (exec, loading its libraries: seconds on a loaded
// host, where ranks were killed as hung before they could say a word): silence ends it only
// after the start timeout then, and after its first record, after the hang timeout.
TEST_F(RankSupervisorTest, BeforeItsFirstRecordARankIsStarting) {
  const std::string record = EmitRecordCommand(Record(1));
  furnace::v1::RankReport report =
      RunToEnd("sleep 1; " + record + "; exit 0", /*hang=*/0.4, /*start=*/5);
  EXPECT_EQ(report.exit_kind(), furnace::v1::EXIT_KIND_SUCCESS) << report.reason();
  seen_.records.clear();
  seen_.exits = 0;
  report = RunToEnd("sleep 1; " + record + "; sleep 5; exit 0", /*hang=*/0.4, /*start=*/5);
  EXPECT_EQ(report.exit_kind(), furnace::v1::EXIT_KIND_HANG) << report.reason();
  EXPECT_EQ(seen_.records.size(), 1u);
}

TEST_F(RankSupervisorTest, StopWithGraceLetsATrappingChildExit) {
  auto supervisor = Run("trap 'echo bye; exit 0' TERM; echo ready; while :; do sleep 0.05; done");
  ASSERT_TRUE(supervisor.ok()) << supervisor.status();
  AwaitLine("ready");
  // A grace longer than ctest's timeout: only the child's own exit can end the wait (one that
  // waited out the grace would hang).
  (*supervisor)->Stop(600, "job cancelled");
  (*supervisor)->Wait();
  const furnace::v1::RankReport report = *(*supervisor)->exit_report();
  EXPECT_EQ(report.exit_kind(), furnace::v1::EXIT_KIND_STOPPED);
  EXPECT_EQ(report.exit_code(), 0);
  EXPECT_THAT(report.reason(), HasSubstr("job cancelled"));
  EXPECT_TRUE(seen_.HasLine("bye"));
}

TEST_F(RankSupervisorTest, StopKillsAChildIgnoringTermAfterGrace) {
  auto supervisor = Run("trap '' TERM; echo ready; while :; do sleep 0.05; done");
  ASSERT_TRUE(supervisor.ok()) << supervisor.status();
  AwaitLine("ready");
  const double start = Now();
  (*supervisor)->Stop(0.5, "recovery");
  (*supervisor)->Wait();
  EXPECT_GE(Now() - start, 0.5);  // not before the grace (ctest's timeout catches a hang)
  const furnace::v1::RankReport report = *(*supervisor)->exit_report();
  EXPECT_EQ(report.exit_kind(), furnace::v1::EXIT_KIND_STOPPED);
  EXPECT_EQ(report.signal(), SIGKILL);
  EXPECT_THAT(report.reason(), HasSubstr("recovery"));
}

// A stop that keeps the progress (a cancel, a drain: StopRank.checkpoint_grace_s): SIGUSR1 first,
// on which a train rank checkpoints its step and exits (82); SIGTERM only if it has not ended
// when the checkpoint grace is over, then SIGKILL after the stop grace.
TEST_F(RankSupervisorTest, AStopKeepingTheProgressSendsUsr1FirstAndTermOnlyAfterItsGrace) {
  const std::string loop = "echo ready; while :; do sleep 0.05; done";
  {
    auto supervisor = Run("trap 'echo usr1; exit 82' USR1; trap 'echo term; exit 7' TERM; " + loop);
    ASSERT_TRUE(supervisor.ok()) << supervisor.status();
    AwaitLine("ready");
    (*supervisor)->Stop(600, "job cancelled", 600);  // only the rank's own exit ends the wait
    (*supervisor)->Wait();
    const furnace::v1::RankReport report = *(*supervisor)->exit_report();
    EXPECT_EQ(report.exit_kind(), furnace::v1::EXIT_KIND_STOPPED);
    EXPECT_EQ(report.exit_code(), 82);
    EXPECT_THAT(report.reason(), HasSubstr("stopped: job cancelled (exited with code 82"));
    EXPECT_TRUE(seen_.HasLine("usr1"));
    EXPECT_FALSE(seen_.HasLine("term"));
  }
  {
    std::lock_guard<std::mutex> lock(seen_.mu);
    seen_.lines.clear();
  }
  {
    auto supervisor = Run("trap '' USR1; trap 'echo term; exit 7' TERM; " + loop);
    ASSERT_TRUE(supervisor.ok()) << supervisor.status();
    AwaitLine("ready");
    const double start = Now();
    (*supervisor)->Stop(600, "the worker agent is shutting down", 0.5);
    (*supervisor)->Wait();
    EXPECT_GE(Now() - start, 0.5);  // SIGTERM waited for the checkpoint grace
    const furnace::v1::RankReport report = *(*supervisor)->exit_report();
    EXPECT_EQ(report.exit_kind(), furnace::v1::EXIT_KIND_STOPPED);
    EXPECT_EQ(report.exit_code(), 7);
    EXPECT_TRUE(seen_.HasLine("term"));
  }
}

TEST_F(RankSupervisorTest, StopReachesAStoppedChild) {
  auto supervisor = Run("echo ready; kill -STOP $$");
  ASSERT_TRUE(supervisor.ok());
  AwaitLine("ready");
  (*supervisor)->Stop(0.2, "cancel");
  (*supervisor)->Wait();
  EXPECT_EQ((*supervisor)->exit_report()->exit_kind(), furnace::v1::EXIT_KIND_STOPPED);
}

TEST_F(RankSupervisorTest, OutputLinesInOrderInTheSinkAndTheLogFile) {
  const furnace::v1::RankReport report =
      RunToEnd("i=1; while [ $i -le 300 ]; do echo line-$i; i=$((i+1)); done; printf 'no-newline'");
  EXPECT_EQ(report.exit_kind(), furnace::v1::EXIT_KIND_SUCCESS);
  std::vector<std::string> expected;
  for (int i = 1; i <= 300; ++i) expected.push_back("line-" + std::to_string(i));
  expected.push_back("no-newline");
  EXPECT_EQ(seen_.lines, expected);
  std::ifstream log(LogPath());
  std::vector<std::string> logged;
  for (std::string line; std::getline(log, line);) logged.push_back(line);
  EXPECT_EQ(logged, expected);
}

// A line that is not valid UTF-8 (a binary dump, a line cut in a character) reaches the controller
// with each invalid byte a '?': protobuf refuses the batch otherwise, and the agent dropped it,
// every rank's lines with it. The local log file keeps the bytes as written.
TEST_F(RankSupervisorTest, LinesThatAreNotUtf8ReachTheSinkValid) {
  const furnace::v1::RankReport report = RunToEnd(R"(printf 'caf\303\251 \377\376 end\n')");
  EXPECT_EQ(report.exit_kind(), furnace::v1::EXIT_KIND_SUCCESS);
  EXPECT_EQ(seen_.lines, std::vector<std::string>{"caf\xc3\xa9 ?? end"});
  std::ifstream log(LogPath());
  std::string line;
  std::getline(log, line);
  EXPECT_EQ(line, "caf\xc3\xa9 \xff\xfe end");
}

TEST_F(RankSupervisorTest, LeftoverProcessesInTheGroupDoNotHoldTheExit) {
  // The leftover outlives ctest's timeout: an exit it held would hang the test. It is killed
  // after (its pid written by the script), not left running for ten minutes.
  const std::string leftover = LogPath() + ".leftover-pid";
  const furnace::v1::RankReport report =
      RunToEnd("sleep 600 & echo $! > '" + leftover + "'; echo started; exit 0");
  EXPECT_EQ(report.exit_kind(), furnace::v1::EXIT_KIND_SUCCESS);
  int pid = 0;
  std::ifstream(leftover) >> pid;
  ASSERT_GT(pid, 0);
  ::kill(pid, SIGKILL);
}

TEST_F(RankSupervisorTest, LaunchFailureIsAnError) {
  RankLaunch launch;
  launch.job_id = "job-1";
  launch.argv = {"/nonexistent/furnace-rank"};
  launch.log_path = LogPath();
  bool called = false;
  RankSinks sinks;
  sinks.on_exit = [&](const furnace::v1::RankReport&) { called = true; };
  auto supervisor = RankSupervisor::Start(std::move(launch), std::move(sinks));
  EXPECT_EQ(supervisor.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(supervisor.status().message()), HasSubstr("/nonexistent/furnace-rank"));
  EXPECT_FALSE(called);
}

// A rank SIGKILL does not end (stuck in the kernel; here a zombie its own child holds by ptrace,
// tests/worker/held_rank.cc) is reported kUnkillableS (30 s) after the SIGKILL, as killed, with
// its state: Wait returns then, so the job recovers without it. The supervisor goes on waiting,
// reaps it once the kernel lets it go, and calls the exit sink no second time.
TEST_F(RankSupervisorTest, ARankSigkillDoesNotEndIsReportedAfterThirtySecondsAndReapedLater) {
  const std::string release = (dir_ / "release").string();
  FakeClock clock;
  auto supervisor = Launch({FURNACE_HELD_RANK_BIN, release}, 0, 0, clock);
  ASSERT_TRUE(supervisor.ok()) << supervisor.status();
  for (int i = 0; i < 500 && !seen_.HasLine("held") && !(*supervisor)->done(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (!seen_.HasLine("held")) {
    std::lock_guard<std::mutex> lock(seen_.mu);
    GTEST_SKIP() << "ptrace refused here: "
                 << (seen_.lines.empty() ? std::string("no output") : seen_.lines.back());
  }
  const int pid = (*supervisor)->pid();
  (*supervisor)->Stop(0, "job cancelled");  // SIGTERM (ignored), then SIGKILL at the next poll
  // The fake clock moves a second every 10 ms until the report: 30 s after the SIGKILL.
  double advanced = 0;
  while (advanced < 120) {
    {
      std::lock_guard<std::mutex> lock(seen_.mu);
      if (seen_.exits > 0) break;
    }
    clock.Advance(1);
    advanced += 1;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  (*supervisor)->Wait();  // returns: the rank is reported, though not reaped
  {
    std::lock_guard<std::mutex> lock(seen_.mu);
    ASSERT_EQ(seen_.exits, 1);
    EXPECT_GE(advanced, 30);
    EXPECT_EQ(seen_.exit.exit_kind(), furnace::v1::EXIT_KIND_STOPPED);
    EXPECT_EQ(seen_.exit.pid(), pid);
    EXPECT_THAT(seen_.exit.reason(), HasSubstr("job cancelled"));
    EXPECT_THAT(seen_.exit.reason(), HasSubstr("killed by signal 9 (SIGKILL)); it did not end "));
    EXPECT_THAT(seen_.exit.reason(),
                HasSubstr(absl::StrCat(" s after SIGKILL and keeps its slot until the kernel lets "
                                       "it go (pid ",
                                       pid,
                                       "); the process has ended, but a tracer (a debugger, "
                                       "strace) holds it (state Z)")));
  }
  EXPECT_TRUE((*supervisor)->stuck());
  EXPECT_FALSE((*supervisor)->done());
  EXPECT_EQ(kill(pid, 0), 0);  // not reaped: the pid is still taken

  std::ofstream(release).put('\n');  // the holder exits: the rank's end reaches the supervisor
  for (int i = 0; i < 500 && !(*supervisor)->done(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_TRUE((*supervisor)->done());
  EXPECT_FALSE((*supervisor)->stuck());
  EXPECT_EQ(kill(pid, 0), -1);  // reaped
  std::lock_guard<std::mutex> lock(seen_.mu);
  EXPECT_EQ(seen_.exits, 1);
}

TEST_F(RankSupervisorTest, DestroyingTheSupervisorKillsTheRank) {
  int pid;
  {
    auto supervisor = Run("echo ready; sleep 30");
    ASSERT_TRUE(supervisor.ok());
    AwaitLine("ready");
    pid = (*supervisor)->pid();
  }
  EXPECT_EQ(kill(pid, 0), -1);
}

}  // namespace
}  // namespace furnace::worker
