#include "controller/metrics/render_metrics.h"

#include <gtest/gtest.h>

#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "prometheus/check_names.h"
#include "prometheus/text_serializer.h"
#include "tests/controller/metrics/snapshots.h"

namespace furnace::controller::metrics {
namespace {

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

// The metric name of a sample line.
std::string SampleName(const std::string& line) { return line.substr(0, line.find_first_of("{ ")); }

std::vector<std::string> SamplesOf(const std::string& text, const std::string& name) {
  std::vector<std::string> out;
  for (const std::string& line : Lines(text)) {
    if (!line.empty() && line[0] != '#' && SampleName(line) == name) out.push_back(line);
  }
  return out;
}

TEST(RenderMetrics, GoldenSmallSnapshot) {
  const std::string v = kFurnaceVersion;
  EXPECT_EQ(
      RenderMetrics(SmallSnapshot()),
      "# HELP furnace_build_info Always 1; the version label is the furnace-controller "
      "build.\n"
      "# TYPE furnace_build_info gauge\n"
      "furnace_build_info{version=\"" +
          v +
          "\"} 1\n"
          "# HELP furnace_job_state 1 for the state the job is in, 0 for the other seven "
          "states.\n"
          "# TYPE furnace_job_state gauge\n"
          "furnace_job_state{job=\"j-1\",state=\"pending\"} 0\n"
          "furnace_job_state{job=\"j-1\",state=\"scheduled\"} 0\n"
          "furnace_job_state{job=\"j-1\",state=\"starting\"} 0\n"
          "furnace_job_state{job=\"j-1\",state=\"running\"} 1\n"
          "furnace_job_state{job=\"j-1\",state=\"recovering\"} 0\n"
          "furnace_job_state{job=\"j-1\",state=\"succeeded\"} 0\n"
          "furnace_job_state{job=\"j-1\",state=\"failed\"} 0\n"
          "furnace_job_state{job=\"j-1\",state=\"cancelled\"} 0\n"
          "furnace_job_state{job=\"j-2\",state=\"pending\"} 1\n"
          "furnace_job_state{job=\"j-2\",state=\"scheduled\"} 0\n"
          "furnace_job_state{job=\"j-2\",state=\"starting\"} 0\n"
          "furnace_job_state{job=\"j-2\",state=\"running\"} 0\n"
          "furnace_job_state{job=\"j-2\",state=\"recovering\"} 0\n"
          "furnace_job_state{job=\"j-2\",state=\"succeeded\"} 0\n"
          "furnace_job_state{job=\"j-2\",state=\"failed\"} 0\n"
          "furnace_job_state{job=\"j-2\",state=\"cancelled\"} 0\n"
          "# HELP furnace_job_restarts_total Restarts of the job, by the cause of the failed "
          "attempt (its failure kind), over its lifetime: failed attempts that a new attempt "
          "followed or will follow (the failure that ended a job is not one).\n"
          "# TYPE furnace_job_restarts_total counter\n"
          "furnace_job_restarts_total{job=\"j-1\",cause=\"agent_restart\"} 0\n"
          "furnace_job_restarts_total{job=\"j-1\",cause=\"exit\"} 0\n"
          "furnace_job_restarts_total{job=\"j-1\",cause=\"hang\"} 0\n"
          "furnace_job_restarts_total{job=\"j-1\",cause=\"health_check\"} 0\n"
          "furnace_job_restarts_total{job=\"j-1\",cause=\"launch\"} 0\n"
          "furnace_job_restarts_total{job=\"j-1\",cause=\"lost\"} 0\n"
          "furnace_job_restarts_total{job=\"j-1\",cause=\"oom\"} 0\n"
          "furnace_job_restarts_total{job=\"j-1\",cause=\"signal\"} 0\n"
          "furnace_job_restarts_total{job=\"j-1\",cause=\"start_timeout\"} 0\n"
          "furnace_job_restarts_total{job=\"j-1\",cause=\"stopped\"} 0\n"
          "furnace_job_restarts_total{job=\"j-2\",cause=\"agent_restart\"} 0\n"
          "furnace_job_restarts_total{job=\"j-2\",cause=\"exit\"} 0\n"
          "furnace_job_restarts_total{job=\"j-2\",cause=\"hang\"} 0\n"
          "furnace_job_restarts_total{job=\"j-2\",cause=\"health_check\"} 0\n"
          "furnace_job_restarts_total{job=\"j-2\",cause=\"launch\"} 0\n"
          "furnace_job_restarts_total{job=\"j-2\",cause=\"lost\"} 0\n"
          "furnace_job_restarts_total{job=\"j-2\",cause=\"oom\"} 0\n"
          "furnace_job_restarts_total{job=\"j-2\",cause=\"signal\"} 0\n"
          "furnace_job_restarts_total{job=\"j-2\",cause=\"start_timeout\"} 0\n"
          "furnace_job_restarts_total{job=\"j-2\",cause=\"stopped\"} 0\n"
          "# HELP furnace_job_step Training steps completed by every rank of the current "
          "attempt (a restarted attempt keeps the job's step until its ranks have loaded "
          "their checkpoint).\n"
          "# TYPE furnace_job_step gauge\n"
          "furnace_job_step{job=\"j-1\"} 42\n"
          "# HELP furnace_job_total_steps Training steps the job is configured to run.\n"
          "# TYPE furnace_job_total_steps gauge\n"
          "furnace_job_total_steps{job=\"j-1\"} 300\n"
          "# HELP furnace_job_deadline_timestamp_seconds When resources.time_limit_s ends the "
          "job (Unix seconds): its first attempt's start plus the limit. Present while a job "
          "with a limit runs or recovers (from its first attempt's start until it ends).\n"
          "# TYPE furnace_job_deadline_timestamp_seconds gauge\n"
          "furnace_job_deadline_timestamp_seconds{job=\"j-1\"} 1700007200.5\n"
          "# HELP furnace_job_tokens_total Tokens trained by the job, over all ranks and "
          "attempts.\n"
          "# TYPE furnace_job_tokens_total counter\n"
          "furnace_job_tokens_total{job=\"j-1\"} 43008\n"
          "# HELP furnace_job_mfu_ratio Model FLOPs utilization of the last step: model FLOPs "
          "/ (step seconds * peak FLOP/s of all devices), 0..1.\n"
          "# TYPE furnace_job_mfu_ratio gauge\n"
          "furnace_job_mfu_ratio{job=\"j-1\"} 0.375\n"
          "# HELP furnace_job_step_seconds Wall time of the last training step in seconds "
          "(the slowest rank).\n"
          "# TYPE furnace_job_step_seconds gauge\n"
          "furnace_job_step_seconds{job=\"j-1\"} 0.05\n"
          "# HELP furnace_job_tokens_per_second Throughput of the last training step: tokens "
          "over all ranks / step seconds.\n"
          "# TYPE furnace_job_tokens_per_second gauge\n"
          "furnace_job_tokens_per_second{job=\"j-1\"} 20480\n"
          "# HELP furnace_job_loss Language-model loss (cross-entropy, nats per token) of the "
          "last step, mean over ranks.\n"
          "# TYPE furnace_job_loss gauge\n"
          "furnace_job_loss{job=\"j-1\"} 2.5\n"
          "# HELP furnace_job_aux_loss MoE load-balancing auxiliary loss of the last step "
          "(dimensionless), mean over ranks.\n"
          "# TYPE furnace_job_aux_loss gauge\n"
          "furnace_job_aux_loss{job=\"j-1\"} 0.0125\n"
          "# HELP furnace_moe_routing_imbalance_ratio MoE routing imbalance of the last step "
          "per layer: max / mean tokens per expert over all ranks (1 = perfectly balanced).\n"
          "# TYPE furnace_moe_routing_imbalance_ratio gauge\n"
          "furnace_moe_routing_imbalance_ratio{job=\"j-1\",layer=\"0\"} 1\n"
          "# HELP furnace_moe_expert_tokens Tokens routed to each expert in the last step, "
          "summed over ranks.\n"
          "# TYPE furnace_moe_expert_tokens gauge\n"
          "furnace_moe_expert_tokens{job=\"j-1\",layer=\"0\",expert=\"0\"} 100\n"
          "furnace_moe_expert_tokens{job=\"j-1\",layer=\"0\",expert=\"1\"} 110\n"
          "# HELP furnace_moe_schedule_info Always 1; the schedule label is the MoE schedule "
          "(deepspeed, s1, s2) the layer ran in the last step, in each direction (a layer runs "
          "one schedule in both).\n"
          "# TYPE furnace_moe_schedule_info gauge\n"
          "furnace_moe_schedule_info{job=\"j-1\",layer=\"0\",direction=\"forward\","
          "schedule=\"s1\"} 1\n"
          "furnace_moe_schedule_info{job=\"j-1\",layer=\"0\",direction=\"backward\","
          "schedule=\"s1\"} 1\n"
          "# HELP furnace_activation_memory_peak_bytes Peak activation memory of the last step "
          "in bytes (the largest rank).\n"
          "# TYPE furnace_activation_memory_peak_bytes gauge\n"
          "furnace_activation_memory_peak_bytes{job=\"j-1\"} 1048576\n"
          "# HELP furnace_planner_bytes_total Bytes the memory policy moved out of the arena, by "
          "action (offload, compress, recompute), over all steps and ranks.\n"
          "# TYPE furnace_planner_bytes_total counter\n"
          "furnace_planner_bytes_total{job=\"j-1\",action=\"compress\"} 0\n"
          "furnace_planner_bytes_total{job=\"j-1\",action=\"offload\"} 4096\n"
          "furnace_planner_bytes_total{job=\"j-1\",action=\"recompute\"} 0\n"
          "# HELP furnace_planner_decisions_total MoE layers of a micro-batch where the adaptive "
          "memory planner acted (its projected peak would not fit memory.device_budget), over all "
          "steps and ranks.\n"
          "# TYPE furnace_planner_decisions_total counter\n"
          "furnace_planner_decisions_total{job=\"j-1\"} 5\n"
          "# HELP furnace_planner_emergency_offloads_total Allocations the arena refused that the "
          "adaptive planner rescued by moving or dropping tensors nothing running reads, over all "
          "steps and ranks.\n"
          "# TYPE furnace_planner_emergency_offloads_total counter\n"
          "furnace_planner_emergency_offloads_total{job=\"j-1\"} 1\n"
          "# HELP furnace_memory_late_reloads_total Offloaded tensors not back on the device when "
          "their backward needed them (the compute waited), over all steps and ranks.\n"
          "# TYPE furnace_memory_late_reloads_total counter\n"
          "furnace_memory_late_reloads_total{job=\"j-1\"} 2\n"
          "# HELP furnace_planner_agreements_total Micro-batches where the ranks of an "
          "expert-parallel job agreed which expert buffers all of them drop and rebuild together "
          "(the adaptive planner's collective drops), over all steps.\n"
          "# TYPE furnace_planner_agreements_total counter\n"
          "furnace_planner_agreements_total{job=\"j-1\"} 3\n"
          "# HELP furnace_planner_agreed_drops_total Expert buffers dropped by those agreements "
          "(rebuilt in backward by re-running the all-to-all), over all steps and ranks.\n"
          "# TYPE furnace_planner_agreed_drops_total counter\n"
          "furnace_planner_agreed_drops_total{job=\"j-1\"} 8\n"
          "# HELP furnace_planner_agreement_seconds_total Seconds in those agreements' "
          "all-gathers, waiting for the peers included (the slowest rank of each step), over all "
          "steps.\n"
          "# TYPE furnace_planner_agreement_seconds_total counter\n"
          "furnace_planner_agreement_seconds_total{job=\"j-1\"} 0.25\n"
          "# HELP furnace_comm_bytes_total Bytes moved by collectives, by operation, over all "
          "steps and ranks.\n"
          "# TYPE furnace_comm_bytes_total counter\n"
          "furnace_comm_bytes_total{job=\"j-1\",op=\"all_reduce\"} 8192\n"
          "# HELP furnace_moe_op_bytes_total Bytes moved by the MoE schedules' ops, by op and "
          "group (a2a(ep), ag(esp), fused(a2a ep, ag tp), ...), over all steps and ranks.\n"
          "# TYPE furnace_moe_op_bytes_total counter\n"
          "furnace_moe_op_bytes_total{job=\"j-1\",op=\"a2a(ep)\"} 2048\n"
          "# HELP furnace_moe_op_seconds_total Seconds spent in the MoE schedules' ops, by op and "
          "group, over all steps and ranks.\n"
          "# TYPE furnace_moe_op_seconds_total counter\n"
          "furnace_moe_op_seconds_total{job=\"j-1\",op=\"a2a(ep)\"} 0.5\n"
          "# HELP furnace_checkpoint_failures_total Checkpoints the ranks wrote but could not "
          "commit (checkpoint.async: a failed background write, e.g. disk full), since the "
          "controller started; the previous checkpoint stays the newest.\n"
          "# TYPE furnace_checkpoint_failures_total counter\n"
          "furnace_checkpoint_failures_total{job=\"j-1\"} 0\n"
          "# HELP furnace_job_goodput_ratio Productive step time / (productive + lost time), "
          "0..1, over the job's life (controller/store/goodput.h).\n"
          "# TYPE furnace_job_goodput_ratio gauge\n"
          "furnace_job_goodput_ratio{job=\"j-1\"} 0.9\n"
          "# HELP furnace_job_productive_seconds_total Step time of the job's steps, each counted "
          "the first time it is computed.\n"
          "# TYPE furnace_job_productive_seconds_total counter\n"
          "furnace_job_productive_seconds_total{job=\"j-1\"} 90\n"
          "# HELP furnace_job_lost_seconds_total Time the job lost, by cause: restart (end of the "
          "last step before a failure to the next attempt's first step), redone (steps computed "
          "again after a restart), checkpoint_stall, startup (first placement to the first "
          "step).\n"
          "# TYPE furnace_job_lost_seconds_total counter\n"
          "furnace_job_lost_seconds_total{job=\"j-1\",cause=\"restart\"} 4\n"
          "furnace_job_lost_seconds_total{job=\"j-1\",cause=\"redone\"} 2.5\n"
          "furnace_job_lost_seconds_total{job=\"j-1\",cause=\"checkpoint_stall\"} 0.5\n"
          "furnace_job_lost_seconds_total{job=\"j-1\",cause=\"startup\"} 3\n"
          "# HELP furnace_job_redone_steps_total Steps computed again after a restart went back "
          "to a checkpoint.\n"
          "# TYPE furnace_job_redone_steps_total counter\n"
          "furnace_job_redone_steps_total{job=\"j-1\"} 12\n"
          "# HELP furnace_job_mtbf_seconds The job's observed mean time between failures "
          "(running time / failed attempts); the prior while it has had none.\n"
          "# TYPE furnace_job_mtbf_seconds gauge\n"
          "furnace_job_mtbf_seconds{job=\"j-1\"} 86400\n"
          "# HELP furnace_workers Workers registered with the controller, by state.\n"
          "# TYPE furnace_workers gauge\n"
          "furnace_workers{state=\"busy\"} 0\n"
          "furnace_workers{state=\"left\"} 0\n"
          "furnace_workers{state=\"lost\"} 0\n"
          "furnace_workers{state=\"ready\"} 2\n"
          "# HELP furnace_telemetry_dropped_total Telemetry records agents had to drop (queue "
          "full).\n"
          "# TYPE furnace_telemetry_dropped_total counter\n"
          "furnace_telemetry_dropped_total 0\n"
          "# HELP furnace_telemetry_records_total Telemetry records the controller received.\n"
          "# TYPE furnace_telemetry_records_total counter\n"
          "furnace_telemetry_records_total 84\n");
}

TEST(RenderMetrics, EveryFamilyHasHelpAndTypeOnceAndContiguousSamples) {
  const std::string text = RenderMetrics(RichSnapshot());
  std::map<std::string, int> help, type;
  std::map<std::string, std::string> kind;
  std::set<std::string> finished;  // families whose samples have ended
  std::string current;
  for (const std::string& line : Lines(text)) {
    ASSERT_FALSE(line.empty());
    std::istringstream in(line);
    std::string hash, what, name, t;
    if (line.rfind("# HELP ", 0) == 0) {
      in >> hash >> what >> name;
      ++help[name];
      EXPECT_GT(line.size(), 8 + name.size()) << "empty HELP for " << name;
    } else if (line.rfind("# TYPE ", 0) == 0) {
      in >> hash >> what >> name >> t;
      ++type[name];
      kind[name] = t;
      EXPECT_EQ(help[name], 1) << "TYPE before HELP for " << name;
      if (!current.empty()) finished.insert(current);
      current = name;
    } else {
      ASSERT_NE(line[0], '#') << line;
      EXPECT_EQ(SampleName(line), current) << "sample outside its family: " << line;
      EXPECT_EQ(finished.count(SampleName(line)), 0u) << line;
    }
  }
  EXPECT_EQ(help.size(), 40u);  // every family the renderer has
  for (const auto& [name, n] : help) EXPECT_EQ(n, 1) << name;
  for (const auto& [name, n] : type) EXPECT_EQ(n, 1) << name;
  EXPECT_EQ(help.size(), type.size());
  for (const auto& [name, t] : kind) {
    const bool total = name.size() > 6 && name.substr(name.size() - 6) == "_total";
    EXPECT_TRUE(t == "counter" || t == "gauge") << name;
    EXPECT_EQ(t == "counter", total) << name << " is a " << t;
  }
}

TEST(RenderMetrics, JobStateIsOneHotOverAllEightStates) {
  const std::string text = RenderMetrics(RichSnapshot());
  for (const std::string job : {"j-a", "j-b"}) {
    int ones = 0, zeros = 0;
    std::string hot;
    for (const std::string& line : SamplesOf(text, "furnace_job_state")) {
      if (line.find("job=\"" + job + "\"") == std::string::npos) continue;
      if (line.substr(line.size() - 2) == " 1") {
        ++ones;
        hot = line;
      } else if (line.substr(line.size() - 2) == " 0") {
        ++zeros;
      }
    }
    EXPECT_EQ(ones, 1) << job;
    EXPECT_EQ(zeros, 7) << job;
    EXPECT_NE(hot.find(job == "j-a" ? "state=\"running\"" : "state=\"succeeded\""),
              std::string::npos)
        << hot;
  }
  EXPECT_EQ(SamplesOf(text, "furnace_job_state").size(), 3u * 8);
}

// Step series for jobs that trained; the live ones (throughput, MFU, routing, memory) only while
// the job runs: the finished j-b keeps its losses and counters, not a throughput that would add
// to the running jobs' (and a memory gauge an alert would fire on for ever).
TEST(RenderMetrics, StepSeriesOnlyForJobsThatTrainedAndBudgetOnlyWhenSet) {
  const std::string text = RenderMetrics(RichSnapshot());
  EXPECT_EQ(SamplesOf(text, "furnace_job_mfu_ratio").size(), 1u);
  EXPECT_EQ(SamplesOf(text, "furnace_job_tokens_per_second").size(), 1u);
  EXPECT_EQ(SamplesOf(text, "furnace_activation_memory_peak_bytes").size(), 1u);
  EXPECT_EQ(SamplesOf(text, "furnace_job_step").size(), 2u);
  EXPECT_EQ(SamplesOf(text, "furnace_job_tokens_total").size(), 2u);
  EXPECT_EQ(SamplesOf(text, "furnace_moe_routing_imbalance_ratio").size(), 4u);
  EXPECT_EQ(SamplesOf(text, "furnace_moe_expert_tokens").size(), 4u * 8);
  ASSERT_EQ(SamplesOf(text, "furnace_memory_budget_bytes").size(), 1u);
  EXPECT_EQ(SamplesOf(text, "furnace_memory_budget_bytes")[0],
            "furnace_memory_budget_bytes{job=\"j-a\"} 8589934592");
  // prometheus-cpp writes NaN as "Nan" (Prometheus parses floats case-insensitively).
  EXPECT_EQ(SamplesOf(text, "furnace_job_loss")[1], "furnace_job_loss{job=\"j-b\"} Nan");
  // Restarts for every job; the commcheck job's recovery is there without a step.
  EXPECT_EQ(SamplesOf(text, "furnace_job_restarts_total").size(), 10u + 10u + 11u);
  EXPECT_NE(text.find("furnace_job_restarts_total{job=\"j-a\",cause=\"signal\"} 2\n"),
            std::string::npos);
  EXPECT_NE(text.find("furnace_recovery_seconds{job=\"weird \\\"id\\\"\\\\with\\nnewline\"} "
                      "0.75\n"),
            std::string::npos)
      << text;
  EXPECT_EQ(SamplesOf(text, "furnace_checkpoint_stall_seconds"),
            std::vector<std::string>{"furnace_checkpoint_stall_seconds{job=\"j-a\"} 0.25"});
  // Failed commits for every train job, 0 included; none for commcheck.
  EXPECT_EQ(SamplesOf(text, "furnace_checkpoint_failures_total"),
            (std::vector<std::string>{"furnace_checkpoint_failures_total{job=\"j-a\"} 2",
                                      "furnace_checkpoint_failures_total{job=\"j-b\"} 0"}));
  // Counters are doubles in prometheus-cpp (as in Prometheus): 2^64 - 1 is about 1.8e19.
  EXPECT_NE(text.find("furnace_telemetry_records_total 1.844674407370955e+19\n"), std::string::npos)
      << text;
}

// The live gauges (throughput, MFU, routing, memory) are the current attempt's while the job runs:
// none while it recovers or starts again, nor before its new attempt's first step (the failed
// attempt's last step would draw a healthy line through the outage); no MFU where the peak FLOP/s
// is not known (0, which would read as an idle job).
TEST(RenderMetrics, LiveGaugesOnlyWhileTheCurrentAttemptRuns) {
  struct Case {
    furnace::v1::JobState state;
    uint32_t attempt, step_attempt;
    double mfu;
    bool live, with_mfu;
  };
  for (const Case& c : {Case{furnace::v1::JOB_RUNNING, 1, 1, 0.375, true, true},
                        Case{furnace::v1::JOB_RECOVERING, 1, 1, 0.375, false, false},
                        Case{furnace::v1::JOB_STARTING, 2, 1, 0.375, false, false},
                        Case{furnace::v1::JOB_RUNNING, 2, 1, 0.375, false, false},
                        Case{furnace::v1::JOB_RUNNING, 2, 2, 0.375, true, true},
                        Case{furnace::v1::JOB_RUNNING, 1, 1, 0, true, false}}) {
    MetricsSnapshot snapshot = SmallSnapshot();
    JobMetrics& job = snapshot.jobs[0];
    job.state = c.state;
    job.attempt = c.attempt;
    job.last.set_attempt(c.step_attempt);
    job.last.set_mfu(c.mfu);
    const std::string text = RenderMetrics(snapshot);
    SCOPED_TRACE(text);
    EXPECT_EQ(SamplesOf(text, "furnace_job_mfu_ratio").size(), c.with_mfu ? 1u : 0u);
    for (const char* live :
         {"furnace_job_tokens_per_second", "furnace_job_step_seconds",
          "furnace_moe_routing_imbalance_ratio", "furnace_activation_memory_peak_bytes"}) {
      EXPECT_EQ(SamplesOf(text, live).size(), c.live ? 1u : 0u) << live;
    }
    // What the job reached stays.
    EXPECT_EQ(SamplesOf(text, "furnace_job_loss").size(), 1u);
    EXPECT_EQ(SamplesOf(text, "furnace_job_tokens_total").size(), 1u);
  }
}

TEST(RenderMetrics, EvalLossOnlyForJobsThatEvaluated) {
  MetricsSnapshot snapshot = SmallSnapshot();
  EXPECT_EQ(RenderMetrics(snapshot).find("furnace_job_eval_loss"), std::string::npos);
  furnace::v1::EvalTelemetry eval;
  eval.set_loss(2.25);
  eval.set_step(40);
  snapshot.jobs[0].last_eval = eval;
  const std::string text = RenderMetrics(snapshot);
  EXPECT_EQ(SamplesOf(text, "furnace_job_eval_loss"),
            std::vector<std::string>{"furnace_job_eval_loss{job=\"j-1\"} 2.25"})
      << text;
  EXPECT_NE(text.find("# TYPE furnace_job_eval_loss gauge\n"), std::string::npos);
}

TEST(RenderMetrics, EmptySnapshotStillSaysWhatItIs) {
  const std::string text = RenderMetrics(MetricsSnapshot{});
  EXPECT_EQ(SamplesOf(text, "furnace_build_info").size(), 1u);
  EXPECT_EQ(SamplesOf(text, "furnace_workers").size(), 4u);  // busy, left, lost, ready
  EXPECT_EQ(SamplesOf(text, "furnace_job_state").size(), 0u);
}

// A worker whose agent was stopped cleanly (it said it was leaving) is "left", not "lost": an
// alert on lost workers must not fire on a drain.
TEST(RenderMetrics, WorkersThatLeftAreNotCountedAsLost) {
  MetricsSnapshot snapshot = SmallSnapshot();
  snapshot.workers_by_state[furnace::v1::WORKER_STATE_LOST] = 3;
  snapshot.workers_left = 2;
  const std::string text = RenderMetrics(snapshot);
  EXPECT_EQ(SamplesOf(text, "furnace_workers"),
            (std::vector<std::string>{
                "furnace_workers{state=\"busy\"} 0", "furnace_workers{state=\"left\"} 2",
                "furnace_workers{state=\"lost\"} 1", "furnace_workers{state=\"ready\"} 2"}))
      << text;
}

TEST(CollectMetrics, NamesAndLabelNamesAreValidAndTypesMatchTheSuffix) {
  const std::vector<prometheus::MetricFamily> families = CollectMetrics(RichSnapshot());
  EXPECT_EQ(families.size(), 40u);
  std::set<std::string> names;
  for (const prometheus::MetricFamily& family : families) {
    EXPECT_TRUE(names.insert(family.name).second) << "twice: " << family.name;
    EXPECT_TRUE(prometheus::CheckMetricName(family.name)) << family.name;
    EXPECT_EQ(family.name.rfind("furnace_", 0), 0u) << family.name;
    // The library writes HELP as it is: a backslash or newline would break the exposition.
    EXPECT_FALSE(family.help.empty()) << family.name;
    EXPECT_EQ(family.help.find_first_of("\\\n"), std::string::npos) << family.name;
    const bool total =
        family.name.size() > 6 && family.name.compare(family.name.size() - 6, 6, "_total") == 0;
    EXPECT_EQ(family.type, total ? prometheus::MetricType::Counter : prometheus::MetricType::Gauge)
        << family.name;
    EXPECT_FALSE(family.metric.empty()) << family.name;
    for (const prometheus::ClientMetric& sample : family.metric) {
      EXPECT_EQ(sample.timestamp_ms, 0) << family.name << ": Prometheus stamps the scrape";
      for (const prometheus::ClientMetric::Label& label : sample.label) {
        EXPECT_TRUE(prometheus::CheckLabelName(label.name)) << family.name << " " << label.name;
      }
    }
  }
}

TEST(CollectMetrics, FamiliesWithoutSamplesAreLeftOut) {
  std::vector<std::string> names;
  for (const prometheus::MetricFamily& family : CollectMetrics(MetricsSnapshot{})) {
    names.push_back(family.name);
  }
  EXPECT_EQ(names, (std::vector<std::string>{"furnace_build_info", "furnace_workers",
                                             "furnace_telemetry_dropped_total",
                                             "furnace_telemetry_records_total"}));
}

TEST(CollectMetrics, LabelsKeepTheirOrderAndLayersCountNumerically) {
  MetricsSnapshot snap;
  snap.jobs.push_back(TrainingJob("j", 12, 2));
  std::vector<std::string> layers;
  for (const prometheus::MetricFamily& family : CollectMetrics(snap)) {
    if (family.name != "furnace_moe_routing_imbalance_ratio") continue;
    for (const prometheus::ClientMetric& sample : family.metric) {
      ASSERT_EQ(sample.label.size(), 2u);
      EXPECT_EQ(sample.label[0].name, "job");
      EXPECT_EQ(sample.label[1].name, "layer");
      layers.push_back(sample.label[1].value);
    }
  }
  EXPECT_EQ(layers, (std::vector<std::string>{"0", "1", "2", "3", "4", "5", "6", "7", "8", "9",
                                              "10", "11"}));
}

TEST(RenderMetrics, EveryMoeLayerExportsItsScheduleInBothDirections) {
  const std::string text = RenderMetrics(RichSnapshot());
  const std::vector<std::string> info = SamplesOf(text, "furnace_moe_schedule_info");
  // Job j-a: 4 layers x 2 directions; j-b names no schedule and exports none.
  ASSERT_EQ(info.size(), 8u) << text;
  EXPECT_EQ(info[0],
            "furnace_moe_schedule_info{job=\"j-a\",layer=\"0\",direction=\"forward\","
            "schedule=\"deepspeed\"} 1");
  EXPECT_EQ(info[3],
            "furnace_moe_schedule_info{job=\"j-a\",layer=\"1\",direction=\"backward\","
            "schedule=\"s1\"} 1");
  EXPECT_EQ(info[4],
            "furnace_moe_schedule_info{job=\"j-a\",layer=\"2\",direction=\"forward\","
            "schedule=\"s2\"} 1");
  EXPECT_EQ(SamplesOf(text, "furnace_moe_op_bytes_total"),
            (std::vector<std::string>{
                "furnace_moe_op_bytes_total{job=\"j-a\",op=\"a2a(ep)\"} 650000000",
                "furnace_moe_op_bytes_total{job=\"j-a\",op=\"ag(esp)\"} 4096",
                "furnace_moe_op_bytes_total{job=\"j-a\",op=\"fused(a2a ep, ag tp)\"} 150000000",
            }));
  EXPECT_EQ(SamplesOf(text, "furnace_moe_op_seconds_total"),
            (std::vector<std::string>{
                "furnace_moe_op_seconds_total{job=\"j-a\",op=\"a2a(ep)\"} 2.25",
                "furnace_moe_op_seconds_total{job=\"j-a\",op=\"ag(esp)\"} 0.125",
                "furnace_moe_op_seconds_total{job=\"j-a\",op=\"fused(a2a ep, ag tp)\"} 0.5",
            }));
}

TEST(CollectMetrics, RenderMetricsIsTheLibrarysTextOfTheFamilies) {
  const MetricsSnapshot snap = RichSnapshot();
  EXPECT_EQ(RenderMetrics(snap), prometheus::TextSerializer().Serialize(CollectMetrics(snap)));
}

}  // namespace
}  // namespace furnace::controller::metrics
