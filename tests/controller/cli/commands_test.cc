// The commands against a fake JobClient and a fake clock: no sockets, no sleeping.
#include "controller/cli/commands.h"

#include <deque>
#include <sstream>

#include "absl/strings/match.h"
#include "controller/cli/exit_codes.h"
#include "controller/cli/poll_outage.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "tests/controller/cli/fake_job_client.h"
#include "tests/controller/cli/job_fixtures.h"

namespace furnace::cli {
namespace {

using testing::AddEvent;
using testing::kT0;
using testing::MakeJob;

using testing::FakeJobClient;

class CommandsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    setenv("TZ", "UTC", 1);
    tzset();
    ctx_.client = &client_;
    ctx_.out = &out_;
    ctx_.err = &err_;
    ctx_.clock = &clock_;
    ctx_.sleep = [this](double s) {
      ++sleeps_;
      clock_.Advance(s);
    };
  }

  FakeJobClient client_;
  std::ostringstream out_, err_;
  FakeClock clock_{kT0};
  CommandContext ctx_;
  int sleeps_ = 0;
};

TEST_F(CommandsTest, WatchPlainPrintsChangesAndExitsByFinalState) {
  v1::JobDetail running = MakeJob(v1::JOB_RUNNING, 1, 2);
  client_.get_job = {MakeJob(v1::JOB_PENDING, 0, 0), running, running,
                     MakeJob(v1::JOB_SUCCEEDED, 1, 10)};
  auto code = RunWatch(ctx_, "j-1");
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, kExitOk);
  EXPECT_EQ(client_.get_job_calls, 4);
  EXPECT_EQ(sleeps_, 3);
  EXPECT_EQ(out_.str(),
            "22:14:25 job j-1 PENDING  attempt 0  0 restarts  step 0/10 (0%)\n"
            "22:14:25 job j-1 RUNNING  attempt 1  0 restarts  step 2/10 (20%)\n"
            "22:14:25 job j-1 SUCCEEDED  attempt 1  0 restarts  step 10/10 (100%)\n"
            "job j-1 SUCCEEDED after 1m05s (attempt 1, 0 restarts), step 10/10\n");
}

TEST_F(CommandsTest, WatchFailedJobExits1) {
  v1::JobDetail failed = MakeJob(v1::JOB_FAILED, 3, 4);
  failed.mutable_summary()->set_cause("max_restarts exhausted");
  client_.get_job = {failed};
  auto code = RunWatch(ctx_, "j-1");
  ASSERT_TRUE(code.ok());
  EXPECT_EQ(*code, kExitJobFailed);
  EXPECT_NE(out_.str().find("cause: max_restarts exhausted"), std::string::npos) << out_.str();
}

TEST_F(CommandsTest, WatchTtyRedrawsInPlace) {
  ctx_.tty = true;
  ctx_.width = 100;
  client_.get_job = {MakeJob(v1::JOB_RUNNING, 1, 2), MakeJob(v1::JOB_CANCELLED, 1, 3)};
  auto code = RunWatch(ctx_, "j-1");
  ASSERT_TRUE(code.ok());
  EXPECT_EQ(*code, kExitJobFailed);
  EXPECT_NE(out_.str().find("\x1b[3A"), std::string::npos);  // the 3-line frame was redrawn
  EXPECT_NE(out_.str().find("job j-1 CANCELLED after"), std::string::npos);
}

TEST_F(CommandsTest, WatchUnknownJobIsNotFound) {
  client_.get_job = {absl::NotFoundError("no job j-9")};
  auto code = RunWatch(ctx_, "j-9");
  EXPECT_EQ(ExitCodeForStatus(code.status()), kExitJobNotFound);
}

TEST_F(CommandsTest, WatchRidesOutABriefControllerRestart) {
  client_.get_job = {MakeJob(v1::JOB_RUNNING, 1, 2), absl::UnavailableError("down"),
                     absl::UnavailableError("down"), MakeJob(v1::JOB_SUCCEEDED, 1, 10)};
  auto code = RunWatch(ctx_, "j-1");
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, kExitOk);
}

TEST_F(CommandsTest, WatchGivesUpOnAControllerThatStaysDown) {
  client_.get_job = {MakeJob(v1::JOB_RUNNING, 1, 2), absl::UnavailableError("down")};
  auto code = RunWatch(ctx_, "j-1");
  EXPECT_TRUE(absl::IsUnavailable(code.status()));
}

