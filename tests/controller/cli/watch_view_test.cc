#include "controller/cli/watch_view.h"

#include <cstdlib>
#include <ctime>

#include "controller/cli/status_view.h"
#include "gtest/gtest.h"
#include "tests/controller/cli/job_fixtures.h"

namespace furnace::cli {
namespace {

using testing::AddComm;
using testing::AddEvent;
using testing::kT0;
using testing::MakeJob;

class WatchViewTest : public ::testing::Test {
 protected:
  void SetUp() override {
    setenv("TZ", "UTC", 1);
    tzset();
  }
};

TEST_F(WatchViewTest, FrameShowsStateProgressEventAndComm) {
  v1::JobDetail job = MakeJob(v1::JOB_RUNNING, 2, 5);
  AddEvent(&job, kT0 + 10, "restart", "rank 1 exited with code 3");
  AddComm(&job, "allreduce", 1 << 20, 1.5);
  AddComm(&job, "allreduce", 4 << 20, 2.5);
  const auto lines = WatchFrame(job, kT0 + 65, 0);
  ASSERT_EQ(lines.size(), 5u);
  EXPECT_EQ(lines[0], "job j-1 cc-smoke (commcheck)  RUNNING  attempt 2  1 restart");
  EXPECT_EQ(lines[1], "[###############---------------]  50%  step 5/10  elapsed 1m05s");
  EXPECT_EQ(lines[2], "last event: 22:13:30 restart: rank 1 exited with code 3");
  EXPECT_EQ(lines[3], "COLLECTIVE     SIZE  ALGBW GB/s  BUSBW GB/s  VERIFIED");
  EXPECT_EQ(lines[4], "allreduce   4.0 MiB        2.50        2.50  yes");  // the largest size
}

TEST_F(WatchViewTest, FrameCutsLinesToWidth) {
  const auto lines = WatchFrame(MakeJob(v1::JOB_PENDING, 0, 0, 0), kT0, 12);
  for (const auto& line : lines) EXPECT_LE(line.size(), 12u) << line;
  EXPECT_EQ(lines[0], "job j-1 c...");
}

TEST_F(WatchViewTest, RedrawMovesUpAndClearsLeftovers) {
  EXPECT_EQ(RedrawFrame(0, {"a", "b"}), "\r\x1b[2Ka\n\r\x1b[2Kb\n");
  EXPECT_EQ(RedrawFrame(2, {"c", "d"}), "\x1b[2A\r\x1b[2Kc\n\r\x1b[2Kd\n");
  // A shorter frame clears the old last line and leaves the cursor below the new one.
  EXPECT_EQ(RedrawFrame(3, {"e"}), "\x1b[3A\r\x1b[2Ke\n\r\x1b[2K\n\r\x1b[2K\n\x1b[2A");
}

TEST_F(WatchViewTest, PlainLinesOnlyOnChange) {
  v1::JobDetail first = MakeJob(v1::JOB_RUNNING, 1, 3);
  AddEvent(&first, kT0 + 1, "scheduled", "2 ranks placed");
  auto lines = PlainWatchLines(nullptr, first);
  ASSERT_EQ(lines.size(), 2u);  // the events, then the status they led to
  EXPECT_EQ(lines[0], "22:13:21 scheduled: 2 ranks placed");
  EXPECT_EQ(lines[1], "22:14:25 job j-1 RUNNING  attempt 1  0 restarts  step 3/10 (30%)");

  // Same state, step and events: nothing.
  EXPECT_TRUE(PlainWatchLines(&first, first).empty());

  // A new event alone: just the event.
  v1::JobDetail second = first;
  AddEvent(&second, kT0 + 20, "rank_exit", "rank 1 crashed");
  lines = PlainWatchLines(&first, second);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0], "22:13:40 rank_exit: rank 1 crashed");

  // A restart: new attempt and a line for it, even though the step went back.
  v1::JobDetail third = MakeJob(v1::JOB_RECOVERING, 2, 0);
  *third.mutable_events() = second.events();
  lines = PlainWatchLines(&second, third);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0], "22:14:25 job j-1 RECOVERING  attempt 2  1 restart  step 0/10 (0%)");
}

