// Goodput: where a training job's wall time went, from what the controller already keeps (the
// aggregated steps, StepRecord, and the attempts, AttemptInfo), and the failure statistics that
// checkpoint.every auto needs (CheckpointHint).
//
// The accounting, step by step in (attempt, step) order (the order the aggregator finishes steps
// and the store returns them):
//   - a step counts as productive (its step_seconds) the first time its number is computed; a step
//     number at or below the highest one computed so far is a redo after a restart went back to a
//     checkpoint, and its step_seconds are lost as "redone". Counting the redo, not the first
//     computation, keeps every total monotonic (the first computation is not known to be wasted
//     until the redo happens), and the two take the same time;
//   - the stall of a checkpoint taken after a step is lost as "checkpoint_stall";
//   - the first step of an attempt after the first closes a "restart": from the end of the newest
//     earlier step (its checkpoint stall included) to the start of this step. That covers the
//     failed step in flight, detection, teardown, backoff, placement, start, rendezvous and the
//     checkpoint load;
//   - the first step of the job closes "startup": from the first attempt's placement to the start
//     of that step (attempts that failed before any step included).
// A step's end is its record's unix_time less its checkpoint stall (ranks report a step after the
// checkpoint that follows it); its start is that end less step_seconds. The small gaps between
// steps of one attempt (telemetry, logging) are not counted anywhere, nor are steps whose telemetry
// was dropped. Totals count closed intervals only; an open restart or start-up is reported apart
// (recovering_seconds).
//
// Durability: the ledger is rebuilt from the stored steps when the controller starts (the
// aggregator feeds it every stored step), and the attempts come from the store, so the numbers
// survive a controller restart unchanged.
// Thread-safety: none; the owner (TelemetryAggregator) is externally synchronised.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "furnace/v1/agent.pb.h"
#include "furnace/v1/controller.pb.h"

namespace furnace::controller {

// The MTBF assumed while a job has seen no failure: one a day (a multi-node job sees one every few
// hours at large scale, a small one far less often). Without a failure the estimate is the larger
// of this and the time the job has run so far.
inline constexpr double kMtbfPriorSeconds = 24 * 3600.0;

class GoodputLedger {
 public:
  // The next aggregated step, in ascending (attempt, step) order; an out-of-order step is ignored.
  void AddStep(const furnace::v1::StepRecord& step);

  // The job's numbers at `now_unix`. `attempts`: the job's attempts, ascending; `active`: the job
  // is not in a final state (only then is an open restart or start-up reported).
  furnace::v1::JobGoodput Report(const std::vector<furnace::v1::AttemptInfo>& attempts, bool active,
                                 double now_unix) const;

  bool has_step() const { return has_step_; }
  double mean_step_seconds() const { return steps_ > 0 ? step_seconds_sum_ / steps_ : 0; }
  double last_stall_seconds() const { return last_stall_; }

 private:
  bool has_step_ = false;
  uint32_t last_attempt_ = 0;
  uint64_t last_step_ = 0;
  uint64_t high_water_ = 0;      // the highest step number computed
  double first_start_unix_ = 0;  // start of the job's first step
  double last_end_unix_ = 0;     // end of the newest step, its checkpoint stall included
  double productive_ = 0, redone_ = 0, stall_ = 0, restart_ = 0;
  uint64_t productive_steps_ = 0, redone_steps_ = 0;
  double step_seconds_sum_ = 0;
  uint64_t steps_ = 0;
  double last_stall_ = 0;  // the newest checkpoint stall measured
  uint32_t interval_steps_ = 0;
  double interval_seconds_ = 0;
};

// The machines' failure rate, seen over the attempts of every job this controller ran: failed
// attempts (permanent failures, bad_input, aside) over the rank-seconds they ran. Failures are the
// machines', not a job's: a job that has not failed yet assumes this rate for its own ranks rather
// than a prior.
struct ClusterFailureRate {
  double rank_seconds = 0;
  uint32_t failures = 0;
  void Add(const std::vector<furnace::v1::AttemptInfo>& attempts, double now_unix);
  // The MTBF of a job of `ranks` ranks at this rate; 0 when no failure was seen.
  double MtbfSeconds(int ranks) const;
};

// Mean time between failures observed over `attempts` at `now_unix`: the attempts' running time
// (placement to end, or to now for a running one) over the failed attempts (permanent failures,
// bad_input, aside). With none: the cluster's rate for `ranks` ranks when it has seen a failure,
// else the larger of kMtbfPriorSeconds and that running time.
struct MtbfEstimate {
  double seconds = kMtbfPriorSeconds;
  bool from_prior = true;       // no failure of this job (basis "cluster" or "prior")
  std::string basis = "prior";  // observed | cluster | prior
  uint32_t failures = 0;
};
MtbfEstimate EstimateMtbf(const std::vector<furnace::v1::AttemptInfo>& attempts, double now_unix,
                          const ClusterFailureRate& cluster = {}, int ranks = 1);

// What a new attempt's ranks get for checkpoint.every auto.
furnace::v1::CheckpointHint MakeCheckpointHint(
    const std::vector<furnace::v1::AttemptInfo>& attempts, const GoodputLedger& ledger,
    double now_unix, const ClusterFailureRate& cluster = {}, int ranks = 1);

// The whole accounting as one pure function: `steps` in ascending (attempt, step) order.
furnace::v1::JobGoodput ComputeGoodput(const std::vector<furnace::v1::AttemptInfo>& attempts,
                                       const std::vector<furnace::v1::StepRecord>& steps,
                                       bool active, double now_unix);

}  // namespace furnace::controller