// A controller slow to answer (its call deadline passed) is an outage too, not the end.
TEST_F(CommandsTest, WatchRidesOutASlowController) {
  client_.get_job = {MakeJob(v1::JOB_RUNNING, 1, 2), absl::DeadlineExceededError("late"),
                     MakeJob(v1::JOB_SUCCEEDED, 1, 10)};
  auto code = RunWatch(ctx_, "j-1");
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, kExitOk);
}

void WriteFile(const std::string& path, const std::string& text) {
  FILE* f = fopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  fwrite(text.data(), 1, text.size(), f);
  fclose(f);
}

// submit --watch: the submission was the controller's answer, so the first poll may already
// ride out an outage; one that lasts ends with an error that names the job made.
TEST_F(CommandsTest, SubmitWatchRidesOutAnOutageAndNamesTheJobIfItLasts) {
  const std::string path = ::testing::TempDir() + "/watched.yaml";
  WriteFile(path, "name: x\nkind: commcheck\n");
  ctx_.json = true;
  client_.get_job = {absl::UnavailableError("down"), MakeJob(v1::JOB_SUCCEEDED, 1, 10)};
  auto code = RunSubmit(ctx_, path, {.watch = true});
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, kExitOk);

  client_.get_job = {absl::UnavailableError("down")};
  code = RunSubmit(ctx_, path, {.watch = true});
  EXPECT_TRUE(absl::IsUnavailable(code.status()));
  EXPECT_TRUE(
      absl::StartsWith(code.status().message(), "submitted job j-1, but watching it failed: down"))
      << code.status();
}

TEST_F(CommandsTest, WatchJsonPrintsOneFinalDocument) {
  ctx_.json = true;
  client_.get_job = {MakeJob(v1::JOB_RUNNING, 1, 2), MakeJob(v1::JOB_SUCCEEDED, 1, 10)};
  ASSERT_TRUE(RunWatch(ctx_, "j-1").ok());
  const std::string out = out_.str();
  EXPECT_EQ(out.front(), '{');
  EXPECT_NE(out.find("\"state\": \"JOB_SUCCEEDED\""), std::string::npos) << out;
  EXPECT_NE(out.find("\"job_id\": \"j-1\""), std::string::npos) << out;
  EXPECT_NE(out.find("\"restarts\": 0"), std::string::npos) << out;  // defaults printed
  EXPECT_EQ(out.find("JOB_RUNNING"), std::string::npos);
  // The progress a plain watch prints, on stderr: a long watch is not silent.
  EXPECT_NE(err_.str().find("job j-1 RUNNING"), std::string::npos) << err_.str();
  EXPECT_NE(err_.str().find("job j-1 SUCCEEDED"), std::string::npos) << err_.str();
}

// submit --watch --json: stdout is the final JobDetail alone; the submitted line, with what the
// controller filled in, goes to stderr with the watch's progress.
TEST_F(CommandsTest, SubmitWatchJsonSaysTheSubmissionOnStderr) {
  const std::string path = ::testing::TempDir() + "/watched.yaml";
  WriteFile(path, "name: x\nkind: commcheck\n");
  client_.submit_defaults = {
      "resources.time_limit_s 3600 s from the controller's --default-time-limit"};
  client_.get_job = {MakeJob(v1::JOB_SUCCEEDED, 1, 10)};
  ctx_.json = true;
  auto code = RunSubmit(ctx_, path, {.watch = true});
  ASSERT_TRUE(code.ok()) << code.status();
  v1::JobDetail printed;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(out_.str(), &printed).ok()) << out_.str();
  EXPECT_EQ(printed.summary().job_id(), "j-1");
  EXPECT_TRUE(absl::StartsWith(err_.str(),
                               "submitted job j-1 (resources.time_limit_s 3600 s from the "
                               "controller's --default-time-limit)\n"))
      << err_.str();
}

TEST_F(CommandsTest, SubmitSendsTextAndFilename) {
  const std::string path = ::testing::TempDir() + "/job.yaml";
  WriteFile(path, "name: x\nkind: commcheck\n");
  auto code = RunSubmit(ctx_, path, {});
  ASSERT_TRUE(code.ok());
  EXPECT_EQ(*code, kExitOk);
  EXPECT_EQ(client_.submitted.yaml(), "name: x\nkind: commcheck\n");
  EXPECT_EQ(client_.submitted.filename(), path);
  EXPECT_EQ(out_.str(), "submitted job j-1\n");

  client_.submit_error = absl::InvalidArgumentError("job.yaml:2: kind: 'x' is not allowed");
  code = RunSubmit(ctx_, path, {});
  EXPECT_EQ(ExitCodeForStatus(code.status()), kExitUsage);
  EXPECT_EQ(code.status().message(), "job.yaml:2: kind: 'x' is not allowed");

  code = RunSubmit(ctx_, ::testing::TempDir() + "/missing.yaml", {});
  EXPECT_EQ(ExitCodeForStatus(code.status()), kExitUsage);
}