// The summary keeps attempt 1's cause while attempt 2 runs: that is what the job restarted after,
// not its cause now. Recovering or ended, it is the cause.
TEST_F(WatchViewTest, ARunningAttemptShowsTheLastFailureAsPastNotAsItsCause) {
  const std::string hung = "rank 2 on vm/2: hung in step 30";
  v1::JobDetail recovering = MakeJob(v1::JOB_RECOVERING, 1, 30, 60);
  recovering.mutable_summary()->set_cause(hung);
  auto lines = PlainWatchLines(nullptr, recovering);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0],
            "22:14:25 job j-1 RECOVERING  attempt 1  0 restarts  step 30/60 (50%)  cause: " + hung);
  EXPECT_EQ(WatchFrame(recovering, kT0 + 65, 0)[2], "cause: " + hung);

  v1::JobDetail running = MakeJob(v1::JOB_RUNNING, 2, 0, 60);
  running.mutable_summary()->set_cause(hung);
  lines = PlainWatchLines(&recovering, running);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0], "22:14:25 job j-1 RUNNING  attempt 2  1 restart  step 0/60 (0%)");
  const auto frame = WatchFrame(running, kT0 + 65, 0);
  ASSERT_EQ(frame.size(), 4u);
  EXPECT_EQ(frame[2], "restarted after: " + hung);

  v1::JobDetail failed = MakeJob(v1::JOB_FAILED, 2, 0, 60);
  failed.mutable_summary()->set_cause(hung);
  EXPECT_NE(PlainWatchLines(&running, failed)[0].find("  cause: " + hung), std::string::npos);
}

// `furnace status` and `furnace jobs` label the kept cause the same way as watch.
TEST_F(WatchViewTest, StatusAndJobsLabelALaterAttemptsCauseAsPast) {
  const std::string hung = "rank 2 on vm/2: hung in step 30";
  v1::JobDetail recovering = MakeJob(v1::JOB_RECOVERING, 1, 30, 60);
  recovering.mutable_summary()->set_cause(hung);
  v1::JobDetail running = MakeJob(v1::JOB_RUNNING, 2, 0, 60);
  running.mutable_summary()->set_cause(hung);

  const std::string now = RenderJobStatus(recovering, kT0 + 65);
  EXPECT_NE(now.find("\ncause "), std::string::npos) << now;
  EXPECT_EQ(now.find("restarted after"), std::string::npos) << now;
  const std::string past = RenderJobStatus(running, kT0 + 65);
  EXPECT_NE(past.find("\nrestarted after  " + hung), std::string::npos) << past;
  EXPECT_EQ(past.find("\ncause "), std::string::npos) << past;

  v1::ListJobsResponse jobs;
  *jobs.add_jobs() = recovering.summary();
  *jobs.add_jobs() = running.summary();
  const std::string table = RenderJobsTable(jobs, kT0 + 65);
  EXPECT_NE(table.find("  " + hung), std::string::npos) << table;
  EXPECT_NE(table.find("restarted after: " + hung), std::string::npos) << table;
}

// Why a job waits is in `furnace jobs` (its CAUSE column) and `furnace status`: it was only in the
// job's events, so a list of pending jobs did not say why any of them waited.
TEST_F(WatchViewTest, JobsAndStatusSayWhyAJobWaits) {
  const std::string why = "needs 2 free cpu workers, 0 available (busy with job big-8 (4))";
  v1::JobDetail pending = MakeJob(v1::JOB_PENDING, 0, 0, 60);
  pending.mutable_summary()->set_waiting(why);
  v1::ListJobsResponse jobs;
  *jobs.add_jobs() = pending.summary();
  const std::string table = RenderJobsTable(jobs, kT0 + 65);
  EXPECT_NE(table.find("waiting: needs 2 free cpu workers"), std::string::npos) << table;
  const std::string status = RenderJobStatus(pending, kT0 + 65);
  EXPECT_NE(status.find("\nwaiting    " + why), std::string::npos) << status;
}

// `furnace status` says when the attempt runs another memory policy than the spec's (the
// out-of-memory escalation), and nothing when it runs the spec's.
TEST_F(WatchViewTest, StatusSaysWhichMemoryPolicyAnEscalatedAttemptRuns) {
  v1::JobDetail job = MakeJob(v1::JOB_RUNNING, 2, 10, 60);
  job.mutable_spec()->mutable_memory()->set_policy("offload");
  job.add_attempts()->set_memory_policy("offload");
  EXPECT_EQ(RenderJobStatus(job, kT0 + 65).find("memory policy"), std::string::npos);
  job.add_attempts()->set_memory_policy("adaptive");
  const std::string out = RenderJobStatus(job, kT0 + 65);
  EXPECT_NE(out.find("\nmemory policy  adaptive  (the spec's is offload; escalated after an "
                     "attempt ran out of memory)"),
            std::string::npos)
      << out;
}

TEST_F(WatchViewTest, PlainLinesSurviveEventWindowSliding) {
  v1::JobDetail a = MakeJob(v1::JOB_RUNNING, 1, 3);
  AddEvent(&a, kT0 + 1, "x", "one");
  AddEvent(&a, kT0 + 2, "x", "two");
  v1::JobDetail b = MakeJob(v1::JOB_RUNNING, 1, 3);  // the controller dropped the oldest event
  AddEvent(&b, kT0 + 2, "x", "two");
  AddEvent(&b, kT0 + 3, "x", "three");
  const auto lines = PlainWatchLines(&a, b);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0], "22:13:23 x: three");
}

