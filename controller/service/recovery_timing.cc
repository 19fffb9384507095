// Recovery timing: the rank-side start-up points of each attempt and, for an attempt started by a
// restart, the phases of that recovery (recovery_phases.h), recorded once its first step is done.
#include <algorithm>

#include "controller/service/job_lifecycle.h"
#include "controller/service/recovery_phases.h"

namespace furnace::controller {
namespace {

namespace v1 = furnace::v1;

using TimeOf = double (*)(const v1::RankInfo&);

// The latest of `get` over the attempt's ranks; 0 until every rank has one. `current` is the
// attempt's value so far (> 0: every rank had one, and only `changed`'s may have moved since);
// `prefix` the ranks known to have one (Job::times_prefix), advanced here. O(1) per call once
// complete, and O(ranks) over the attempt's start before (not O(ranks) per record).
double Latest(const v1::AttemptInfo& attempt, const v1::RankInfo& changed, TimeOf get,
              double current, uint32_t& prefix) {
  if (current > 0) return std::max(current, get(changed));
  const auto n = static_cast<uint32_t>(attempt.ranks_size());
  while (prefix < n && get(attempt.ranks(static_cast<int>(prefix))) > 0) ++prefix;
  if (prefix < n) return 0;
  double latest = 0;
  for (const v1::RankInfo& rank : attempt.ranks()) latest = std::max(latest, get(rank));
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
  if (job.times_prefix_attempt != rec.attempt()) {
    job.times_prefix_attempt = rec.attempt();
    job.times_prefix = {};
  }
  attempt.set_rendezvous_unix(Latest(
      attempt, rank, [](const v1::RankInfo& r) { return r.rendezvous_unix(); },
      attempt.rendezvous_unix(), job.times_prefix[0]));
  attempt.set_setup_unix(Latest(
      attempt, rank, [](const v1::RankInfo& r) { return r.setup_unix(); }, attempt.setup_unix(),
      job.times_prefix[1]));
  attempt.set_checkpoint_load_unix(Latest(
      attempt, rank, [](const v1::RankInfo& r) { return r.checkpoint_load_unix(); },
      attempt.checkpoint_load_unix(), job.times_prefix[2]));
  attempt.set_first_step_unix(Latest(
      attempt, rank, [](const v1::RankInfo& r) { return r.first_step_unix(); },
      attempt.first_step_unix(), job.times_prefix[3]));
  if (rec.attempt() >= 2 && !attempt.has_recovery() && attempt.first_step_unix() > 0) {
    if (auto phases = RecoveryPhasesOf(job.attempts[rec.attempt() - 2], attempt)) {
      *attempt.mutable_recovery() = *phases;
      Event(job, "recovered", RecoveryPhasesLine(*phases));
    }
  }
  return true;
}

}  // namespace furnace::controller
