// Training telemetry in `status` and `watch`, from fake JobDetails.
#include "controller/cli/train_view.h"

#include <cstdlib>
#include <ctime>
#include <tuple>

#include "controller/cli/format.h"
#include "controller/cli/status_view.h"
#include "controller/cli/watch_view.h"
#include "gtest/gtest.h"
#include "tests/controller/cli/job_fixtures.h"

namespace furnace::cli {
namespace {

using testing::AddComm;
using testing::kT0;
using testing::MakeJob;
using testing::MakeTrainJob;

class TrainViewTest : public ::testing::Test {
 protected:
  void SetUp() override {
    setenv("TZ", "UTC", 1);
    tzset();
  }
};

TEST_F(TrainViewTest, ParsesScalarsAndPerLayerRouting) {
  const v1::JobDetail job = MakeTrainJob();
  const std::optional<TrainMetrics> m = TrainMetricsOf(job);
  ASSERT_TRUE(m.has_value());
  EXPECT_DOUBLE_EQ(*m->loss, 2.4512);
  EXPECT_DOUBLE_EQ(*m->entropy_floor, 2.1);
  EXPECT_DOUBLE_EQ(*m->memory_budget_bytes, 64 << 20);
  ASSERT_EQ(m->layers.size(), 2u);
  EXPECT_EQ(m->layers[1].layer, 1);
  EXPECT_DOUBLE_EQ(*m->layers[1].imbalance, 1.12);
  EXPECT_EQ(m->layers[0].tokens_per_expert, (std::vector<double>{700, 500, 400, 448}));
  EXPECT_EQ(m->layers[0].schedule, "deepspeed");
  EXPECT_DOUBLE_EQ(*m->imbalance_max, 1.34);
  // Unknown figures (one process, no checkpoint) are absent, not 0.
  EXPECT_FALSE(m->sync_seconds.has_value());
  EXPECT_FALSE(m->pipeline_in_flight.has_value());
  EXPECT_FALSE(m->checkpoint_seconds.has_value());
  EXPECT_TRUE(m->comm.empty());
  EXPECT_TRUE(m->planner.empty());
  EXPECT_TRUE(m->moe_ops.empty());
}

// status and watch show the job's MFU once the controller has aggregated a step (the dashboard's
// figure), rank 0's own until then.
TEST_F(TrainViewTest, TheJobsMfuReplacesRankZerosOnceAStepIsAggregated) {
  v1::JobDetail job = MakeTrainJob();
  job.mutable_telemetry()->set_mfu(0.10);
  EXPECT_DOUBLE_EQ(*TrainMetricsOf(job)->mfu, 0.10);
  job.set_job_mfu(0.125);
  job.set_job_mfu_step(job.telemetry_step());
  EXPECT_DOUBLE_EQ(*TrainMetricsOf(job)->mfu, 0.125);
  EXPECT_NE(RenderJobStatus(job, kT0 + 65).find("12.5%"), std::string::npos)
      << RenderJobStatus(job, kT0 + 65);
}

// Between attempts nothing trains: the failed attempt's throughput and MFU are not shown as the
// job's (its last loss is, labelled with its step).
TEST_F(TrainViewTest, ARecoveringJobShowsNoThroughputOrMfu) {
  v1::JobDetail job = MakeTrainJob();
  job.set_job_mfu(0.125);
  job.set_job_mfu_step(job.telemetry_step());
  ASSERT_TRUE(TrainMetricsOf(job)->tokens_per_second.has_value());
  job.mutable_summary()->set_state(v1::JOB_RECOVERING);
  const auto m = TrainMetricsOf(job);
  ASSERT_TRUE(m.has_value());
  EXPECT_FALSE(m->tokens_per_second.has_value());
  EXPECT_FALSE(m->mfu.has_value());
  EXPECT_TRUE(m->loss.has_value());
  const std::string status = RenderJobStatus(job, kT0 + 65);
  EXPECT_EQ(status.find("12.5%"), std::string::npos) << status;
  job.mutable_summary()->set_state(v1::JOB_SUCCEEDED);  // ended: its last figures stand
  EXPECT_DOUBLE_EQ(*TrainMetricsOf(job)->mfu, 0.125);
}

TEST_F(TrainViewTest, NotATrainJob) {
  v1::JobDetail job = MakeJob(v1::JOB_RUNNING, 1, 3);
  EXPECT_FALSE(TrainMetricsOf(job).has_value());
  AddComm(&job, "allreduce", 1 << 20, 1.5);  // commcheck results are not training figures
  EXPECT_FALSE(TrainMetricsOf(job).has_value());
}

TEST_F(TrainViewTest, ImbalanceMaxFromLayers) {
  v1::JobDetail job = MakeJob(v1::JOB_RUNNING, 1, 3);
  for (const auto& [layer, imbalance] : {std::pair{0, 1.5}, std::pair{2, 2.25}}) {
    v1::MoeLayerTelemetry* l = job.mutable_telemetry()->add_moe_layers();
    l->set_layer(layer);
    l->set_imbalance(imbalance);
  }
  const auto m = TrainMetricsOf(job);
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(FormatImbalance(*m), "2.25  (layer 0 1.50, layer 2 2.25)");
}

TEST_F(TrainViewTest, Formats) {
  v1::JobDetail job = MakeTrainJob();
  auto m = *TrainMetricsOf(job);
  EXPECT_EQ(FormatLoss(m), "2.4512  (entropy floor 2.1000, gap +16.7%)");
  EXPECT_EQ(FormatActivationMemory(m), "13.4 MiB of 64.0 MiB (21%)");
  EXPECT_EQ(FormatMfu(m), "3.40%");
  m.entropy_floor.reset();
  m.memory_budget_bytes = 0;  // unlimited
  EXPECT_EQ(FormatLoss(m), "2.4512");
  EXPECT_EQ(FormatActivationMemory(m), "13.4 MiB (no budget)");
  m.memory_budget_bytes.reset();
  EXPECT_EQ(FormatActivationMemory(m), "13.4 MiB (no budget)");
  m.mfu = 0.41;
  EXPECT_EQ(FormatMfu(m), "41.0%");
  m = TrainMetrics{};
  EXPECT_EQ(FormatLoss(m), "-");
  EXPECT_EQ(FormatActivationMemory(m), "-");
  EXPECT_EQ(FormatImbalance(m), "-");
  EXPECT_EQ(FormatMfu(m), "-");
}

// resources.time_limit_s: status shows the limit and what is left of it, counted from the first
// attempt's start.
TEST_F(TrainViewTest, StatusShowsWhatIsLeftOfTheTimeLimit) {
  v1::JobDetail job = MakeTrainJob();
  const auto row = [&](double now) {
    const std::string out = RenderJobStatus(job, now);
    const size_t at = out.find("time limit");
    return at == std::string::npos ? std::string() : out.substr(at, out.find('\n', at) - at);
  };
  EXPECT_EQ(row(kT0 + 65), "");  // none
  job.mutable_spec()->mutable_resources()->set_time_limit_s(7200);
  EXPECT_EQ(row(kT0 + 65), "time limit  2h00m  (counted from its first attempt's start)");
  job.add_attempts()->set_started_unix(kT0 + 5);
  job.mutable_summary()->set_deadline_unix(kT0 + 5 + 7200);  // the controller's, when read
  EXPECT_EQ(row(kT0 + 65), "time limit  2h00m  (1h59m left)");
  EXPECT_EQ(row(kT0 + 7300), "time limit  2h00m  (reached)");
  job.mutable_summary()->set_state(v1::JOB_FAILED);
  EXPECT_EQ(row(kT0 + 7300), "time limit  2h00m");
}

TEST_F(TrainViewTest, StatusHasTrainingSectionAndExpertTable) {
  const v1::JobDetail job = MakeTrainJob();
  const std::string out = RenderJobStatus(job, kT0 + 65);
  for (const char* want : {
           "\ntraining\n",
           "  step         50/100\n",
           "  loss         2.4512  (entropy floor 2.1000, gap +16.7%)\n",
           "  aux loss     0.0123\n",
           "  tokens/step  8,192\n",
           "  tokens/s     12.3k\n",
           "  step time    250.0 ms  (fwd+bwd 200.0 ms, optimizer 30.0 ms)\n",
           "  MFU          3.40%\n",
           "  grad norm    1.25\n",
           "  lr           3.00e-04\n",
           "  activations  13.4 MiB of 64.0 MiB (21%)\n",
           "  imbalance    1.34  (layer 0 1.34, layer 1 1.12)\n",
           "  schedule     deepspeed\n",
           "  dropped      12\n",
           "\ntokens per expert (last step)\n"
           "  MOE LAYER  IMBALANCE   E0   E1   E2   E3\n"
           "          0       1.34  700  500  400  448\n"
           "          1       1.12  560  512  500  476\n",
       }) {
    EXPECT_NE(out.find(want), std::string::npos) << "missing:\n" << want << "\nin:\n" << out;
  }
  // One process: no communication, and the planner has not acted.
  EXPECT_EQ(out.find("communication"), std::string::npos) << out;
  EXPECT_EQ(out.find("memory planner"), std::string::npos) << out;
  EXPECT_EQ(out.find("MoE ops"), std::string::npos) << out;
}

// Rank 0's newest figures may be of a later step than the job's progress (the lowest over the
// ranks): they are labelled with their own step, never shown under the progress step.
TEST_F(TrainViewTest, FiguresOfALaterStepThanTheProgressAreLabelledWithIt) {
  v1::JobDetail job = MakeTrainJob();  // progress: step 50/100
  job.set_telemetry_step(54);
  const std::string status = RenderJobStatus(job, kT0 + 65);
  EXPECT_NE(status.find("  step         50/100  (the figures below: rank 0's step 54)\n"),
            std::string::npos)
      << status;
  const std::optional<TrainMetrics> m = TrainMetricsOf(job);
  ASSERT_TRUE(m.has_value());
  const std::vector<std::string> lines = TrainWatchLines(*m);
  ASSERT_FALSE(lines.empty());
  EXPECT_EQ(lines[0].rfind("step 54: loss 2.4512", 0), 0u) << lines[0];
  EXPECT_EQ(TrainPlainSuffix(*m).rfind("  step 54:  loss 2.4512", 0), 0u) << TrainPlainSuffix(*m);

  // Rank 0's newest stored record may be behind the ranks' progress too: labelled alike.
  job.set_telemetry_step(49);
  EXPECT_NE(RenderJobStatus(job, kT0 + 65).find("50/100  (the figures below: rank 0's step 49)"),
            std::string::npos);
  EXPECT_EQ(TrainWatchLines(*TrainMetricsOf(job))[0].rfind("step 49: loss", 0), 0u);

  job.set_telemetry_step(50);  // the same step: no label
  const std::string same = RenderJobStatus(job, kT0 + 65);
  EXPECT_NE(same.find("  step         50/100\n"), std::string::npos) << same;
  EXPECT_EQ(TrainWatchLines(*TrainMetricsOf(job))[0].rfind("loss 2.4512", 0), 0u);
  EXPECT_EQ(TrainPlainSuffix(*TrainMetricsOf(job)).rfind("  loss 2.4512", 0), 0u);
}

TEST_F(TrainViewTest, StatusAndWatchShowTheLatestEvaluation) {
  v1::JobDetail job = MakeTrainJob();
  job.mutable_last_eval()->set_loss(2.3);
  job.mutable_last_eval()->set_perplexity(9.974);
  job.mutable_last_eval()->set_step(40);
  const std::string out = RenderJobStatus(job, kT0 + 65);
  EXPECT_NE(out.find("  eval loss    2.3000  (perplexity 9.97, after step 40)\n"),
            std::string::npos)
      << out;
  const std::optional<TrainMetrics> m = TrainMetricsOf(job);
  ASSERT_TRUE(m.has_value());
  const std::vector<std::string> lines = TrainWatchLines(*m);
  ASSERT_FALSE(lines.empty());
  EXPECT_NE(lines[0].find("eval 2.3000 (ppl 9.97)"), std::string::npos) << lines[0];
  // Without an evaluation nothing is said about one.
  EXPECT_EQ(RenderJobStatus(MakeTrainJob(), kT0 + 65).find("eval loss"), std::string::npos);
}

TEST_F(TrainViewTest, StatusShowsCommunicationPerOpAndGroupAndPlannerBytes) {
  v1::JobDetail job = MakeTrainJob();
  v1::StepTelemetry& t = *job.mutable_telemetry();
  t.set_sync_seconds(0.01);
  t.mutable_memory()->set_pipeline_in_flight(2);
  v1::CommTelemetry* c = t.add_comm();
  c->set_op(v1::COLLECTIVE_OP_ALL_TO_ALL);
  c->set_group(v1::PARALLEL_GROUP_EP);
  c->set_bytes(3 << 20);
  c->set_seconds(0.0125);
  c->set_calls(8);
  c = t.add_comm();
  c->set_op(v1::COLLECTIVE_OP_ALL_REDUCE);
  c->set_group(v1::PARALLEL_GROUP_DP);
  c->set_bytes(1024);
  c->set_seconds(0.002);
  c->set_calls(1);
  v1::PlannerActionBytes* p = t.add_planner();
  p->set_action(v1::PLANNER_ACTION_OFFLOAD);
  p->set_bytes(2048);
  job.mutable_telemetry()->mutable_memory()->set_pipeline_in_flight(1);
  EXPECT_NE(RenderJobStatus(job, kT0 + 65).find("  in flight    1 micro-batch (peak)\n"),
            std::string::npos);
  job.mutable_telemetry()->mutable_memory()->set_pipeline_in_flight(2);
  const std::string out = RenderJobStatus(job, kT0 + 65);
  for (const char* want : {
           "  step time    250.0 ms  (fwd+bwd 200.0 ms, sync 10.0 ms, optimizer 30.0 ms)\n",
           "  in flight    2 micro-batches (peak)\n",
           "\ncommunication (last step, rank 0)\n"
           "  OP          GROUP    BYTES     TIME  CALLS\n"
           "  all_to_all  ep     3.0 MiB  12.5 ms      8\n"
           "  all_reduce  dp     1.0 KiB   2.0 ms      1\n",
           "\nmemory planner (last step, rank 0)\n"
           "  ACTION     BYTES\n"
           "  offload  2.0 KiB\n",
       }) {
    EXPECT_NE(out.find(want), std::string::npos) << "missing:\n" << want << "\nin:\n" << out;
  }
}

// The adaptive planner's decisions, emergency offloads and agreed drops of the step: in `furnace
// watch`'s terminal frame as in its plain lines.
TEST_F(TrainViewTest, WatchShowsThePlannersDecisionsAndEmergencyOffloads) {
  v1::JobDetail job = MakeTrainJob();
  job.mutable_telemetry()->mutable_memory()->set_planner_decisions(12);
  job.mutable_telemetry()->mutable_memory()->set_emergency_offloads(2);
  job.mutable_telemetry()->mutable_memory()->set_late_reloads(5);
  job.mutable_telemetry()->mutable_memory()->set_agreements(4);
  job.mutable_telemetry()->mutable_memory()->set_agreed_drops(6);
  const std::optional<TrainMetrics> m = TrainMetricsOf(job);
  ASSERT_TRUE(m.has_value());
  const std::vector<std::string> lines = TrainWatchLines(*m);
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_NE(lines[1].find("planner 12x  emergency offloads 2  late reloads 5  agreed drops 6"),
            std::string::npos)
      << lines[1];
  EXPECT_NE(TrainPlainSuffix(*m).find("planner 12x  emergency offloads 2  late reloads 5  agreed "
                                      "drops 6"),
            std::string::npos)
      << TrainPlainSuffix(*m);
  // None taken: nothing said (an agreement that dropped nothing, where every rank fits, neither).
  v1::JobDetail agreed_nothing = MakeTrainJob();
  agreed_nothing.mutable_telemetry()->mutable_memory()->set_agreements(2);
  for (const v1::JobDetail& quiet_job : {MakeTrainJob(), agreed_nothing}) {
    const std::optional<TrainMetrics> quiet = TrainMetricsOf(quiet_job);
    ASSERT_TRUE(quiet.has_value());
    for (const std::string& line : TrainWatchLines(*quiet)) {
      EXPECT_EQ(line.find("planner"), std::string::npos) << line;
      EXPECT_EQ(line.find("agreed"), std::string::npos) << line;
    }
    EXPECT_EQ(TrainPlainSuffix(*quiet).find("agreed"), std::string::npos);
  }
}

TEST_F(TrainViewTest, StatusShowsEachLayersScheduleAndTheMoeOps) {
  v1::JobDetail job = MakeTrainJob();
  v1::StepTelemetry& t = *job.mutable_telemetry();
  t.mutable_moe_layers(0)->set_schedule(v1::MOE_LAYER_SCHEDULE_S1);
  t.mutable_moe_layers(1)->set_schedule(v1::MOE_LAYER_SCHEDULE_S2);
  for (const auto& [op, bytes, seconds, calls] :
       {std::tuple{"fused(a2a ep, ag esp)", 3 << 20, 0.0125, 4},
        std::tuple{"fused(a2a ep, ag tp)", 1 << 20, 0.004, 4},
        std::tuple{"counts(ep)", 64, 0.001, 2}}) {
    v1::MoeOpTelemetry* o = t.add_moe_ops();
    o->set_op(op);
    o->set_bytes(bytes);
    o->set_seconds(seconds);
    o->set_calls(calls);
  }
  const TrainMetrics m = *TrainMetricsOf(job);
  EXPECT_EQ(m.layers[0].schedule, "s1");
  EXPECT_EQ(m.layers[1].schedule, "s2");
  ASSERT_EQ(m.moe_ops.size(), 3u);
  EXPECT_EQ(m.moe_ops[1].op, "fused(a2a ep, ag tp)");
  const std::string out = RenderJobStatus(job, kT0 + 65);
  for (const char* want : {
           "  schedule     layer 0 s1, layer 1 s2\n",
           "\nMoE ops (last step, rank 0)\n"
           "  OP                       BYTES     TIME  CALLS\n"
           "  fused(a2a ep, ag esp)  3.0 MiB  12.5 ms      4\n"
           "  fused(a2a ep, ag tp)   1.0 MiB   4.0 ms      4\n"
           "  counts(ep)                64 B   1.0 ms      2\n",
       }) {
    EXPECT_NE(out.find(want), std::string::npos) << "missing:\n" << want << "\nin:\n" << out;
  }
  EXPECT_EQ(WatchFrame(job, kT0 + 65, 0, 0)[3],
            "imbalance 1.34  schedule s1 x1, s2 x1  dropped 12  memory 13.4 MiB of 64.0 MiB (21%)");
  // Every layer on one schedule: named once.
  t.mutable_moe_layers(0)->set_schedule(v1::MOE_LAYER_SCHEDULE_S2);
  EXPECT_NE(RenderJobStatus(job, kT0 + 65).find("  schedule     s2\n"), std::string::npos);
  EXPECT_EQ(WatchFrame(job, kT0 + 65, 0, 0)[3],
            "imbalance 1.34  schedule s2  dropped 12  memory 13.4 MiB of 64.0 MiB (21%)");
  // moe.schedule auto: the choice's reason beside it.
  t.set_moe_schedule_reason("s2: 1.2 ms fwd+bwd vs s1 1.4 ms, deepspeed 2.9 ms");
  EXPECT_NE(RenderJobStatus(job, kT0 + 65)
                .find("  schedule     s2 (auto: s2: 1.2 ms fwd+bwd vs s1 1.4 ms, deepspeed 2.9 "
                      "ms)\n"),
            std::string::npos);
}

TEST_F(TrainViewTest, StatusSummarisesManyExperts) {
  v1::JobDetail job = MakeJob(v1::JOB_RUNNING, 1, 5, 10);
  job.mutable_telemetry()->set_loss(3.0);
  v1::MoeLayerTelemetry* layer = job.mutable_telemetry()->add_moe_layers();
  layer->set_imbalance(2.0);
  for (int e = 0; e < 32; ++e) layer->add_expert_tokens(e == 17 ? 1000 : 100);
  const std::string out = RenderJobStatus(job, kT0 + 65);
  EXPECT_NE(out.find("  MOE LAYER  IMBALANCE  MIN  MEAN    MAX  BUSIEST\n"
                     "          0       2.00  100   128  1,000      E17\n"),
            std::string::npos)
      << out;
  // Figures that are not known (0 in the message) are left out rather than shown as 0.
  EXPECT_EQ(out.find("MFU"), std::string::npos) << out;
  EXPECT_EQ(out.find("activations"), std::string::npos) << out;
}

TEST_F(TrainViewTest, NonTrainStatusHasNoTrainingSection) {
  v1::JobDetail job = MakeJob(v1::JOB_RUNNING, 1, 3);
  AddComm(&job, "allreduce", 1 << 20, 1.5);
  const std::string out = RenderJobStatus(job, kT0 + 65);
  EXPECT_NE(out.find("allreduce"), std::string::npos) << out;
  EXPECT_EQ(out.find("training"), std::string::npos) << out;
}

TEST_F(TrainViewTest, EtaFromObservedRateElseStepTime) {
  const v1::JobDetail job = MakeTrainJob();
  const auto m = TrainMetricsOf(job);
  EXPECT_DOUBLE_EQ(*EstimateEtaSeconds(job.summary(), m, 0), 50 * 0.25);
  EXPECT_DOUBLE_EQ(*EstimateEtaSeconds(job.summary(), m, 2.0), 25.0);  // 50 steps at 2/s
  EXPECT_FALSE(EstimateEtaSeconds(job.summary(), std::nullopt, 0).has_value());
  EXPECT_FALSE(EstimateEtaSeconds(MakeTrainJob(v1::JOB_SUCCEEDED).summary(), m, 2.0).has_value());
  v1::JobSummary unknown_total = job.summary();
  unknown_total.set_total_steps(0);
  EXPECT_FALSE(EstimateEtaSeconds(unknown_total, m, 2.0).has_value());
}

TEST_F(TrainViewTest, WatchFrameShowsTrainingFigures) {
  const v1::JobDetail job = MakeTrainJob();
  const auto lines = WatchFrame(job, kT0 + 65, 0, /*observed_steps_per_second=*/0);
  ASSERT_EQ(lines.size(), 5u);
  EXPECT_EQ(lines[0], "job j-1 tiny (train)  RUNNING  attempt 1  0 restarts");
  EXPECT_EQ(lines[1], "[###############---------------]  50%  step 50/100  elapsed 1m05s  ETA 12s");
  EXPECT_EQ(lines[2],
            "loss 2.4512 (floor 2.1000, gap +16.7%)  aux 0.0123  tokens/s 12.3k  MFU 3.40%");
  EXPECT_EQ(lines[3], "imbalance 1.34  dropped 12  memory 13.4 MiB of 64.0 MiB (21%)");
  EXPECT_EQ(lines[4], "last event: -");
  // A measured rate wins over the last step's time: it includes checkpoints and restarts.
  EXPECT_NE(WatchFrame(job, kT0 + 65, 0, 0.5)[1].find("ETA 1m40s"), std::string::npos);
}

TEST_F(TrainViewTest, WatchFrameOfAFreshTrainJobHasUnknownEta) {
  v1::JobDetail job = MakeJob(v1::JOB_RUNNING, 1, 0, 100);
  job.mutable_telemetry()->set_loss(5.5);
  const auto lines = WatchFrame(job, kT0 + 65, 0, 0);
  EXPECT_NE(lines[1].find("ETA -"), std::string::npos) << lines[1];
  // The losses are always figures; tokens/s and MFU are not known yet (0) and left out.
  EXPECT_EQ(lines[2], "loss 5.5000  aux 0.0000");
}

TEST_F(TrainViewTest, RunningJobPastItsLastStepIsFinishingNotEtaZero) {
  v1::JobDetail job = MakeTrainJob();
  job.mutable_summary()->set_step(100);
  const auto lines = WatchFrame(job, kT0 + 65, 0, 3.0);
  EXPECT_EQ(lines[1],
            "[##############################] 100%  step 100/100  elapsed 1m05s  finishing");
}

TEST_F(TrainViewTest, FinishedTrainFrameHasNoEtaAndSummaryHasLoss) {
  v1::JobDetail job = MakeTrainJob(v1::JOB_SUCCEEDED);
  job.mutable_summary()->set_step(100);
  const auto lines = WatchFrame(job, kT0 + 65, 0, 3.0);
  EXPECT_EQ(lines[1].find("ETA"), std::string::npos) << lines[1];
  EXPECT_EQ(WatchSummary(job, kT0 + 1000),
            "job j-1 SUCCEEDED after 1m05s (attempt 1, 0 restarts), step 100/100, loss 2.4512");
}

TEST_F(TrainViewTest, WatchFrameOfCommcheckIsUnchanged) {
  v1::JobDetail job = MakeJob(v1::JOB_RUNNING, 1, 3);
  AddComm(&job, "allreduce", 1 << 20, 1.5);
  const auto lines = WatchFrame(job, kT0 + 65, 0, 2.0);
  EXPECT_EQ(lines[1], "[#########---------------------]  30%  step 3/10  elapsed 1m05s");
}

TEST_F(TrainViewTest, PlainLinesCarryLossTokensPerSecondAndMfu) {
  v1::JobDetail first = MakeTrainJob();
  auto lines = PlainWatchLines(nullptr, first);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0],
            "22:14:25 job j-1 RUNNING  attempt 1  0 restarts  step 50/100 (50%)  loss 2.4512  "
            "tokens/s 12.3k  MFU 3.40%  memory 13.4 MiB of 64.0 MiB (21%)");
  // Same step: nothing, even if a figure moved (one line per step, not per poll).
  v1::JobDetail same = first;
  same.mutable_telemetry()->set_loss(2.3);
  EXPECT_TRUE(PlainWatchLines(&first, same).empty());
  v1::JobDetail next = same;
  next.mutable_summary()->set_step(51);
  lines = PlainWatchLines(&same, next);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_NE(lines[0].find("step 51/100 (51%)  loss 2.3000"), std::string::npos) << lines[0];
}

