// Recovery timing: the rank-side start-up points of each attempt and, for an attempt started by a
// restart, the phases of that recovery (recovery_phases.h), recorded once its first step is done.
#include <algorithm>
#include <functional>

#include "controller/service/job_lifecycle.h"
#include "controller/service/recovery_phases.h"

namespace furnace::controller {
namespace {

namespace v1 = furnace::v1;

// The latest of `get` over the attempt's ranks; 0 until every rank has one.
double Latest(const v1::AttemptInfo& attempt,
              const std::function<double(const v1::RankInfo&)>& get) {
  double latest = 0;
  for (const v1::RankInfo& rank : attempt.ranks()) {
    const double t = get(rank);
    if (t <= 0) return 0;
    latest = std::max(latest, t);
  }
  return latest;
}

}  // namespace

void JobLifecycle::NoteRanksExited(v1::AttemptInfo& attempt) {
  if (attempt.ranks_exited_unix() > 0) return;
  for (const v1::RankInfo& rank : attempt.ranks()) {
    if (rank.state() != v1::RANK_STATE_EXITED) return;
  }
  attempt.set_ranks_exited_unix(clock_.UnixSeconds());
}

bool JobLifecycle::NoteRankTimes(Job& job, const v1::TelemetryRecord& rec) {
  if (rec.attempt() == 0 || rec.attempt() > job.attempts.size()) return false;
  v1::AttemptInfo& attempt = job.attempts[rec.attempt() - 1];
  if (rec.rank() >= static_cast<uint32_t>(attempt.ranks_size())) return false;
  v1::RankInfo& rank = *attempt.mutable_ranks(rec.rank());
  bool changed = false;
  if (rec.has_startup()) {
    rank.set_rendezvous_unix(rec.startup().rendezvous_unix());
    rank.set_setup_unix(rec.startup().setup_unix());
    rank.set_checkpoint_load_unix(rec.startup().checkpoint_load_unix());
    changed = true;
  }
  if (rec.has_train() && rank.first_step_unix() == 0) {
    rank.set_first_step_unix(rec.unix_time());
    changed = true;
  }
  if (!changed) return false;
  attempt.set_rendezvous_unix(Latest(attempt, [](const auto& r) { return r.rendezvous_unix(); }));
  attempt.set_setup_unix(Latest(attempt, [](const auto& r) { return r.setup_unix(); }));
  attempt.set_checkpoint_load_unix(
      Latest(attempt, [](const auto& r) { return r.checkpoint_load_unix(); }));
  attempt.set_first_step_unix(Latest(attempt, [](const auto& r) { return r.first_step_unix(); }));
  if (rec.attempt() >= 2 && !attempt.has_recovery() && attempt.first_step_unix() > 0) {
    if (auto phases = RecoveryPhasesOf(job.attempts[rec.attempt() - 2], attempt)) {
      *attempt.mutable_recovery() = *phases;
      Event(job, "recovered", RecoveryPhasesLine(*phases));
    }
  }
  return true;
}

}  // namespace furnace::controller
