// What the controller exposes for monitoring at one instant: plain values derived from its state
// (jobs, attempts, aggregated steps, workers). The Prometheus exposition (controller/metrics) and
// the dashboard render it; neither reaches into the Controller.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "furnace/v1/controller.pb.h"

namespace furnace::controller {

// How long a finished job (succeeded, failed, cancelled) stays in the export after its last
// transition.
inline constexpr double kFinishedJobMetricsS = 24 * 3600;

struct JobMetrics {
  std::string job_id;
  std::string name;
  std::string kind;  // commcheck | train
  furnace::v1::JobState state = furnace::v1::JOB_STATE_UNSPECIFIED;
  uint32_t attempt = 0;
  uint64_t step = 0;  // steps completed (progress)
  uint64_t total_steps = 0;
  double deadline_unix = 0;  // not ended: when resources.time_limit_s ends it; 0: no limit (yet)
  bool has_step = false;     // a training step has been aggregated
  furnace::v1::StepRecord last;                       // the newest aggregated step
  double tokens_total = 0;                            // tokens trained, all attempts (counter)
  std::map<std::string, double> planner_bytes_total;  // by action (counter)
  double planner_decisions_total = 0;   // MoE layers where the adaptive planner acted (counter)
  double emergency_offloads_total = 0;  // allocations the planner rescued (counter)
  double late_reloads_total = 0;        // offloaded tensors back late for backward (counter)
  double agreements_total = 0;          // the ranks' agreements on collective drops (counter)
  double agreed_drops_total = 0;        // expert buffers dropped by them, all ranks (counter)
  double agreement_seconds_total = 0;   // in those agreements, slowest rank per step (counter)
  std::map<std::string, double> comm_bytes_total;      // by collective (counter)
  std::map<std::string, double> moe_op_bytes_total;    // by MoE op, e.g. "a2a(ep)" (counter)
  std::map<std::string, double> moe_op_seconds_total;  // by MoE op (counter)
  std::map<std::string, uint64_t>
      restarts_by_cause;                      // failure_kind -> restarts (failed, then followed)
  double last_checkpoint_seconds = -1;        // < 0: no checkpoint yet
  double last_checkpoint_stall_seconds = -1;  // the step it held, slowest rank; < 0: none yet
  uint64_t checkpoint_failures_total = 0;     // checkpoints not committed (since controller start)
  double last_recovery_seconds = -1;          // failure -> next attempt all running; < 0: none yet
  furnace::v1::JobGoodput goodput;            // where the job's time went (has_step: measured)
  std::optional<furnace::v1::EvalTelemetry>
      last_eval;  // the newest held-out evaluation (eval.every)
  // The last recovery by phase (recovery_phases.h), then ("total", s); empty: none completed yet.
  std::vector<std::pair<std::string, double>> last_recovery_phases;
};

struct MetricsSnapshot {
  double unix_time = 0;
  std::vector<JobMetrics> jobs;
  std::map<furnace::v1::WorkerState, uint32_t> workers_by_state;  // every state but UNSPECIFIED
  // Of the lost ones, those whose agent said it was leaving (stopped cleanly: `furnace workers`
  // shows them as left): exported as state "left", not "lost".
  uint32_t workers_left = 0;
  uint64_t telemetry_dropped_total = 0;  // records agents had to drop
  uint64_t telemetry_records_total = 0;  // records received
};

}  // namespace furnace::controller
