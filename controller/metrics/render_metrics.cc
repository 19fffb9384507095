#include "controller/metrics/render_metrics.h"

#include <array>
#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "prometheus/text_serializer.h"
#include "proto/furnace/v1/state_names.h"
#include "proto/furnace/v1/telemetry_labels.h"

#ifndef FURNACE_VERSION
#define FURNACE_VERSION "unknown"
#endif

namespace furnace::controller::metrics {

const char kFurnaceVersion[] = FURNACE_VERSION;

namespace {

using furnace::v1::JobState;
using prometheus::MetricFamily;
using Labels = std::vector<prometheus::ClientMetric::Label>;
constexpr prometheus::MetricType kGauge = prometheus::MetricType::Gauge;
constexpr prometheus::MetricType kCounter = prometheus::MetricType::Counter;

// The families of one scrape in the order they are added.
class Families {
 public:
  // The pointer stays valid while families are added (a deque does not move its elements).
  MetricFamily* Add(std::string name, prometheus::MetricType type, std::string help) {
    MetricFamily& family = families_.emplace_back();
    family.name = std::move(name);
    family.help = std::move(help);
    family.type = type;
    return &family;
  }

  // The families that have samples.
  std::vector<MetricFamily> Take() && {
    std::vector<MetricFamily> out;
    for (MetricFamily& family : families_) {
      if (!family.metric.empty()) out.push_back(std::move(family));
    }
    return out;
  }

