#include "controller/cli/report.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "controller/cli/commands.h"
#include "controller/cli/exit_codes.h"
#include "gtest/gtest.h"
#include "tests/controller/cli/fake_job_client.h"
#include "tests/controller/cli/job_fixtures.h"
#include "tests/controller/cli/svg_test_util.h"

namespace furnace::cli {
namespace {

namespace fs = std::filesystem;
using testing::Count;
using testing::SeriesPoints;
using testing::XmlProblem;

constexpr double kMiB = 1048576.0;

// Attempt 1 ran steps 1..30 and was killed; attempt 2 resumed from the checkpoint of step 20 and
// ran 21..60: 70 records. Every figure is chosen so its summary statistic is known exactly.
v1::JobSeries MakeSeries() {
  v1::JobSeries series;
  series.set_job_id("j-1");
  series.set_telemetry_dropped(7);
  int index = 0;
  const auto add = [&](uint32_t attempt, uint64_t step) {
    v1::StepRecord* r = series.add_steps();
    r->set_attempt(attempt);
    r->set_step(step);
    r->set_unix_time(testing::kT0 + static_cast<double>(index));
    r->set_loss(4.0 - 0.03 * static_cast<double>(step));
    r->set_tokens(1024);
    r->set_tokens_per_second(index < 10 ? 12800 : 25600);
    r->set_step_seconds(index < 10 ? 0.08 : 0.04);
    r->set_mfu(0.01 * (index % 10 + 1));  // 0.01 .. 0.10, seven of each
    r->set_activation_peak_bytes(attempt == 2 && step == 42 ? 20 * kMiB : 10 * kMiB);
    r->set_memory_budget_bytes(64 * kMiB);
    r->add_imbalance(1.1);
    r->add_imbalance(attempt == 1 && step == 25 ? 1.9 : 1.2);
    if ((attempt == 1 && step == 20) || (attempt == 2 && step == 40)) {
      r->set_checkpoint_seconds(step == 20 ? 0.1 : 0.2);
    }
    if (attempt == 2 && step == 60) r->set_checkpoint_seconds(0.4);
    // Two MoE layers: s1 then s2 in the last step; 1 KiB of a2a(ep) and 512 B of
    // mp_all_gather(tp) per step.
    r->add_moe_schedules(v1::MOE_LAYER_SCHEDULE_S1);
    r->add_moe_schedules(attempt == 2 ? v1::MOE_LAYER_SCHEDULE_S2 : v1::MOE_LAYER_SCHEDULE_S1);
    v1::MoeOpTelemetry* op = r->add_moe_ops();
    op->set_op("a2a(ep)");
    op->set_bytes(1024);
    op = r->add_moe_ops();
    op->set_op("mp_all_gather(tp)");
    op->set_bytes(512);
    r->set_ranks(1);
    ++index;
  };
  for (uint64_t s = 1; s <= 30; ++s) add(1, s);
  for (uint64_t s = 21; s <= 60; ++s) add(2, s);
  return series;
}

v1::JobDetail MakeRestartedJob() {
  v1::JobDetail job = testing::MakeTrainJob(v1::JOB_SUCCEEDED);  // entropy_floor 2.1
  job.mutable_summary()->set_attempt(2);
  job.mutable_summary()->set_restarts(1);
  job.mutable_summary()->set_step(60);
  job.mutable_summary()->set_total_steps(60);
  auto* a1 = job.add_attempts();
  a1->set_attempt(1);
  a1->set_state(v1::ATTEMPT_STATE_FAILED);
  a1->set_cause("rank 0 exited on signal 9");
  a1->set_failure_kind("signal");
  a1->set_ended_unix(testing::kT0 + 100);
  auto* a2 = job.add_attempts();
  a2->set_attempt(2);
  a2->set_state(v1::ATTEMPT_STATE_SUCCEEDED);
  a2->set_all_running_unix(testing::kT0 + 101.5);
  return job;
}

std::string Read(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

class ReportCommandTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ =
        fs::path(::testing::TempDir()) /
        ("report-" + std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    fs::remove_all(dir_);
    client_.get_job.push_back(MakeRestartedJob());
    client_.series = MakeSeries();
    ctx_.client = &client_;
    ctx_.out = &out_;
    ctx_.err = &err_;
  }
  void TearDown() override { fs::remove_all(dir_); }

  fs::path dir_;
  testing::FakeJobClient client_;
  std::ostringstream out_, err_;
  CommandContext ctx_;
};

TEST_F(ReportCommandTest, WritesEveryFileAsWellFormedSvgWithEveryPoint) {
  ReportOptions options;
  options.output = (dir_ / "nested").string();
  auto code = RunReport(ctx_, "j-1", options);
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, kExitOk);
  ASSERT_EQ(client_.series_requests.size(), 1u);
  EXPECT_EQ(client_.series_requests[0].job_id(), "j-1");
  EXPECT_EQ(client_.series_requests[0].max_points(), 0u);  // all points, a page at a time
  EXPECT_GT(client_.series_requests[0].page_size(), 0u);