TEST_F(TrainViewTest, PlainLinesShowTheMemoryActionsOfTheStep) {
  v1::JobDetail job = MakeTrainJob();
  for (const auto& [action, bytes] : {std::pair{v1::PLANNER_ACTION_OFFLOAD, uint64_t{3} << 20},
                                      std::pair{v1::PLANNER_ACTION_RECOMPUTE, uint64_t{512}}}) {
    v1::PlannerActionBytes* p = job.mutable_telemetry()->add_planner();
    p->set_action(action);
    p->set_bytes(bytes);
  }
  const auto lines = PlainWatchLines(nullptr, job);
  ASSERT_EQ(lines.size(), 1u);
  // Under a budget, the peak against it first.
  const std::string want = "MFU 3.40%  memory 13.4 MiB of 64.0 MiB (21%), offload " +
                           FormatBytes(uint64_t{3} << 20) + " recompute " + FormatBytes(512);
  EXPECT_NE(lines[0].find(want), std::string::npos) << lines[0];
}

// A routing-spike step says so, and the adaptive planner's decisions and emergency offloads of
// the step follow the bytes it moved.
TEST_F(TrainViewTest, PlainLinesShowSpikesAndThePlannersDecisions) {
  v1::JobDetail job = MakeTrainJob();
  job.mutable_telemetry()->set_routing_spike(true);
  v1::PlannerActionBytes* p = job.mutable_telemetry()->add_planner();
  p->set_action(v1::PLANNER_ACTION_RECOMPUTE);
  p->set_bytes(4096);
  job.mutable_telemetry()->mutable_memory()->set_planner_decisions(3);
  job.mutable_telemetry()->mutable_memory()->set_emergency_offloads(1);
  job.mutable_telemetry()->mutable_memory()->set_late_reloads(2);
  const auto lines = PlainWatchLines(nullptr, job);
  ASSERT_EQ(lines.size(), 1u);
  const std::string want = "MFU 3.40%  spike  memory 13.4 MiB of 64.0 MiB (21%), recompute " +
                           FormatBytes(4096) + "  planner 3x  emergency offloads 1  late reloads 2";
  EXPECT_NE(lines[0].find(want), std::string::npos) << lines[0];

  // The interactive view marks the spike beside the imbalance.
  const TrainMetrics m = TrainMetricsOf(job.telemetry());
  EXPECT_TRUE(m.routing_spike);
  EXPECT_EQ(m.planner_decisions, 3.0);

  // A step without either shows neither.
  v1::JobDetail plain = MakeTrainJob();
  const auto quiet = PlainWatchLines(nullptr, plain);
  ASSERT_EQ(quiet.size(), 1u);
  EXPECT_EQ(quiet[0].find("spike"), std::string::npos) << quiet[0];
  EXPECT_EQ(quiet[0].find("planner"), std::string::npos) << quiet[0];
}

TEST(StepRateTest, MeasuresOverWindowAndRestartsOnNewAttempt) {
  StepRate rate(/*window_s=*/10);
  EXPECT_EQ(rate.steps_per_second(), 0);
  rate.Observe(0, 1, 10);
  EXPECT_EQ(rate.steps_per_second(), 0);
  rate.Observe(1, 1, 10);
  EXPECT_EQ(rate.steps_per_second(), 0);  // no step yet
  rate.Observe(2, 1, 14);
  EXPECT_DOUBLE_EQ(rate.steps_per_second(), 2.0);
  rate.Observe(20, 1, 18);  // the samples before t=10 fall out, but two are always kept
  EXPECT_DOUBLE_EQ(rate.steps_per_second(), 4.0 / 18.0);
  rate.Observe(21, 2, 15);  // restart from a checkpoint: start over
  EXPECT_EQ(rate.steps_per_second(), 0);
  rate.Observe(23, 2, 16);
  EXPECT_DOUBLE_EQ(rate.steps_per_second(), 0.5);
  rate.Observe(24, 2, 12);  // the step went back within the attempt: start over too
  EXPECT_EQ(rate.steps_per_second(), 0);
}

}  // namespace
}  // namespace furnace::cli