// What the controller filled in that the file left out (a cluster's default time limit) is said
// at once, beside the job id; --json prints it as the response's `defaults`.
TEST_F(CommandsTest, SubmitSaysWhatTheControllerFilledIn) {
  const std::string path = ::testing::TempDir() + "/defaulted.yaml";
  WriteFile(path, "name: x\nkind: commcheck\n");
  client_.submit_defaults = {
      "resources.time_limit_s 3600 s from the controller's --default-time-limit"};
  auto code = RunSubmit(ctx_, path, {});
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(out_.str(),
            "submitted job j-1 (resources.time_limit_s 3600 s from the controller's "
            "--default-time-limit)\n");
  out_.str("");
  ctx_.json = true;
  code = RunSubmit(ctx_, path, {});
  ASSERT_TRUE(code.ok()) << code.status();
  v1::SubmitJobResponse printed;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(out_.str(), &printed).ok()) << out_.str();
  EXPECT_EQ(printed.job_id(), "j-1");
  ASSERT_EQ(printed.defaults_size(), 1);
  EXPECT_EQ(printed.defaults(0),
            "resources.time_limit_s 3600 s from the controller's --default-time-limit");
}

// A rank or attempt the job lacks is the controller's NotFound: exit 4 with its words, nothing
// printed, and --follow does not wait for it.
TEST_F(CommandsTest, LogsOfARankTheJobLacksExit4) {
  client_.logs = {absl::NotFoundError("job j-1 has no rank 9; it has ranks 0..3")};
  auto code = RunLogs(ctx_, "j-1", {.rank = 9, .follow = true});
  EXPECT_EQ(ExitCodeForStatus(code.status()), kExitJobNotFound);
  EXPECT_EQ(code.status().message(), "job j-1 has no rank 9; it has ranks 0..3");
  EXPECT_EQ(client_.log_requests.size(), 1u);
  EXPECT_EQ(client_.log_requests[0].rank(), 9);
  EXPECT_EQ(sleeps_, 0);
  EXPECT_TRUE(out_.str().empty()) << out_.str();
}

// Every refusal of the job by the controller exits 2 as an invalid file does, its words kept; a
// rate limit, which the same file gets past later, stays an RPC error (3).
TEST_F(CommandsTest, SubmitRefusedByTheControllerExits2ButARateLimit3) {
  const std::string path = ::testing::TempDir() + "/clash.yaml";
  WriteFile(path, "name: x\nkind: commcheck\n");
  const std::string clash =
      "SubmitJob failed: clash.yaml: checkpoint.dir /tmp/ck is in use by job hang-14 (RUNNING)";
  client_.submit_error = absl::FailedPreconditionError(clash);
  auto code = RunSubmit(ctx_, path, {});
  EXPECT_EQ(ExitCodeForStatus(code.status()), kExitUsage);
  EXPECT_EQ(code.status().message(), clash);
  code = RunSubmit(ctx_, path, {.watch = true});
  EXPECT_EQ(ExitCodeForStatus(code.status()), kExitUsage);
  client_.submit_error = absl::InvalidArgumentError(
      "clash.yaml: resources.workers: the job needs 8 ranks (pp*dp*tp = 2*2*2) but this "
      "controller has 4 cpu workers; allowed: at most 4");
  code = RunSubmit(ctx_, path, {});
  EXPECT_EQ(ExitCodeForStatus(code.status()), kExitUsage);
  client_.submit_error = absl::ResourceExhaustedError("SubmitJob failed: rate limit");
  code = RunSubmit(ctx_, path, {});
  EXPECT_EQ(ExitCodeForStatus(code.status()), kExitRpcError);
  client_.submit_error = absl::UnavailableError("cannot reach the controller");
  code = RunSubmit(ctx_, path, {});
  EXPECT_EQ(ExitCodeForStatus(code.status()), kExitRpcError);
  EXPECT_TRUE(out_.str().empty()) << out_.str();
}

