// The audit log (Controller::SubmitAs / CancelAs / ListAuditEvents), the submission rate limit and
// the input roots as the controller applies them, on a real store in a temporary directory.
#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "runtime/base/path_root.h"
#include "tests/controller/service/controller_on_temp_dir.h"
#include "tests/testing/log_capture.h"

namespace furnace::controller {
namespace {

namespace v1 = furnace::v1;

constexpr const char* kJob = "name: t\nkind: commcheck\nparallel: {dp: 2}\n";

class AuditTest : public ControllerOnTempDir {
 protected:
  // Capacity for the jobs (no worker ever registers: they stay pending).
  void Start(const std::function<void(ControllerOptions&)>& configure = nullptr) {
    StartController("furnace-audit", [&](ControllerOptions& o) {
      o.local_workers = 4;
      if (configure) configure(o);
    });
  }
  v1::ListAuditEventsResponse List(const std::string& job_id = "", uint32_t limit = 0) {
    v1::ListAuditEventsRequest req;
    req.set_job_id(job_id);
    req.set_limit(limit);
    auto resp = c_->ListAuditEvents(req);
    EXPECT_TRUE(resp.ok()) << resp.status();
    return resp.ok() ? *resp : v1::ListAuditEventsResponse();
  }
};

TEST_F(AuditTest, RecordsWhoDidWhatAndTheOutcomeAndSurvivesARestart) {
  Start();
  auto id = c_->SubmitAs("alice", kJob, "t.yaml");
  ASSERT_TRUE(id.ok()) << id.status();
  clock_.Advance(1);
  auto bad = c_->SubmitAs("bob", "name: t\nkind: nope\n", "bad.yaml");
  ASSERT_FALSE(bad.ok());
  clock_.Advance(1);
  ASSERT_TRUE(c_->CancelAs("alice", *id).ok());
  ASSERT_FALSE(c_->CancelAs("bob", "j-nonexistent").ok());

  v1::ListAuditEventsResponse all = List();
  ASSERT_EQ(all.events_size(), 4);
  const v1::AuditEvent& submit = all.events(0);
  EXPECT_EQ(submit.identity(), "alice");
  EXPECT_EQ(submit.action(), "submit");
  EXPECT_EQ(submit.job_id(), *id);
  EXPECT_TRUE(submit.accepted());
  EXPECT_EQ(submit.code(), "OK");
  EXPECT_EQ(submit.detail(), "submitted t.yaml");
  EXPECT_DOUBLE_EQ(submit.unix_time(), clock_.UnixSeconds() - 2);
  const v1::AuditEvent& refused = all.events(1);
  EXPECT_EQ(refused.identity(), "bob");
  EXPECT_FALSE(refused.accepted());
  EXPECT_EQ(refused.code(), "INVALID_ARGUMENT");
  EXPECT_EQ(refused.job_id(), "");
  EXPECT_NE(refused.detail().find("bad.yaml:2:7: kind"), std::string::npos) << refused.detail();
  EXPECT_EQ(all.events(2).action(), "cancel");
  EXPECT_TRUE(all.events(2).accepted());
  EXPECT_EQ(all.events(2).detail(), "now cancelled");
  EXPECT_EQ(all.events(3).code(), "NOT_FOUND");
  EXPECT_LT(all.events(0).id(), all.events(3).id());

  // By job, and the newest N.
  v1::ListAuditEventsResponse of_job = List(*id);
  ASSERT_EQ(of_job.events_size(), 2);
  EXPECT_EQ(of_job.events(0).action(), "submit");
  EXPECT_EQ(of_job.events(1).action(), "cancel");
  v1::ListAuditEventsResponse newest = List("", 1);
  ASSERT_EQ(newest.events_size(), 1);
  EXPECT_EQ(newest.events(0).job_id(), "j-nonexistent");

  // A new controller on the same state dir reads the same log.
  c_.reset();
  ControllerOptions o;
  o.state_dir = dir_.string();
  o.advertise_address = "127.0.0.1:1";
  auto restarted = Controller::Create(o, clock_);
  ASSERT_TRUE(restarted.ok()) << restarted.status();
  c_ = std::move(*restarted);
  v1::ListAuditEventsResponse again = List();
  ASSERT_EQ(again.events_size(), 4);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(again.events(i).SerializeAsString(), all.events(i).SerializeAsString()) << i;
  }
}

TEST_F(AuditTest, SubmissionsOverTheRateAreRefusedAndRecorded) {
  Start([](ControllerOptions& o) {
    o.submit_rate = 1;
    o.submit_burst = 2;
  });
  EXPECT_TRUE(c_->SubmitAs("alice", kJob, "t.yaml").ok());
  EXPECT_TRUE(c_->SubmitAs("alice", kJob, "t.yaml").ok());
  auto third = c_->SubmitAs("alice", kJob, "t.yaml");
  ASSERT_TRUE(absl::IsResourceExhausted(third.status())) << third.status();
  EXPECT_NE(third.status().message().find("retry in 1.0 s"), std::string::npos) << third.status();
  EXPECT_TRUE(c_->SubmitAs("bob", kJob, "t.yaml").ok());  // a bucket of its own
  clock_.Advance(1);
  EXPECT_TRUE(c_->SubmitAs("alice", kJob, "t.yaml").ok());
  v1::ListAuditEventsResponse all = List();
  ASSERT_EQ(all.events_size(), 5);
  EXPECT_EQ(all.events(2).code(), "RESOURCE_EXHAUSTED");
  EXPECT_FALSE(all.events(2).accepted());
  EXPECT_EQ(c_->ListJobs().size(), 4u);  // the refused one left no job
}

TEST_F(AuditTest, RetentionKeepsTheNewestEntries) {
  Start([](ControllerOptions& o) { o.audit_keep = 150; });
  // Refused submissions are recorded too (the rate limit refuses most of them).
  for (int i = 0; i < 300; ++i) {
    (void)c_->SubmitAs("mallory", "name: t\nkind: nope\n", absl::StrCat("f", i, ".yaml"));
  }
  v1::ListAuditEventsResponse all = List("", 10000);
  // Trimmed every Controller::kAuditTrimEvery entries: after the 300th exactly the newest 150.
  ASSERT_EQ(all.events_size(), 150);
  EXPECT_EQ(all.events(149).id() - all.events(0).id(), 149u);
  EXPECT_EQ(all.events(149).id(), 300u);
}

// A submitted file name is the caller's to choose: ESC, CR and LF in it cleared the operator's
// screen and forged a line of the controller's log. Only its printable base name is kept: stored
// with the job, logged, audited and quoted by a refusal.
TEST_F(AuditTest, ASubmittedFileNameCannotForgeALogLine) {
  Start();
  testing_util::LogCapture log;
  const std::string forged =
      "/home/m/\x1b[2J\x1b[32mall good\x1b[0m\r\nFAKE  admin  cancel  job-9  accepted.yaml";
  const std::string kept = "?[2J?[32mall good?[0m??FAKE  admin  cancel  job-9  accepted.yaml";
  auto id = c_->SubmitAs("alice", kJob, forged);
  ASSERT_TRUE(id.ok()) << id.status();
  EXPECT_EQ(List().events(0).detail(), "submitted " + kept);
  auto job = c_->GetJob(*id);
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_GT(job->events_size(), 0);
  EXPECT_EQ(job->events(0).message(), "from " + kept + ", 2 ranks");
  const std::string text = log.Text();
  EXPECT_NE(text.find("[submitted] from " + kept), std::string::npos) << text;
  for (const char c : text) EXPECT_TRUE(c == '\n' || (c >= 0x20 && c != 0x7f)) << int{c};

  auto bad = c_->SubmitAs("alice", "name: t\nkind: nope\n", "dir/\r\nx.yaml");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(std::string(bad.status().message()).rfind("??x.yaml:2:7: kind: ", 0), 0u)
      << bad.status();
  EXPECT_TRUE(c_->SubmitAs("alice", kJob, "configs/").ok());
  EXPECT_EQ(List(/*job_id=*/"", /*limit=*/1).events(0).detail().rfind("submitted <job>", 0), 0u);
}

TEST_F(AuditTest, InvalidBytesInWhatIsRecordedAreReplaced) {
  Start();
  ASSERT_FALSE(c_->SubmitAs("peer\xFF", "name: t\nkind: \xFE\n", "f\xFF.yaml").ok());
  v1::ListAuditEventsResponse all = List();
  ASSERT_EQ(all.events_size(), 1);
  EXPECT_EQ(all.events(0).identity(), "peer?");
  EXPECT_NE(all.events(0).detail().find("f?.yaml: byte 14 (0xfe): not valid UTF-8"),
            std::string::npos)
      << all.events(0).detail();
}

TEST_F(AuditTest, PathsAreResolvedUnderTheRootsAtSubmit) {
  const std::filesystem::path roots =
      std::filesystem::temp_directory_path() / ("furnace-audit-roots-" + std::to_string(getpid()));
  std::filesystem::create_directories(roots / "ckpt");
  const std::string ckpt = *ResolveRoot((roots / "ckpt").string(), "--checkpoint-root");
  Start([&](ControllerOptions& o) { o.checkpoint_root = ckpt; });
  const std::string job = "name: t\nkind: train\ncheckpoint: {dir: run1}\n";
  auto id = c_->SubmitAs("alice", job, "t.yaml");
  ASSERT_TRUE(id.ok()) << id.status();
  auto detail = c_->GetJob(*id);
  ASSERT_TRUE(detail.ok());
  EXPECT_EQ(detail->spec().checkpoint().dir(), ckpt + "/run1");  // what the workers get
  auto escape = c_->SubmitAs("alice", "name: t\nkind: train\ncheckpoint: {dir: ../x}\n", "e.yaml");
  ASSERT_TRUE(absl::IsInvalidArgument(escape.status()));
  EXPECT_NE(
      escape.status().message().find("checkpoint.dir: ../x is outside --checkpoint-root " + ckpt),
      std::string::npos)
      << escape.status();
  std::filesystem::remove_all(roots);
}

// A submission's dry run (JobService.CheckJob) resolves paths under the roots and refuses an
// escape as the submission does, counts against the caller's rate, and is never audited (nothing
// changed), refused or not.
TEST_F(AuditTest, ADryRunIsResolvedUnderTheRootsAndRateLimitedButNotAudited) {
  const std::filesystem::path roots =
      std::filesystem::temp_directory_path() / ("furnace-audit-dry-" + std::to_string(getpid()));
  std::filesystem::create_directories(roots / "ckpt");
  const std::string ckpt = *ResolveRoot((roots / "ckpt").string(), "--checkpoint-root");
  Start([&](ControllerOptions& o) {
    o.checkpoint_root = ckpt;
    o.submit_rate = 1;
    o.submit_burst = 2;
  });
  auto checked =
      c_->CheckSubmitAs("alice", "name: t\nkind: train\ncheckpoint: {dir: run1}\n", "t.yaml");
  ASSERT_TRUE(checked.ok()) << checked.status();
  EXPECT_EQ(checked->spec().checkpoint().dir(), ckpt + "/run1");
  const std::string escape = "name: t\nkind: train\ncheckpoint: {dir: ../x}\n";
  auto dry_escape = c_->CheckSubmitAs("alice", escape, "e.yaml");
  ASSERT_TRUE(absl::IsInvalidArgument(dry_escape.status())) << dry_escape.status();
  auto limited = c_->CheckSubmitAs("alice", kJob, "t.yaml");  // the burst of 2 is spent
  ASSERT_TRUE(absl::IsResourceExhausted(limited.status())) << limited.status();
  EXPECT_TRUE(List().events().empty());
  clock_.Advance(1);
  auto real_escape = c_->SubmitAs("alice", escape, "e.yaml");
  EXPECT_EQ(real_escape.status(), dry_escape.status());
  EXPECT_EQ(List().events_size(), 1);  // the submission's refusal only
  EXPECT_TRUE(c_->ListJobs().empty());
  std::filesystem::remove_all(roots);
}

}  // namespace
}  // namespace furnace::controller
