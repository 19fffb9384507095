#include "controller/store/goodput.h"

#include <algorithm>

namespace furnace::controller {

namespace v1 = furnace::v1;

void GoodputLedger::AddStep(const v1::StepRecord& r) {
  if (has_step_ &&
      (r.attempt() < last_attempt_ || (r.attempt() == last_attempt_ && r.step() <= last_step_))) {
    return;
  }
  const double stall = std::max(0.0, r.checkpoint_stall_seconds());
  const double seconds = std::max(0.0, r.step_seconds());
  const double start = r.unix_time() - stall - seconds;
  if (!has_step_) {
    first_start_unix_ = start;
  } else if (r.attempt() != last_attempt_) {
    restart_ += std::max(0.0, start - last_end_unix_);
  }
  has_step_ = true;
  last_attempt_ = r.attempt();
  last_step_ = r.step();
  last_end_unix_ = std::max(last_end_unix_, r.unix_time());
  if (r.step() <= high_water_) {
    redone_ += seconds;
    ++redone_steps_;
  } else {
    productive_ += seconds;
    ++productive_steps_;
    high_water_ = r.step();
  }
  stall_ += stall;
  if (stall > 0) last_stall_ = stall;
  step_seconds_sum_ += seconds;
  ++steps_;
  if (r.checkpoint_interval_steps() > 0) {
    interval_steps_ = r.checkpoint_interval_steps();
    interval_seconds_ = r.checkpoint_interval_seconds();
  }
}

v1::JobGoodput GoodputLedger::Report(const std::vector<v1::AttemptInfo>& attempts, bool active,
                                     double now_unix) const {
  v1::JobGoodput g;
  g.set_productive_seconds(productive_);
  g.set_redone_seconds(redone_);
  g.set_checkpoint_stall_seconds(stall_);
  g.set_restart_seconds(restart_);
  g.set_productive_steps(productive_steps_);
  g.set_redone_steps(redone_steps_);
  const double placed = attempts.empty() ? 0 : attempts.front().started_unix();
  if (has_step_ && placed > 0) g.set_startup_seconds(std::max(0.0, first_start_unix_ - placed));
  const double lost = redone_ + stall_ + restart_ + g.startup_seconds();
  if (productive_ + lost > 0) g.set_ratio(productive_ / (productive_ + lost));

  const MtbfEstimate mtbf = EstimateMtbf(attempts, now_unix);
  g.set_failures(mtbf.failures);
  g.set_mtbf_seconds(mtbf.seconds);
  g.set_mtbf_from_prior(mtbf.from_prior);
  g.set_mtbf_basis(mtbf.basis);
  g.set_checkpoint_interval_steps(interval_steps_);
  g.set_checkpoint_interval_seconds(interval_seconds_);

  // An interval not closed yet: the job has not stepped at all, or its current attempt has not.
  if (active && !attempts.empty()) {
    if (!has_step_ && placed > 0) {
      g.set_recovering_seconds(std::max(0.0, now_unix - placed));
    } else if (has_step_ && attempts.back().attempt() > last_attempt_) {
      g.set_recovering_seconds(std::max(0.0, now_unix - last_end_unix_));
    }
  }
  return g;
}

namespace {

// Seconds each attempt ran (placement to end, or to now) and whether it failed for a reason
// retrying could meet again (a permanent failure, bad_input, is the job's, not the machines'; so
// is the end at resources.time_limit_s, time_limit).
template <typename Fn>
void ForEachRun(const std::vector<v1::AttemptInfo>& attempts, double now_unix, Fn&& fn) {
  for (const v1::AttemptInfo& a : attempts) {
    if (a.started_unix() <= 0) continue;
    const double end = a.ended_unix() > 0 ? a.ended_unix() : now_unix;
    fn(a, std::max(0.0, end - a.started_unix()),
       a.state() == v1::ATTEMPT_STATE_FAILED && a.failure_kind() != "bad_input" &&
           a.failure_kind() != "time_limit");
  }
}

}  // namespace

void ClusterFailureRate::Add(const std::vector<v1::AttemptInfo>& attempts, double now_unix) {
  ForEachRun(attempts, now_unix, [this](const v1::AttemptInfo& a, double seconds, bool failed) {
    rank_seconds += seconds * std::max(1, a.ranks_size());
    if (failed) ++failures;
  });
}

double ClusterFailureRate::MtbfSeconds(int ranks) const {
  if (failures == 0) return 0;
  return rank_seconds / failures / std::max(1, ranks);
}

MtbfEstimate EstimateMtbf(const std::vector<v1::AttemptInfo>& attempts, double now_unix,
                          const ClusterFailureRate& cluster, int ranks) {
  MtbfEstimate e;
  double running = 0;
  ForEachRun(attempts, now_unix, [&](const v1::AttemptInfo&, double seconds, bool failed) {
    running += seconds;
    if (failed) ++e.failures;
  });
  if (e.failures > 0) {
    e.seconds = running / e.failures;
    e.from_prior = false;
    e.basis = "observed";
  } else if (cluster.failures > 0) {
    e.seconds = cluster.MtbfSeconds(ranks);
    e.basis = "cluster";
  } else {
    e.seconds = std::max(kMtbfPriorSeconds, running);
  }
  return e;
}

v1::CheckpointHint MakeCheckpointHint(const std::vector<v1::AttemptInfo>& attempts,
                                      const GoodputLedger& ledger, double now_unix,
                                      const ClusterFailureRate& cluster, int ranks) {
  const MtbfEstimate mtbf = EstimateMtbf(attempts, now_unix, cluster, ranks);
  v1::CheckpointHint hint;
  hint.set_mtbf_seconds(mtbf.seconds);
  hint.set_mtbf_from_prior(mtbf.from_prior);
  hint.set_mtbf_basis(mtbf.basis);
  hint.set_failures(mtbf.failures);
  hint.set_stall_seconds(ledger.last_stall_seconds());
  hint.set_step_seconds(ledger.mean_step_seconds());
  return hint;
}

v1::JobGoodput ComputeGoodput(const std::vector<v1::AttemptInfo>& attempts,
                              const std::vector<v1::StepRecord>& steps, bool active,
                              double now_unix) {
  GoodputLedger ledger;
  for (const v1::StepRecord& s : steps) ledger.AddStep(s);
  return ledger.Report(attempts, active, now_unix);
}

}  // namespace furnace::controller