TEST_F(CommandsTest, SubmitRefusesWhatCannotBeSentWithoutSendingIt) {
  const std::string bad = ::testing::TempDir() + "/bad_utf8.yaml";
  WriteFile(bad, "name: x\nkind: commcheck\n# caf\xE9\n");
  auto code = RunSubmit(ctx_, bad, {});
  EXPECT_EQ(ExitCodeForStatus(code.status()), kExitUsage);
  EXPECT_EQ(code.status().message(),
            bad + ": byte 29 (0xe9): not valid UTF-8; a job file is UTF-8 text");
  const std::string huge = ::testing::TempDir() + "/huge.yaml";
  WriteFile(huge, std::string((size_t{1} << 20) + 10, '#'));
  code = RunSubmit(ctx_, huge, {});
  EXPECT_EQ(ExitCodeForStatus(code.status()), kExitUsage);
  EXPECT_NE(code.status().message().find(huge + ": the job file is 1048577 bytes; the limit is "
                                                "1048576 bytes"),
            std::string::npos)
      << code.status();
  EXPECT_EQ(client_.submit_calls, 0);
}

TEST_F(CommandsTest, SubmitDryRunValidatesHereAndSendsNothing) {
  const std::string path = ::testing::TempDir() + "/dry.yaml";
  WriteFile(path, "name: x\nkind: commcheck\nparallel: {dp: 2}\n");
  auto code = RunSubmit(ctx_, path, {.dry_run = DryRun::kClient});
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(out_.str(), path + ": valid job x (commcheck, 2 ranks); not submitted (--dry-run)\n");
  WriteFile(path, "name: x\nkind: nope\n");
  code = RunSubmit(ctx_, path, {.dry_run = DryRun::kClient});
  EXPECT_EQ(ExitCodeForStatus(code.status()), kExitUsage);
  EXPECT_NE(code.status().message().find("kind"), std::string::npos) << code.status();
  EXPECT_EQ(client_.submit_calls, 0);
}

// --dry-run=server: the controller checks the file as a submission (CheckJob) and stores nothing;
// the CLI says it would accept it and what it would fill in. A controller older than CheckJob
// answers UNIMPLEMENTED: said so, with what to use instead; nothing was submitted.
TEST_F(CommandsTest, SubmitDryRunServerAsksTheController) {
  const std::string path = ::testing::TempDir() + "/server_dry.yaml";
  WriteFile(path, "name: x\nkind: commcheck\nparallel: {dp: 2}\n");
  client_.checked_spec.set_name("x");
  client_.checked_spec.set_kind("commcheck");
  client_.checked_spec.mutable_parallel()->set_pp(1);
  client_.checked_spec.mutable_parallel()->set_dp(2);
  client_.checked_spec.mutable_parallel()->set_tp(1);
  client_.checked_spec.mutable_resources()->set_time_limit_s(3600);
  client_.submit_defaults = {
      "resources.time_limit_s 3600 s from the controller's --default-time-limit"};
  auto code = RunSubmit(ctx_, path, {.dry_run = DryRun::kServer});
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, kExitOk);
  EXPECT_EQ(client_.checked.filename(), path);
  EXPECT_EQ(client_.checked.yaml(), "name: x\nkind: commcheck\nparallel: {dp: 2}\n");
  EXPECT_EQ(out_.str(), path +
                            ": the controller would accept job x (commcheck, 2 ranks; "
                            "resources.time_limit_s 3600 s from the controller's "
                            "--default-time-limit); not submitted (--dry-run=server)\n");
  out_.str("");
  ctx_.json = true;
  code = RunSubmit(ctx_, path, {.dry_run = DryRun::kServer});
  ASSERT_TRUE(code.ok()) << code.status();
  v1::SubmitJobResponse printed;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(out_.str(), &printed).ok()) << out_.str();
  EXPECT_TRUE(printed.job_id().empty());
  EXPECT_EQ(printed.spec().resources().time_limit_s(), 3600);
  ASSERT_EQ(printed.defaults_size(), 1);
  // A refusal is the controller's, as for a submission: an invalid field or a checkpoint.dir in
  // use exits 2.
  out_.str("");
  for (const absl::Status& refusal :
       {absl::InvalidArgumentError(path + ": resources.time_limit_s: 9000 s is more than this "
                                          "controller allows"),
        absl::FailedPreconditionError(path + ": checkpoint.dir /tmp/ck is in use by job y-1")}) {
    client_.submit_error = refusal;
    code = RunSubmit(ctx_, path, {.dry_run = DryRun::kServer});
    EXPECT_EQ(ExitCodeForStatus(code.status()), kExitUsage) << code.status();
    EXPECT_TRUE(out_.str().empty()) << out_.str();
  }
  // An older controller.
  client_.submit_error = absl::UnimplementedError("CheckJob failed: Method not found");
  ctx_.json = false;
  code = RunSubmit(ctx_, path, {.dry_run = DryRun::kServer});
  ASSERT_FALSE(code.ok());
  EXPECT_EQ(code.status().message(),
            "the controller cannot check a file (it is older than this furnace: CheckJob failed: "
            "Method not found); nothing was submitted; use --dry-run to validate it here");
  EXPECT_EQ(client_.check_calls, 5);
  EXPECT_EQ(client_.submit_calls, 0);
}