 private:
  std::deque<MetricFamily> families_;
};

// One sample; counters and gauges alike carry a double (what Prometheus stores).
void Add(MetricFamily* family, Labels labels, double value) {
  prometheus::ClientMetric& sample = family->metric.emplace_back();
  sample.label = std::move(labels);
  if (family->type == kCounter) {
    sample.counter.value = value;
  } else {
    sample.gauge.value = value;
  }
}

// Failure kinds (AttemptInfo.failure_kind) that count as restarts, exported at 0 before they
// first happen, so that increase() sees the first one: the kinds of a rank's exit
// (controller/service/recovery.cc: FailureKind) and of the controller's own failures
// (start_timeout, agent_restart, health_check). Any other kind in the snapshot is exported as it
// appears.
constexpr std::array<const char*, 10> kRestartCauses = {
    "exit", "signal",  "oom",           "hang",          "launch",
    "lost", "stopped", "start_timeout", "agent_restart", "health_check"};

Labels JobLabel(const JobMetrics& job) { return {{"job", job.job_id}}; }

Labels JobLabelAnd(const JobMetrics& job, const char* key, std::string value) {
  return {{"job", job.job_id}, {key, std::move(value)}};
}

// furnace_recovery_phase_seconds{job,phase}: the phases of each job's last recovery
// (controller/service/recovery_phases.h), in its own family.
void AddRecoveryPhases(Families& x, const MetricsSnapshot& snapshot) {
  MetricFamily* phases =
      x.Add("furnace_recovery_phase_seconds", kGauge,
            "Seconds each phase of the job's last recovery took, from the failure to the first "
            "completed step of the next attempt (detection, teardown, backoff, placement, start, "
            "rendezvous, setup, checkpoint_load, first_step; teardown and backoff overlap) and "
            "their total (phase=\"total\").");
  for (const JobMetrics& job : snapshot.jobs) {
    for (const auto& [phase, seconds] : job.last_recovery_phases) {
      Add(phases, JobLabelAnd(job, "phase", phase), seconds);
    }
  }
}

}  // namespace

std::vector<MetricFamily> CollectMetrics(const MetricsSnapshot& snapshot) {
  Families x;
  MetricFamily* build_info = x.Add("furnace_build_info", kGauge,
                                   "Always 1; the version label is the furnace-controller build.");
  MetricFamily* state = x.Add("furnace_job_state", kGauge,
                              "1 for the state the job is in, 0 for the other seven states.");
  MetricFamily* restarts = x.Add(
      "furnace_job_restarts_total", kCounter,
      "Restarts of the job, by the cause of the failed attempt (its failure kind), over its "
      "lifetime: failed attempts that a new attempt followed or will follow (the failure that "
      "ended a job is not one).");
  MetricFamily* step = x.Add("furnace_job_step", kGauge,
                             "Training steps completed by every rank of the current attempt (a "
                             "restarted attempt keeps the job's step until its ranks have loaded "
                             "their checkpoint).");
  MetricFamily* total_steps =
      x.Add("furnace_job_total_steps", kGauge, "Training steps the job is configured to run.");
  MetricFamily* deadline =
      x.Add("furnace_job_deadline_timestamp_seconds", kGauge,
            "When resources.time_limit_s ends the job (Unix seconds): its first attempt's start "
            "plus the limit. Present while a job with a limit runs or recovers (from its first "
            "attempt's start until it ends).");
  MetricFamily* tokens_total = x.Add("furnace_job_tokens_total", kCounter,
                                     "Tokens trained by the job, over all ranks and attempts.");
  MetricFamily* mfu = x.Add("furnace_job_mfu_ratio", kGauge,
                            "Model FLOPs utilization of the last step: model FLOPs / (step "
                            "seconds * peak FLOP/s of all devices), 0..1.");
  MetricFamily* step_seconds =
      x.Add("furnace_job_step_seconds", kGauge,
            "Wall time of the last training step in seconds (the slowest rank).");
  MetricFamily* tokens_per_second =
      x.Add("furnace_job_tokens_per_second", kGauge,
            "Throughput of the last training step: tokens over all ranks / step seconds.");
  MetricFamily* loss = x.Add("furnace_job_loss", kGauge,
                             "Language-model loss (cross-entropy, nats per token) of the last "
                             "step, mean over ranks.");
  MetricFamily* eval_loss = x.Add("furnace_job_eval_loss", kGauge,
                                  "Held-out loss (cross-entropy, nats per token) of the last "
                                  "evaluation (eval.every), the same on every rank.");
  MetricFamily* aux_loss = x.Add("furnace_job_aux_loss", kGauge,
                                 "MoE load-balancing auxiliary loss of the last step "
                                 "(dimensionless), mean over ranks.");
  MetricFamily* imbalance = x.Add(
      "furnace_moe_routing_imbalance_ratio", kGauge,
      "MoE routing imbalance of the last step per layer: max / mean tokens per expert over all "
      "ranks (1 = perfectly balanced).");
  MetricFamily* expert_tokens =
      x.Add("furnace_moe_expert_tokens", kGauge,
            "Tokens routed to each expert in the last step, summed over ranks.");
  MetricFamily* schedule_info =
      x.Add("furnace_moe_schedule_info", kGauge,
            "Always 1; the schedule label is the MoE schedule (deepspeed, s1, s2) the layer ran in "
            "the last step, in each direction (a layer runs one schedule in both).");
  MetricFamily* act_peak = x.Add("furnace_activation_memory_peak_bytes", kGauge,
                                 "Peak activation memory of the last step in bytes (the "
                                 "largest rank).");
  MetricFamily* budget = x.Add("furnace_memory_budget_bytes", kGauge,
                               "Per-device memory budget in bytes (absent when unlimited).");
  MetricFamily* planner =
      x.Add("furnace_planner_bytes_total", kCounter,
            "Bytes the memory policy moved out of the arena, by action (offload, compress, "
            "recompute), over all steps and ranks.");
  MetricFamily* planner_decisions =
      x.Add("furnace_planner_decisions_total", kCounter,
            "MoE layers of a micro-batch where the adaptive memory planner acted (its projected "
            "peak would not fit memory.device_budget), over all steps and ranks.");
  MetricFamily* emergency_offloads =
      x.Add("furnace_planner_emergency_offloads_total", kCounter,
            "Allocations the arena refused that the adaptive planner rescued by moving or "
            "dropping tensors nothing running reads, over all steps and ranks.");
  MetricFamily* late_reloads =
      x.Add("furnace_memory_late_reloads_total", kCounter,
            "Offloaded tensors not back on the device when their backward needed them (the "
            "compute waited), over all steps and ranks.");
  MetricFamily* agreements =
      x.Add("furnace_planner_agreements_total", kCounter,
            "Micro-batches where the ranks of an expert-parallel job agreed which expert buffers "
            "all of them drop and rebuild together (the adaptive planner's collective drops), "
            "over all steps.");
  MetricFamily* agreed_drops =
      x.Add("furnace_planner_agreed_drops_total", kCounter,
            "Expert buffers dropped by those agreements (rebuilt in backward by re-running the "
            "all-to-all), over all steps and ranks.");
  MetricFamily* agreement_seconds =
      x.Add("furnace_planner_agreement_seconds_total", kCounter,
            "Seconds in those agreements' all-gathers, waiting for the peers included (the "
            "slowest rank of each step), over all steps.");
  MetricFamily* comm = x.Add("furnace_comm_bytes_total", kCounter,
                             "Bytes moved by collectives, by operation, over all steps and ranks.");
  MetricFamily* moe_op_bytes =
      x.Add("furnace_moe_op_bytes_total", kCounter,
            "Bytes moved by the MoE schedules' ops, by op and group (a2a(ep), ag(esp), fused(a2a "
            "ep, ag tp), ...), over all steps and ranks.");
  MetricFamily* moe_op_seconds =
      x.Add("furnace_moe_op_seconds_total", kCounter,
            "Seconds spent in the MoE schedules' ops, by op and group, over all steps and ranks.");
  MetricFamily* checkpoint =
      x.Add("furnace_checkpoint_seconds", kGauge, "Seconds the last checkpoint took.");
  MetricFamily* checkpoint_stall =
      x.Add("furnace_checkpoint_stall_seconds", kGauge,
            "Seconds checkpointing last held a step, slowest rank: the whole write when "
            "synchronous; under checkpoint.async the wait for the snapshot's copy before the "
            "update, the commit, or the wait for a previous write (summed over the job: "
            "furnace_job_lost_seconds_total{cause=\"checkpoint_stall\"}).");
  MetricFamily* checkpoint_failures =
      x.Add("furnace_checkpoint_failures_total", kCounter,
            "Checkpoints the ranks wrote but could not commit (checkpoint.async: a failed "
            "background write, e.g. disk full), since the controller started; the previous "
            "checkpoint stays the newest.");
  MetricFamily* recovery = x.Add("furnace_recovery_seconds", kGauge,
                                 "Seconds the last recovery took: from the failure until every "
                                 "rank of the next attempt was running.");
  MetricFamily* goodput_ratio =
      x.Add("furnace_job_goodput_ratio", kGauge,
            "Productive step time / (productive + lost time), 0..1, over the job's life "
            "(controller/store/goodput.h).");
  MetricFamily* productive =
      x.Add("furnace_job_productive_seconds_total", kCounter,
            "Step time of the job's steps, each counted the first time it is computed.");
  MetricFamily* lost = x.Add(
      "furnace_job_lost_seconds_total", kCounter,
      "Time the job lost, by cause: restart (end of the last step before a failure to the next "
      "attempt's first step), redone (steps computed again after a restart), checkpoint_stall, "
      "startup (first placement to the first step).");
  MetricFamily* redone_steps = x.Add("furnace_job_redone_steps_total", kCounter,
                                     "Steps computed again after a restart went back to a "
                                     "checkpoint.");
  MetricFamily* mtbf = x.Add("furnace_job_mtbf_seconds", kGauge,
                             "The job's observed mean time between failures (running time / "
                             "failed attempts); the prior while it has had none.");
  MetricFamily* interval_steps =
      x.Add("furnace_checkpoint_interval_steps", kGauge,
            "checkpoint.every auto: the checkpoint interval in force, in steps (Young/Daly).");
  MetricFamily* workers =
      x.Add("furnace_workers", kGauge, "Workers registered with the controller, by state.");
  MetricFamily* dropped = x.Add("furnace_telemetry_dropped_total", kCounter,
                                "Telemetry records agents had to drop (queue full).");
  MetricFamily* records = x.Add("furnace_telemetry_records_total", kCounter,
                                "Telemetry records the controller received.");

  Add(build_info, {{"version", kFurnaceVersion}}, 1.0);

  for (const JobMetrics& job : snapshot.jobs) {
    // Every state of the enum, in its order; the one the job is in is 1.
    for (int s = v1::JobState_MIN + 1; s <= v1::JobState_MAX; ++s) {
      if (!v1::JobState_IsValid(s)) continue;
      const auto js = static_cast<JobState>(s);
      Add(state, JobLabelAnd(job, "state", v1::StateWord(js)), job.state == js ? 1.0 : 0.0);
    }
    std::map<std::string, uint64_t> causes(job.restarts_by_cause);
    for (const char* cause : kRestartCauses) causes.emplace(cause, 0);
    for (const auto& [cause, n] : causes) Add(restarts, JobLabelAnd(job, "cause", cause), n);

    // Durations that exist without a training step too (a recovered commcheck job).
    if (job.last_checkpoint_seconds >= 0) {
      Add(checkpoint, JobLabel(job), job.last_checkpoint_seconds);
    }
    if (job.last_checkpoint_stall_seconds >= 0) {
      Add(checkpoint_stall, JobLabel(job), job.last_checkpoint_stall_seconds);
    }
    if (job.last_recovery_seconds >= 0) Add(recovery, JobLabel(job), job.last_recovery_seconds);
    if (job.deadline_unix > 0) Add(deadline, JobLabel(job), job.deadline_unix);
    if (job.kind == "train") {
      Add(checkpoint_failures, JobLabel(job), static_cast<double>(job.checkpoint_failures_total));
    }

    if (!job.has_step) continue;
    const furnace::v1::JobGoodput& g = job.goodput;
    Add(goodput_ratio, JobLabel(job), g.ratio());
    Add(productive, JobLabel(job), g.productive_seconds());
    const std::pair<const char*, double> lost_by_cause[] = {
        {"restart", g.restart_seconds()},
        {"redone", g.redone_seconds()},
        {"checkpoint_stall", g.checkpoint_stall_seconds()},
        {"startup", g.startup_seconds()}};
    for (const auto& [cause, seconds] : lost_by_cause) {
      Add(lost, JobLabelAnd(job, "cause", cause), seconds);
    }
    Add(redone_steps, JobLabel(job), static_cast<double>(g.redone_steps()));
    Add(mtbf, JobLabel(job), g.mtbf_seconds());
    if (g.checkpoint_interval_steps() > 0) {
      Add(interval_steps, JobLabel(job), g.checkpoint_interval_steps());
    }
    const furnace::v1::StepRecord& last = job.last;
    Add(step, JobLabel(job), job.step);
    Add(total_steps, JobLabel(job), job.total_steps);
    Add(tokens_total, JobLabel(job), job.tokens_total);
    // What the job reached stays (its last losses); what it is doing now only while it does it:
    // a job that ended, is recovering or starting again, or whose new attempt has not finished a
    // step yet has no throughput, MFU, routing or memory. The last step's would draw a healthy
    // line through an outage (and into avg_over_time of the MFU), add to the running jobs' sums
    // and keep a memory alert firing.
    Add(loss, JobLabel(job), last.loss());
    Add(aux_loss, JobLabel(job), last.aux_loss());
    if (job.last_eval) Add(eval_loss, JobLabel(job), job.last_eval->loss());
    // A train job exports every action that moves bytes at 0 before its first, so that increase()
    // sees the first offload of a job (as the restart causes above).
    std::map<std::string, double> planner_bytes(job.planner_bytes_total);
    if (job.kind == "train") {
      for (v1::PlannerAction action : {v1::PLANNER_ACTION_OFFLOAD, v1::PLANNER_ACTION_COMPRESS,
                                       v1::PLANNER_ACTION_RECOMPUTE}) {
        planner_bytes.emplace(v1::PlannerActionLabel(action), 0.0);
      }
    }
    for (const auto& [action, bytes] : planner_bytes) {
      Add(planner, JobLabelAnd(job, "action", action), bytes);
    }
    if (job.kind == "train") {
      Add(planner_decisions, JobLabel(job), job.planner_decisions_total);
      Add(emergency_offloads, JobLabel(job), job.emergency_offloads_total);
      Add(late_reloads, JobLabel(job), job.late_reloads_total);
      Add(agreements, JobLabel(job), job.agreements_total);
      Add(agreed_drops, JobLabel(job), job.agreed_drops_total);
      Add(agreement_seconds, JobLabel(job), job.agreement_seconds_total);
    }
    for (const auto& [op, bytes] : job.comm_bytes_total) {
      Add(comm, JobLabelAnd(job, "op", op), bytes);
    }
    for (const auto& [op, bytes] : job.moe_op_bytes_total) {
      Add(moe_op_bytes, JobLabelAnd(job, "op", op), bytes);
    }
    for (const auto& [op, seconds] : job.moe_op_seconds_total) {
      Add(moe_op_seconds, JobLabelAnd(job, "op", op), seconds);
    }
    if (job.state != JobState::JOB_RUNNING || last.attempt() != job.attempt) continue;
    if (last.mfu() > 0) Add(mfu, JobLabel(job), last.mfu());  // 0: the peak FLOP/s is not known
    Add(step_seconds, JobLabel(job), last.step_seconds());
    Add(tokens_per_second, JobLabel(job), last.tokens_per_second());
    for (int l = 0; l < last.imbalance_size(); ++l) {
      Add(imbalance, JobLabelAnd(job, "layer", absl::StrCat(l)), last.imbalance(l));
    }
    for (int l = 0; l < last.expert_tokens_size(); ++l) {
      const auto& per_expert = last.expert_tokens(l).tokens();
      for (int e = 0; e < per_expert.size(); ++e) {
        Add(expert_tokens,
            {{"job", job.job_id}, {"layer", absl::StrCat(l)}, {"expert", absl::StrCat(e)}},
            per_expert[e]);
      }
    }
    for (int l = 0; l < last.moe_schedules_size(); ++l) {
      const std::string schedule = v1::MoeLayerScheduleLabel(last.moe_schedules(l));
      for (const char* direction : {"forward", "backward"}) {
        Add(schedule_info,
            {{"job", job.job_id},
             {"layer", absl::StrCat(l)},
             {"direction", direction},
             {"schedule", schedule}},
            1.0);
      }
    }
    Add(act_peak, JobLabel(job), last.activation_peak_bytes());
    if (last.memory_budget_bytes() > 0) Add(budget, JobLabel(job), last.memory_budget_bytes());
  }

  AddRecoveryPhases(x, snapshot);

  std::map<std::string, uint32_t> by_state;
  // Every worker state is exported, at 0 when no worker is in it.
  for (int s = v1::WorkerState_MIN + 1; s <= v1::WorkerState_MAX; ++s) {
    if (v1::WorkerState_IsValid(s))
      by_state.emplace(v1::StateWord(static_cast<v1::WorkerState>(s)), 0);
  }
  for (const auto& [state, n] : snapshot.workers_by_state) by_state[v1::StateWord(state)] += n;
  // A worker stopped cleanly is not a lost one (an alert on lost workers must not fire on a drain).
  const std::string lost_word = v1::StateWord(v1::WORKER_STATE_LOST);
  by_state["left"] = std::min(snapshot.workers_left, by_state[lost_word]);
  by_state[lost_word] -= by_state["left"];
  for (const auto& [s, n] : by_state) Add(workers, {{"state", s}}, n);
  Add(dropped, {}, snapshot.telemetry_dropped_total);
  Add(records, {}, snapshot.telemetry_records_total);
  return std::move(x).Take();
}

std::string RenderMetrics(const MetricsSnapshot& snapshot) {
  return prometheus::TextSerializer().Serialize(CollectMetrics(snapshot));
}

}  // namespace furnace::controller::metrics