TEST_F(WatchViewTest, SummaryNamesStateRestartsAndCause) {
  v1::JobDetail job = MakeJob(v1::JOB_FAILED, 3, 4);
  job.mutable_summary()->set_cause("max_restarts (2) exhausted: rank 1 exited with code 3");
  EXPECT_EQ(WatchSummary(job, kT0 + 1000),
            "job j-1 FAILED after 1m05s (attempt 3, 2 restarts), step 4/10: max_restarts (2) "
            "exhausted: rank 1 exited with code 3");
}

TEST_F(WatchViewTest, StatusShowsAttemptsCausesRanksCommAndEvents) {
  v1::JobDetail job = MakeJob(v1::JOB_RUNNING, 2, 5);
  auto* a1 = job.add_attempts();
  a1->set_attempt(1);
  a1->set_state(v1::ATTEMPT_STATE_FAILED);
  a1->set_cause("rank 1 exited with code 3");
  a1->set_started_unix(kT0 + 1);
  a1->set_ended_unix(kT0 + 13);
  auto* r = a1->add_ranks();
  r->set_rank(1);
  r->set_worker_id("w-b");
  r->set_host("hostb");
  r->set_pid(4242);
  r->set_state(v1::RANK_STATE_EXITED);
  r->set_exit("code 3");
  auto* a2 = job.add_attempts();
  a2->set_attempt(2);
  a2->set_state(v1::ATTEMPT_STATE_RUNNING);
  a2->set_started_unix(kT0 + 20);
  AddComm(&job, "allreduce", 4096, 0.5);
  AddEvent(&job, kT0 + 13, "restart", "attempt 2 after rank 1 exited with code 3");
  job.mutable_telemetry()->set_loss(2.5);
  const std::string out = RenderJobStatus(job, kT0 + 65);
  for (const char* want :
       {"state      RUNNING", "attempt    2  (1 restart)", "1  failed   2023-11-14 22:13:21  12s",
        "rank 1 exited with code 3", "w-b     hostb  4242  exited", "allreduce   4.0 KiB", "0.500",
        "loss", "2023-11-14 22:13:33  restart  attempt 2 after rank 1"}) {
    EXPECT_NE(out.find(want), std::string::npos) << want << "\n" << out;
  }
}

TEST_F(WatchViewTest, JobsAndWorkersTables) {
  v1::ListJobsResponse jobs;
  *jobs.add_jobs() = MakeJob(v1::JOB_SUCCEEDED, 1, 10).summary();
  const std::string table = RenderJobsTable(jobs, kT0 + 70);
  EXPECT_EQ(table,
            "JOB  NAME      KIND       STATE      ATTEMPT  RESTARTS  RANKS  PROGRESS  AGE/UPDATED  "
            "CAUSE\n"
            "j-1  cc-smoke  commcheck  SUCCEEDED        1         0      2     10/10  1m10s/5s     "
            "-\n");
  v1::ListWorkersResponse workers;
  auto* w = workers.add_workers();
  w->set_worker_id("w-a");
  w->set_host("hosta");
  w->set_device_kind("cpu");
  w->set_device_memory(16ull << 30);
  w->set_state(v1::WORKER_STATE_BUSY);
  w->set_job_id("j-1");
  w->set_rank(0);
  w->set_last_seen_unix(kT0 + 68);
  w->set_pid(99);
  EXPECT_EQ(RenderWorkersTable(workers, kT0 + 70),
            "WORKER  HOST   SLOT  DEVICE    MEMORY  STATE  JOB/RANK  LAST SEEN  PID\n"
            "w-a     hosta     0  cpu     16.0 GiB  busy   j-1/0     2s ago      99\n");
  // Stopped cleanly (its agent said it was leaving) reads apart from lost (crashed, silent).
  w->set_state(v1::WORKER_STATE_LOST);
  w->clear_job_id();
  w->set_left(true);
  auto* crashed = workers.add_workers();
  *crashed = *w;
  crashed->set_worker_id("w-b");
  crashed->set_left(false);
  EXPECT_EQ(RenderWorkersTable(workers, kT0 + 70),
            "WORKER  HOST   SLOT  DEVICE    MEMORY  STATE  JOB/RANK  LAST SEEN  PID\n"
            "w-a     hosta     0  cpu     16.0 GiB  left   -         2s ago      99\n"
            "w-b     hosta     0  cpu     16.0 GiB  lost   -         2s ago      99\n");
}

}  // namespace
}  // namespace furnace::cli