TEST_F(CommandsTest, EventsShowsTheAuditLog) {
  v1::ListAuditEventsResponse audit;
  v1::AuditEvent* e = audit.add_events();
  e->set_unix_time(kT0);
  e->set_identity("alice");
  e->set_action("submit");
  e->set_job_id("j-7");
  e->set_accepted(true);
  e->set_code("OK");
  e->set_detail("submitted t.yaml");
  e = audit.add_events();
  e->set_unix_time(kT0 + 5);
  e->set_identity("ipv4:127.0.0.1:5000");
  e->set_action("cancel");
  e->set_code("NOT_FOUND");
  e->set_detail("no job 'j-9'\nsecond line");
  client_.audit = audit;
  auto code = RunEvents(ctx_, {.job_id = "j-7", .limit = 20});
  ASSERT_TRUE(code.ok()) << code.status();
  ASSERT_EQ(client_.audit_requests.size(), 1u);
  EXPECT_EQ(client_.audit_requests[0].job_id(), "j-7");
  EXPECT_EQ(client_.audit_requests[0].limit(), 20u);
  const std::string out = out_.str();
  EXPECT_NE(out.find("TIME"), std::string::npos) << out;
  EXPECT_NE(out.find("alice"), std::string::npos) << out;
  EXPECT_NE(out.find("accepted"), std::string::npos) << out;
  EXPECT_NE(out.find("refused (NOT_FOUND)"), std::string::npos) << out;
  EXPECT_NE(out.find("no job 'j-9'"), std::string::npos) << out;
  EXPECT_EQ(out.find("second line"), std::string::npos) << out;

  out_.str("");
  ctx_.json = true;
  ASSERT_TRUE(RunEvents(ctx_, {}).ok());
  EXPECT_NE(out_.str().find("\"identity\": \"alice\""), std::string::npos) << out_.str();

  out_.str("");
  ctx_.json = false;
  client_.audit = v1::ListAuditEventsResponse();
  ASSERT_TRUE(RunEvents(ctx_, {.job_id = "j-1"}).ok());
  EXPECT_EQ(out_.str(), "no events for job j-1\n");
}

v1::GetLogsResponse Page(std::vector<std::string> lines, uint64_t next, bool done) {
  v1::GetLogsResponse page;
  for (auto& l : lines) page.add_lines(l);
  page.set_next_offset(next);
  page.set_job_done(done);
  return page;
}

TEST_F(CommandsTest, LogsPagesByOffsetUntilEmpty) {
  client_.logs = {Page({"a", "b"}, 2, false), Page({"c"}, 3, false), Page({}, 3, false)};
  ASSERT_TRUE(RunLogs(ctx_, "j-1", LogsOptions{.rank = 1, .attempt = 2}).ok());
  EXPECT_EQ(out_.str(), "a\nb\nc\n");
  ASSERT_EQ(client_.log_requests.size(), 3u);
  EXPECT_EQ(client_.log_requests[1].offset(), 2u);
  EXPECT_EQ(client_.log_requests[2].offset(), 3u);
  EXPECT_EQ(client_.log_requests[0].rank(), 1);
  EXPECT_EQ(client_.log_requests[0].attempt(), 2);
  EXPECT_EQ(sleeps_, 0);
}

TEST_F(CommandsTest, LogsFollowPollsUntilJobDone) {
  client_.logs = {Page({"a"}, 1, false), Page({}, 1, false), Page({"b"}, 2, true),
                  Page({}, 2, true)};
  ASSERT_TRUE(RunLogs(ctx_, "j-1", LogsOptions{.follow = true}).ok());
  EXPECT_EQ(out_.str(), "a\nb\n");
  EXPECT_EQ(sleeps_, 1);
  EXPECT_EQ(client_.log_requests.size(), 4u);
}