  const fs::path d = dir_ / "nested";
  for (const char* name : {"loss.svg", "tokens_per_second.svg", "mfu.svg", "step_seconds.svg",
                           "memory.svg", "imbalance_heatmap.svg"}) {
    ASSERT_TRUE(fs::exists(d / name)) << name;
    const std::string svg = Read(d / name);
    EXPECT_EQ(XmlProblem(svg), "") << name;
    EXPECT_EQ(Count(svg, "class=\"marker\""), 1) << name << ": the restart";
    EXPECT_NE(svg.find("restart: attempt 2"), std::string::npos) << name;
    if (std::string(name) != "imbalance_heatmap.svg") {
      EXPECT_EQ(SeriesPoints(svg), 70) << name;
      EXPECT_EQ(Count(svg, "<polyline class=\"series\""), 2) << name << ": one line per attempt";
    }
  }
  const std::string loss = Read(d / "loss.svg");
  EXPECT_EQ(Count(loss, "class=\"reference\""), 1);
  EXPECT_NE(loss.find("entropy floor 2.1000"), std::string::npos);
  EXPECT_NE(loss.find("loss (nats/token)"), std::string::npos);
  const std::string memory = Read(d / "memory.svg");
  EXPECT_EQ(Count(memory, "class=\"reference\""), 1);
  EXPECT_NE(memory.find("budget 64.0 MiB"), std::string::npos);
  // 2 MoE layers x steps 1..60, one column per step.
  const std::string heat = Read(d / "imbalance_heatmap.svg");
  EXPECT_EQ(Count(heat, "class=\"cell\""), 2 * 60);
  EXPECT_NE(heat.find("MoE layer"), std::string::npos);
  EXPECT_TRUE(fs::exists(d / "summary.txt"));
  EXPECT_NE(out_.str().find("imbalance_heatmap.svg"), std::string::npos);
}

// A long job's series comes a page at a time, each page after the last step of the one before
// (across attempts that went back to earlier steps), and the report has every step.
TEST_F(ReportCommandTest, ALongSeriesIsReadAPageAtATime) {
  v1::JobSeries long_series;
  long_series.set_job_id("j-1");
  for (uint32_t attempt : {1u, 2u}) {
    for (uint64_t step = 1; step <= 6000; ++step) {
      v1::StepRecord* r = long_series.add_steps();
      r->set_attempt(attempt);
      r->set_step(attempt == 1 ? step : step + 5000);  // attempt 2 resumed from step 5000
      r->set_loss(2.0);
    }
  }
  client_.series = long_series;
  ReportOptions options;
  options.output = dir_.string();
  auto code = RunReport(ctx_, "j-1", options);
  ASSERT_TRUE(code.ok()) << code.status();
  ASSERT_EQ(client_.series_requests.size(), 3u);
  EXPECT_EQ(client_.series_requests[1].after_attempt(), 1u);
  EXPECT_EQ(client_.series_requests[1].after_step(), 5000u);
  EXPECT_EQ(client_.series_requests[2].after_attempt(), 2u);
  EXPECT_EQ(client_.series_requests[2].after_step(), 9000u);
  EXPECT_NE(out_.str().find("(12000 step records)"), std::string::npos) << out_.str();
}

TEST_F(ReportCommandTest, SummaryNumbers) {
  const ReportSummary m = Summarize(MakeRestartedJob(), MakeSeries());
  EXPECT_EQ(m.records, 70u);
  EXPECT_DOUBLE_EQ(*m.final_loss, 4.0 - 0.03 * 60);
  EXPECT_DOUBLE_EQ(*m.min_loss_step, 60);
  EXPECT_DOUBLE_EQ(*m.median_tokens_per_second, 25600);
  EXPECT_DOUBLE_EQ(*m.median_step_seconds, 0.04);
  EXPECT_NEAR(*m.median_mfu, 0.055, 1e-12);
  EXPECT_NEAR(*m.p10_mfu, 0.019, 1e-12);
  EXPECT_DOUBLE_EQ(*m.max_imbalance, 1.9);
  EXPECT_DOUBLE_EQ(*m.max_imbalance_layer, 1);
  EXPECT_DOUBLE_EQ(*m.max_imbalance_step, 25);
  EXPECT_DOUBLE_EQ(*m.peak_activation_bytes, 20 * kMiB);
  EXPECT_DOUBLE_EQ(*m.memory_budget_bytes, 64 * kMiB);
  EXPECT_EQ(m.checkpoints, 3u);
  EXPECT_DOUBLE_EQ(*m.median_checkpoint_seconds, 0.2);
  EXPECT_DOUBLE_EQ(*m.max_checkpoint_seconds, 0.4);
  ASSERT_EQ(m.recovery_seconds.size(), 1u);
  EXPECT_EQ(m.recovery_seconds[0].first, 2u);
  EXPECT_DOUBLE_EQ(m.recovery_seconds[0].second, 1.5);
  EXPECT_EQ(m.moe_schedules, (std::vector<std::string>{"s1", "s2"}));
  EXPECT_EQ(m.moe_op_bytes, (std::map<std::string, double>{{"a2a(ep)", 70 * 1024},
                                                           {"mp_all_gather(tp)", 70 * 512}}));

  const std::string text = RenderSummaryText(MakeRestartedJob(), MakeSeries(), m);
  for (const char* want :
       {"SUCCEEDED", "2 (1 restart)", "attempt 1: failed, rank 0 exited on signal 9 [signal]",
        "60/60  (70 step records)", "final 2.2000  min 2.2000 (step 60)",
        "entropy floor 2.1000  gap +0.1000 (+4.8%)", "median 25.6k", "median 5.50%  p10 1.90%",
        "median 40.0 ms", "1.900 max (layer 1, step 25)",
        "20.0 MiB activation peak of 64.0 MiB budget (31%)", "3, median 200.0 ms, max 400.0 ms",
        "attempt 2 running 1.50 s", "7 records dropped",
        "schedule     layer 0 s1, layer 1 s2 (last step)\n",
        "MoE ops      a2a(ep) 70.0 KiB (all steps and ranks)\n"
        "             mp_all_gather(tp) 35.0 KiB (all steps and ranks)\n"}) {
    EXPECT_NE(text.find(want), std::string::npos) << want << "\n" << text;
  }
}

// A CPU or emulated job has no peak FLOPs (MFU 0 on every record) and steps without a timing or
// an arena peak: zero is "not known", so no 0.00% median and no flat line at 0 in mfu.svg.
TEST_F(ReportCommandTest, UnknownFiguresAreNotCountedAsZero) {
  v1::JobSeries series = MakeSeries();
  int index = 0;
  for (auto& r : *series.mutable_steps()) {
    r.set_mfu(0);
    r.set_activation_peak_bytes(0);
    if (index++ % 2 == 0) {
      r.set_tokens_per_second(0);
      r.set_step_seconds(0);
    }
  }
  const ReportSummary m = Summarize(MakeRestartedJob(), series);
  EXPECT_FALSE(m.median_mfu.has_value());
  EXPECT_FALSE(m.p10_mfu.has_value());
  EXPECT_FALSE(m.peak_activation_bytes.has_value());
  // Half the records were timed: the 10 at 12800 tokens/s are indices 0..9, 5 of them kept.
  EXPECT_DOUBLE_EQ(*m.median_tokens_per_second, 25600);
  EXPECT_DOUBLE_EQ(*m.median_step_seconds, 0.04);
  const std::string text = RenderSummaryText(MakeRestartedJob(), series, m);
  EXPECT_EQ(text.find("0.00%"), std::string::npos) << text;
  EXPECT_NE(text.find("median -  p10 -"), std::string::npos) << text;

  const fs::path d = dir_ / "unknown";
  ReportOptions options;
  options.output = d.string();
  client_.series = series;
  ASSERT_TRUE(RunReport(ctx_, "j-1", options).ok());
  EXPECT_EQ(SeriesPoints(Read(d / "mfu.svg")), 0) << "no MFU point is known";
}

TEST_F(ReportCommandTest, HeldOutEvaluationsGetARowAndAPlot) {
  v1::JobSeries series = MakeSeries();
  for (auto& r : *series.mutable_steps()) {
    if (r.step() % 10 != 0) continue;
    r.mutable_eval()->set_loss(3.0 - 0.01 * static_cast<double>(r.step()));
    r.mutable_eval()->set_perplexity(std::exp(r.eval().loss()));
  }
  const ReportSummary m = Summarize(MakeRestartedJob(), series);
  EXPECT_EQ(m.evals, 7u);  // steps 10, 20, 30 of attempt 1; 30, 40, 50, 60 of attempt 2
  EXPECT_DOUBLE_EQ(*m.final_eval_loss, 2.4);
  EXPECT_DOUBLE_EQ(*m.min_eval_step, 60);
  const std::string text = RenderSummaryText(MakeRestartedJob(), series, m);
  EXPECT_NE(text.find("eval loss    final 2.4000 (perplexity 11.02, step 60)  min 2.4000 (step "
                      "60)  7 evaluations\n"),
            std::string::npos)
      << text;
  const std::vector<ReportFile> files = BuildReport(MakeRestartedJob(), series);
  const auto eval = std::find_if(files.begin(), files.end(),
                                 [](const ReportFile& f) { return f.name == "eval_loss.svg"; });
  ASSERT_NE(eval, files.end());
  EXPECT_EQ(XmlProblem(eval->content), "");
}

TEST_F(ReportCommandTest, NoFloorNoBudgetNoLines) {
  v1::JobDetail job = MakeRestartedJob();
  job.mutable_telemetry()->clear_entropy_floor();
  v1::JobSeries series = MakeSeries();
  for (auto& r : *series.mutable_steps()) r.set_memory_budget_bytes(0);
  const std::vector<ReportFile> files = BuildReport(job, series);
  ASSERT_EQ(files.size(), 7u);
  EXPECT_EQ(files[0].name, "loss.svg");
  EXPECT_EQ(Count(files[0].content, "class=\"reference\""), 0);
  EXPECT_EQ(files[4].name, "memory.svg");
  EXPECT_EQ(Count(files[4].content, "class=\"reference\""), 0);
  EXPECT_NE(files.back().content.find("(no budget)"), std::string::npos);
}

TEST_F(ReportCommandTest, EmptySeriesStillWritesDocuments) {
  const std::vector<ReportFile> files = BuildReport(MakeRestartedJob(), v1::JobSeries());
  for (const ReportFile& f : files) {
    if (f.name.ends_with(".svg")) {
      EXPECT_EQ(XmlProblem(f.content), "") << f.name;
    }
  }
  EXPECT_NE(files.back().content.find("(0 step records)"), std::string::npos);
}

TEST_F(ReportCommandTest, JsonListsTheFilesAndSummary) {
  ctx_.json = true;
  ReportOptions options;
  options.output = dir_.string();
  ASSERT_TRUE(RunReport(ctx_, "j-1", options).ok());
  const std::string out = out_.str();
  EXPECT_NE(out.find("\"job_id\": \"j-1\""), std::string::npos) << out;
  EXPECT_NE(out.find((dir_ / "loss.svg").string()), std::string::npos);
  EXPECT_NE(out.find("\"max_imbalance\": 1.9"), std::string::npos) << out;
  EXPECT_NE(out.find("\"telemetry_dropped\": 7"), std::string::npos) << out;
  EXPECT_NE(out.find("\"a2a(ep)\": 71680"), std::string::npos) << out;
  EXPECT_NE(out.find("\"s2\""), std::string::npos) << out;
}

// A job with no step records yet gets its files (the summary has its attempts) and a warning
// that the plots are empty.
TEST_F(ReportCommandTest, AJobWithNoStepsIsSaidToHaveEmptyPlots) {
  client_.series = v1::JobSeries();
  ReportOptions options;
  options.output = dir_.string();
  auto code = RunReport(ctx_, "j-1", options);
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_TRUE(fs::exists(dir_ / "summary.txt"));
  EXPECT_NE(err_.str().find("has no step records yet"), std::string::npos) << err_.str();
  EXPECT_NE(err_.str().find("the plots are empty"), std::string::npos) << err_.str();
}

TEST_F(ReportCommandTest, UnknownJobWritesNothing) {
  client_.get_job.clear();
  client_.get_job.push_back(absl::NotFoundError("no job j-9"));
  ReportOptions options;
  options.output = dir_.string();
  auto code = RunReport(ctx_, "j-9", options);
  EXPECT_TRUE(absl::IsNotFound(code.status()));
  EXPECT_EQ(ExitCodeForStatus(code.status()), kExitJobNotFound);
  EXPECT_FALSE(fs::exists(dir_));
}

TEST_F(ReportCommandTest, UnwritableDirectoryIsALocalError) {
  ReportOptions options;
  options.output = "/proc/furnace-report-cannot-exist";
  auto code = RunReport(ctx_, "j-1", options);
  ASSERT_FALSE(code.ok());
  EXPECT_EQ(ExitCodeForStatus(code.status()), kExitLocalError);
}

TEST(QuantileTest, InterpolatesAndIgnoresNonFinite) {
  EXPECT_FALSE(Quantile({}, 0.5));
  EXPECT_DOUBLE_EQ(*Quantile({3, 1, 2}, 0.5), 2);
  EXPECT_DOUBLE_EQ(*Quantile({1, 2, 3, 4}, 0.5), 2.5);
  EXPECT_DOUBLE_EQ(*Quantile({1, 2, NAN}, 1), 2);
}

}  // namespace
}  // namespace furnace::cli
