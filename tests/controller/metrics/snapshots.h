// Snapshots the metrics tests render: a small one for the golden text and a rich one that
// exercises every family (for promtool and for the dashboard's metric names).
#pragma once

#include <cmath>
#include <limits>

#include "controller/service/metrics_snapshot.h"

namespace furnace::controller::metrics {

inline JobMetrics TrainingJob(const std::string& id, int layers, int experts) {
  JobMetrics j;
  j.job_id = id;
  j.name = "demo";
  j.kind = "train";
  j.state = furnace::v1::JOB_RUNNING;
  j.attempt = 1;
  j.step = 42;
  j.total_steps = 300;
  j.deadline_unix = 1700007200.5;  // resources.time_limit_s
  j.has_step = true;
  j.tokens_total = 43008;
  auto& s = j.last;
  s.set_attempt(1);
  s.set_step(42);
  s.set_loss(2.5);
  s.set_aux_loss(0.0125);
  s.set_tokens(1024);
  s.set_tokens_per_second(20480);
  s.set_step_seconds(0.05);
  s.set_mfu(0.375);
  s.set_activation_peak_bytes(1048576);
  furnace::v1::JobGoodput& g = j.goodput;
  g.set_productive_seconds(90);
  g.set_restart_seconds(4);
  g.set_redone_seconds(2.5);
  g.set_checkpoint_stall_seconds(0.5);
  g.set_startup_seconds(3);
  g.set_ratio(0.9);
  g.set_redone_steps(12);
  g.set_mtbf_seconds(86400);
  for (int l = 0; l < layers; ++l) {
    s.add_imbalance(1.0 + 0.25 * l);
    auto* et = s.add_expert_tokens();
    for (int e = 0; e < experts; ++e) et->add_tokens(100 + 10 * e + l);
  }
  return j;
}

inline MetricsSnapshot SmallSnapshot() {
  MetricsSnapshot snap;
  snap.unix_time = 1700000000;
  JobMetrics train = TrainingJob("j-1", 1, 2);
  train.planner_bytes_total["offload"] = 4096;
  train.planner_decisions_total = 5;
  train.emergency_offloads_total = 1;
  train.late_reloads_total = 2;
  train.agreements_total = 3;
  train.agreed_drops_total = 8;
  train.agreement_seconds_total = 0.25;
  train.comm_bytes_total["all_reduce"] = 8192;
  train.last.add_moe_schedules(furnace::v1::MOE_LAYER_SCHEDULE_S1);
  train.moe_op_bytes_total["a2a(ep)"] = 2048;
  train.moe_op_seconds_total["a2a(ep)"] = 0.5;
  snap.jobs.push_back(train);
  JobMetrics pending;
  pending.job_id = "j-2";
  pending.kind = "commcheck";
  pending.state = furnace::v1::JOB_PENDING;
  snap.jobs.push_back(pending);
  snap.workers_by_state[furnace::v1::WORKER_STATE_READY] = 2;
  snap.telemetry_records_total = 84;
  return snap;
}

// Every family present, several jobs in different states, restarts, a budget, odd label values.
inline MetricsSnapshot RichSnapshot() {
  MetricsSnapshot snap;
  snap.unix_time = 1700000000.5;
  JobMetrics a = TrainingJob("j-a", 4, 8);
  a.last.set_memory_budget_bytes(8.0 * 1024 * 1024 * 1024);
  a.planner_bytes_total = {{"keep", 1e9}, {"offload", 2.5e8}, {"recompute", 12345}};
  a.comm_bytes_total = {{"all_reduce", 3e9}, {"all_to_all", 7.25e8}};
  for (auto schedule :
       {furnace::v1::MOE_LAYER_SCHEDULE_DEEPSPEED, furnace::v1::MOE_LAYER_SCHEDULE_S1,
        furnace::v1::MOE_LAYER_SCHEDULE_S2, furnace::v1::MOE_LAYER_SCHEDULE_S2}) {
    a.last.add_moe_schedules(schedule);
  }
  a.moe_op_bytes_total = {{"a2a(ep)", 6.5e8}, {"fused(a2a ep, ag tp)", 1.5e8}, {"ag(esp)", 4096}};
  a.moe_op_seconds_total = {{"a2a(ep)", 2.25}, {"fused(a2a ep, ag tp)", 0.5}, {"ag(esp)", 0.125}};
  a.restarts_by_cause = {{"signal", 2}, {"hang", 1}};
  a.last_checkpoint_seconds = 1.25;
  a.last_checkpoint_stall_seconds = 0.25;
  a.checkpoint_failures_total = 2;
  a.last_recovery_seconds = 4.5;
  a.goodput.set_checkpoint_interval_steps(25);
  a.attempt = 4;
  a.last.set_attempt(4);
  snap.jobs.push_back(a);
  JobMetrics b = TrainingJob("j-b", 2, 4);
  b.state = furnace::v1::JOB_SUCCEEDED;
  b.last.set_loss(std::numeric_limits<double>::quiet_NaN());
  b.last.set_mfu(0);
  snap.jobs.push_back(b);
  JobMetrics c;
  c.job_id = "weird \"id\"\\with\nnewline";
  c.kind = "commcheck";
  c.state = furnace::v1::JOB_RECOVERING;
  c.restarts_by_cause = {{"some_new_cause", 1}};
  c.last_recovery_seconds = 0.75;
  snap.jobs.push_back(c);
  snap.workers_by_state = {{furnace::v1::WORKER_STATE_READY, 1},
                           {furnace::v1::WORKER_STATE_BUSY, 3},
                           {furnace::v1::WORKER_STATE_LOST, 1}};
  snap.telemetry_dropped_total = 7;
  snap.telemetry_records_total = 18446744073709551615ull;
  return snap;
}

}  // namespace furnace::controller::metrics