// A job that has written nothing (it has not started) says so on stderr, with why it waits: it
// printed nothing and exited 0, like a job whose ranks wrote nothing.
TEST_F(CommandsTest, LogsOfAJobWithoutLinesSayWhy) {
  v1::JobDetail pending = MakeJob(v1::JOB_PENDING, 0, 0);
  pending.mutable_summary()->set_waiting("needs 4 free cpu workers, 2 available");
  client_.get_job = {pending};
  client_.logs = {Page({}, 0, false)};
  ASSERT_TRUE(RunLogs(ctx_, "j-1", LogsOptions{}).ok());
  EXPECT_EQ(out_.str(), "");
  EXPECT_EQ(err_.str(),
            "job j-1 has no log lines (PENDING, waiting: needs 4 free cpu workers, 2 available)\n");
}

// --json (one document at the end) with --follow would print nothing until the job ended.
TEST_F(CommandsTest, LogsRefusesJsonWithFollow) {
  ctx_.json = true;
  const absl::StatusOr<int> run = RunLogs(ctx_, "j-1", LogsOptions{.follow = true});
  EXPECT_TRUE(absl::IsInvalidArgument(run.status())) << run.status();
  EXPECT_NE(run.status().message().find("--json and --follow"), std::string::npos);
  EXPECT_TRUE(client_.log_requests.empty());
}

// A controller restart while following: the lines go on from where they were (same offset).
TEST_F(CommandsTest, LogsFollowRidesOutAControllerRestart) {
  client_.logs = {Page({"a"}, 1, false), absl::UnavailableError("down"),
                  absl::DeadlineExceededError("late"), Page({"b"}, 2, true), Page({}, 2, true)};
  ASSERT_TRUE(RunLogs(ctx_, "j-1", LogsOptions{.follow = true}).ok());
  EXPECT_EQ(out_.str(), "a\nb\n");
  ASSERT_EQ(client_.log_requests.size(), 5u);
  EXPECT_EQ(client_.log_requests[3].offset(), 1u);
}

// Without --follow, or before the controller ever answered, an outage is the command's error.
TEST_F(CommandsTest, LogsWithoutFollowOrAnswerEndsOnAnOutage) {
  client_.logs = {Page({"a"}, 1, false), absl::UnavailableError("down")};
  EXPECT_TRUE(absl::IsUnavailable(RunLogs(ctx_, "j-1", LogsOptions{}).status()));
  client_.logs = {absl::UnavailableError("down")};
  EXPECT_TRUE(absl::IsUnavailable(RunLogs(ctx_, "j-1", LogsOptions{.follow = true}).status()));
  EXPECT_EQ(sleeps_, 0);
}

TEST_F(CommandsTest, LogsFollowGivesUpOnAControllerThatStaysDown) {
  client_.logs = {Page({"a"}, 1, false), absl::UnavailableError("down")};
  EXPECT_TRUE(absl::IsUnavailable(RunLogs(ctx_, "j-1", LogsOptions{.follow = true}).status()));
  EXPECT_GT(sleeps_ * ctx_.poll_interval_s, kPollOutageGraceS);
}

TEST_F(CommandsTest, CancelPrintsResultingState) {
  ASSERT_TRUE(RunCancel(ctx_, {"j-1"}).ok());
  EXPECT_EQ(out_.str(), "job j-1 is CANCELLED\n");
}

// A train job's ranks cancelled stop after their step and write its checkpoint: the cancel says
// so, and --wait waits until each has ended and prints how, ranks that ended alike on one line.
v1::JobDetail CancelledTrainJob(int ranks, int ended) {
  v1::JobDetail job = MakeJob(v1::JOB_CANCELLED, 1, 36, 100);
  job.mutable_spec()->set_kind("train");
  job.mutable_spec()->mutable_checkpoint()->set_dir("/ckpt/a");
  job.mutable_spec()->mutable_checkpoint()->set_stop_grace_s(60);
  v1::AttemptInfo* attempt = job.add_attempts();
  attempt->set_attempt(1);
  attempt->set_state(v1::ATTEMPT_STATE_CANCELLED);
  for (int r = 0; r < ranks; ++r) {
    v1::RankInfo* rank = attempt->add_ranks();
    rank->set_rank(r);
    rank->set_state(v1::RANK_STATE_RUNNING);
    if (r >= ended) continue;
    rank->set_state(v1::RANK_STATE_EXITED);
    rank->set_exit(r == 2 ? "stopped: with the peers of its attempt (after step 36)"
                          : "stopped: job cancelled (after step 36)");
  }
  return job;
}

