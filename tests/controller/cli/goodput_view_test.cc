// A job's goodput as `furnace status` and `furnace report` print it (goodput_view.h).
#include "controller/cli/goodput_view.h"

#include <string>

#include "controller/cli/report.h"
#include "controller/cli/status_view.h"
#include "gtest/gtest.h"

namespace furnace::cli {
namespace {

constexpr double kT0 = 1'700'000'000.0;

v1::JobDetail RestartedJob() {
  v1::JobDetail job;
  job.mutable_summary()->set_job_id("j-1");
  job.mutable_summary()->set_kind("train");
  job.mutable_summary()->set_state(v1::JOB_RUNNING);
  job.mutable_summary()->set_submitted_unix(kT0);
  v1::JobGoodput* g = job.mutable_goodput();
  g->set_productive_seconds(90);
  g->set_productive_steps(300);
  g->set_restart_seconds(4);
  g->set_redone_seconds(2.5);
  g->set_redone_steps(12);
  g->set_checkpoint_stall_seconds(0.5);
  g->set_startup_seconds(3);
  g->set_ratio(0.9);
  g->set_failures(2);
  g->set_mtbf_seconds(45);
  g->set_checkpoint_interval_steps(25);
  g->set_checkpoint_interval_seconds(7.5);
  return job;
}

TEST(GoodputView, RowsSayTheRatioAndWhereTheTimeWent) {
  const auto rows = GoodputRows(RestartedJob().goodput());
  std::string text;
  for (const auto& [key, value] : rows) text += key + ": " + value + "\n";
  for (const char* want :
       {"goodput: 90.0%  (productive 1m30s over 300 steps)\n",
        "lost: 10.00 s: restart 4.00 s, redone 2.50 s (12 steps), checkpoint stall 500.0 ms, "
        "start-up 3.00 s\n",
        "failures: 2, MTBF 45.00 s observed\n",
        "interval: checkpoint.every auto: 25 steps (7.50 s)\n"}) {
    EXPECT_NE(text.find(want), std::string::npos) << want << "\n" << text;
  }
  EXPECT_EQ(text.find("recovering"), std::string::npos) << text;
}

TEST(GoodputView, StatusAndReportShowIt) {
  v1::JobDetail job = RestartedJob();
  job.mutable_goodput()->set_recovering_seconds(2);
  const std::string status = RenderJobStatus(job, kT0 + 100);
  EXPECT_NE(status.find("\ngoodput\n  goodput     90.0%"), std::string::npos) << status;
  EXPECT_NE(status.find("  recovering  2.00 s so far"), std::string::npos) << status;
  const std::string summary = RenderSummaryText(job, v1::JobSeries(), ReportSummary());
  EXPECT_NE(summary.find("goodput     90.0%"), std::string::npos) << summary;
  EXPECT_NE(summary.find("failures    2, MTBF 45.00 s observed"), std::string::npos) << summary;
}

TEST(GoodputView, NothingBeforeAnythingWasMeasured) {
  v1::JobDetail job = RestartedJob();
  job.clear_goodput();
  EXPECT_FALSE(HasGoodput(job));
  EXPECT_EQ(RenderGoodputSection(job), "");
  EXPECT_EQ(RenderJobStatus(job, kT0 + 100).find("\ngoodput\n"), std::string::npos);
  // The prior before any failure is said to be one.
  job = RestartedJob();
  job.mutable_goodput()->set_failures(0);
  job.mutable_goodput()->set_mtbf_seconds(86400);
  job.mutable_goodput()->set_mtbf_from_prior(true);
  EXPECT_NE(RenderGoodputSection(job).find("failures  0, MTBF 1d00h (prior: no failure yet)"),
            std::string::npos)
      << RenderGoodputSection(job);
}

}  // namespace
}  // namespace furnace::cli