TEST_F(CommandsTest, CancelSaysHowTheRanksStop) {
  client_.get_job = {CancelledTrainJob(4, 0)};
  ASSERT_EQ(*RunCancel(ctx_, {"j-1"}), kExitOk);
  EXPECT_EQ(out_.str(),
            "job j-1 is CANCELLED: its 4 ranks stop after their step and write its checkpoint "
            "(within checkpoint.stop_grace_s 60 s)\n");
  EXPECT_EQ(sleeps_, 0);  // without --wait it does not wait
  // A job with no checkpoint to keep: its ranks are just stopped; none left: nothing to say.
  v1::JobDetail commcheck = CancelledTrainJob(1, 0);
  commcheck.mutable_spec()->set_kind("commcheck");
  client_.get_job = {commcheck};
  out_.str("");
  ASSERT_EQ(*RunCancel(ctx_, {"j-1"}), kExitOk);
  EXPECT_EQ(out_.str(), "job j-1 is CANCELLED: its rank is being stopped\n");
  client_.get_job = {CancelledTrainJob(2, 2)};
  out_.str("");
  ASSERT_EQ(*RunCancel(ctx_, {"j-1"}), kExitOk);
  EXPECT_EQ(out_.str(), "job j-1 is CANCELLED\n");
  // Ranks still starting (never reported running) stop at once.
  v1::JobDetail starting = CancelledTrainJob(3, 0);
  starting.mutable_attempts(0)->mutable_ranks(2)->set_state(v1::RANK_STATE_ASSIGNED);
  client_.get_job = {starting};
  out_.str("");
  ASSERT_EQ(*RunCancel(ctx_, {"j-1"}), kExitOk);
  EXPECT_EQ(out_.str(),
            "job j-1 is CANCELLED: its 2 ranks stop after their step and write its checkpoint "
            "(within checkpoint.stop_grace_s 60 s); its rank still starting stops at once\n");
  // A job cancelled while it recovered: its failed attempt's ranks were stopped before.
  v1::JobDetail recovering = CancelledTrainJob(2, 1);
  recovering.mutable_attempts(0)->set_state(v1::ATTEMPT_STATE_FAILED);
  client_.get_job = {recovering};
  out_.str("");
  ASSERT_EQ(*RunCancel(ctx_, {"j-1"}), kExitOk);
  EXPECT_EQ(out_.str(),
            "job j-1 is CANCELLED: 1 rank of its last attempt, which had ended, still stopping\n");
}

TEST_F(CommandsTest, CancelWaitWaitsForTheRanksAndSaysHowTheyEnded) {
  client_.get_job = {CancelledTrainJob(5, 0), CancelledTrainJob(5, 1),
                     absl::UnavailableError("restarting"), CancelledTrainJob(5, 5)};
  ASSERT_EQ(*RunCancel(ctx_, {"j-1"}, CancelOptions{.wait = true}), kExitOk);
  EXPECT_EQ(client_.get_job_calls, 4);
  EXPECT_EQ(out_.str(),
            "job j-1 is CANCELLED: its 5 ranks stop after their step and write its checkpoint "
            "(within checkpoint.stop_grace_s 60 s)\n"
            "job j-1: how its ranks ended\n"
            "  ranks 0-1, 3-4: stopped: job cancelled (after step 36)\n"
            "  rank 2: stopped: with the peers of its attempt (after step 36)\n");
  // A controller that stays down ends the wait with its error.
  client_.get_job = {CancelledTrainJob(2, 0), absl::UnavailableError("down")};
  EXPECT_TRUE(absl::IsUnavailable(RunCancel(ctx_, {"j-1"}, CancelOptions{.wait = true}).status()));
}

// Several jobs: each is cancelled before any is waited for (none trains on while another's ranks
// stop), and a wait that fails is said on stderr, the others still waited for.
TEST_F(CommandsTest, CancelWaitOfSeveralJobsCancelsThemAllFirst) {
  client_.get_job = {CancelledTrainJob(2, 0), CancelledTrainJob(2, 0),
                     absl::NotFoundError("no job 'j-1'"), CancelledTrainJob(2, 2)};
  const absl::StatusOr<int> code = RunCancel(ctx_, {"j-1", "j-2"}, CancelOptions{.wait = true});
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, kExitJobNotFound);
  EXPECT_EQ(client_.get_job_ids, (std::vector<std::string>{"j-1", "j-2", "j-1", "j-2"}));
  const std::string stop =
      " is CANCELLED: its 2 ranks stop after their step and write its checkpoint (within "
      "checkpoint.stop_grace_s 60 s)\n";
  EXPECT_EQ(out_.str(), "job j-1" + stop + "job j-2" + stop +
                            "job j-2: how its ranks ended\n"
                            "  ranks 0-1: stopped: job cancelled (after step 36)\n");
  EXPECT_EQ(err_.str(), "furnace: job j-1: waiting for its ranks: no job 'j-1'\n");
}

// furnace status: a rank not ended of an attempt that ended is being stopped, not running.
TEST_F(CommandsTest, StatusShowsTheRanksOfAnEndedAttemptAsStopping) {
  client_.get_job = {CancelledTrainJob(2, 1)};
  ASSERT_EQ(*RunStatus(ctx_, "j-1"), kExitOk);
  EXPECT_NE(out_.str().find("  exited       0  stopped: job cancelled"), std::string::npos)
      << out_.str();
  EXPECT_NE(out_.str().find("  stopping     0  -\n"), std::string::npos) << out_.str();
}

// The controller refuses to cancel a job that ended: exit 6 (not 3, an RPC error), its words kept.
TEST_F(CommandsTest, CancelOfAnEndedJobExits6) {
  client_.cancel_status = absl::FailedPreconditionError("job j-1 already ended (succeeded)");
  const absl::StatusOr<int> code = RunCancel(ctx_, {"j-1"});
  ASSERT_FALSE(code.ok());
  EXPECT_EQ(code.status().message(), "job j-1 already ended (succeeded)");
  EXPECT_EQ(ExitCodeForStatus(code.status()), kExitNotApplicable);
}

// Several jobs at once: each is cancelled; one that cannot be is said on stderr and the exit code
// is the first failure's (an ended job: 6; an unknown one: 4).
TEST_F(CommandsTest, CancelOfSeveralJobsGoesOnPastOneThatCannotBe) {
  client_.cancel_errors["j-2"] = absl::FailedPreconditionError("job j-2 already ended (succeeded)");
  const absl::StatusOr<int> code = RunCancel(ctx_, {"j-1", "j-2", "j-3"});
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, kExitNotApplicable);
  EXPECT_EQ(out_.str(), "job j-1 is CANCELLED\njob j-3 is CANCELLED\n");
  EXPECT_EQ(err_.str(), "furnace: job j-2 already ended (succeeded)\n");
  client_.cancel_errors["j-1"] = absl::NotFoundError("no job 'j-1'");
  EXPECT_EQ(*RunCancel(ctx_, {"j-1", "j-2"}), kExitJobNotFound);
  out_.str("");
  ctx_.json = true;
  client_.cancel_errors.clear();
  ASSERT_EQ(*RunCancel(ctx_, {"j-1", "j-3"}), kExitOk);
  EXPECT_NE(out_.str().find("\"job_id\": \"j-3\""), std::string::npos) << out_.str();
}

// `furnace jobs --state`: only the jobs in those states; "active" is every job not ended.
TEST_F(CommandsTest, JobsFiltersByState) {
  for (const auto& [id, state] : std::vector<std::pair<std::string, v1::JobState>>{
           {"a-1", v1::JOB_RUNNING}, {"b-2", v1::JOB_PENDING}, {"c-3", v1::JOB_SUCCEEDED}}) {
    v1::JobSummary* j = client_.jobs.add_jobs();
    j->set_job_id(id);
    j->set_state(state);
  }
  ASSERT_TRUE(RunJobs(ctx_, {"pending"}).ok());
  EXPECT_EQ(out_.str().find("a-1"), std::string::npos) << out_.str();
  EXPECT_NE(out_.str().find("b-2"), std::string::npos) << out_.str();
  out_.str("");
  ASSERT_TRUE(RunJobs(ctx_, {"active"}).ok());
  EXPECT_NE(out_.str().find("a-1"), std::string::npos) << out_.str();
  EXPECT_NE(out_.str().find("b-2"), std::string::npos) << out_.str();
  EXPECT_EQ(out_.str().find("c-3"), std::string::npos) << out_.str();
  out_.str("");
  ASSERT_TRUE(RunJobs(ctx_, {"failed", "cancelled"}).ok());
  EXPECT_EQ(out_.str(), "no jobs in state failed, cancelled\n");
}

}  // namespace
}  // namespace furnace::cli
