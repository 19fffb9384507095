// Failure detection and recovery: rank reports, workers that go silent or come back, the settle
// window for victim exits, restarts with backoff, and the controller's own shutdown.
//
// The restart ladder, rung by rung:
//  1. A failed attempt is followed by a new one (new rendezvous scope) after the backoff, while
//     recovery.max_restarts lasts.
//  2. Workers: the worker where the root-cause rank failed becomes a suspect, with those of the
//     failures without progress before it (SuspectWorkers, from the stored attempts: a restarted
//     controller keeps them): the next attempt uses spares (free workers neither suspect nor
//     excluded) first and a suspect only when it is needed, and then only through the health
//     check. A worker that failed the health check is
//     excluded: never placed for this job until its agent restarts (registers as a new process)
//     or recovery.exclude_s has passed. One that went silent (lost) is excluded until it
//     registers again (or recovery.exclude_s). The job waits meanwhile, and its "waiting" event
//     says who is out, why and until when.
//  3. Every attempt with more than one rank first runs a health check (worker/health_check.h):
//     each rank marks its arrival in the attempt's rendezvous keys, then runs the commcheck
//     collectives at small sizes, each step bounded by recovery.health_check_s. A rank that fails
//     it exits with RANK_EXIT_HEALTH_CHECK; the controller blames the ranks that never arrived,
//     excludes their workers and restarts after recovery.backoff.initial_s (not the growing
//     backoff). Such a failure does not count against
//     recovery.max_restarts (no training failed, and the culprit is out), but it is an attempt
//     without progress (rung 5), which bounds a run of them. A failed check that names nobody
//     (every rank arrived, then a collective failed) is an ordinary, counted failure.
//  4. Fewer healthy workers than the job's layout: the first recovery.shrink layout that fits.
//     When none fits for recovery.wait_for_workers_s, the job ends FAILED: the layout no longer
//     fits the workers left.
//  5. Give up when retrying cannot help: the restart budget is spent; no progress across
//     recovery.max_attempts_without_progress consecutive attempts (controller/store/
//     progress_rule.h); a permanent error class: invalid input, a corrupt data file, an
//     out-of-memory exit with no memory policy left to escalate to, a layout that no longer
//     fits.
#include <algorithm>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "controller/service/job_lifecycle.h"
#include "controller/store/backoff.h"
#include "controller/store/job_state.h"
#include "controller/store/memory_escalation.h"
#include "controller/store/placement.h"
#include "controller/store/progress_rule.h"
#include "proto/furnace/v1/job_paths.h"
#include "runtime/base/decimal.h"
#include "runtime/base/log_text.h"
#include "runtime/base/status.h"
#include "spdlog/spdlog.h"

namespace furnace::controller {
namespace {

namespace v1 = furnace::v1;

// How long an error exit waits for a root-cause failure of another rank (see Job).
constexpr double kSettleS = 1.0;
// How long a hang inside a collective waits for the report of the rank that hung in its own work:
// the ranks' watchdogs check every min(1 s, hang_timeout_s / 4) from step clocks started within
// milliseconds of each other, so the culprit's report follows a victim's by about a second, plus
// its agent's report.
constexpr double kHangSettleS = 3.0;
// Beyond checkpoint.stop_grace_s, how long the rank of a worker that left is waited for: its
// agent's SIGTERM grace (--shutdown-grace, 10 s by default) and the report's way here.
constexpr double kLeavingDrainMarginS = 15.0;
// A rank silent this long (not even its watchdog's heartbeat, every min(1 s, hang_timeout_s / 4))
// when only its peers' hangs inside a collective are in: frozen (SIGSTOP, every thread deadlocked),
// and they wait for it. Its agent calls it hung only at 1.5 x hang_timeout_s
// (worker/rank_supervisor.h FrozenTimeoutS), after the settle window of its peers' reports.
constexpr double kFrozenEvidenceS = 3.0;
// AttemptInfo.failure_kind of an attempt ended at resources.time_limit_s.
constexpr char kTimeLimitKind[] = "time_limit";

std::string DescribeExit(const v1::RankReport& r) {
  if (!r.reason().empty()) return r.reason();
  switch (r.exit_kind()) {
    case v1::EXIT_KIND_SUCCESS:
      return "exited with code 0";
    case v1::EXIT_KIND_CODE:
      return absl::StrCat("exited with code ", r.exit_code());
    case v1::EXIT_KIND_SIGNAL:
      return absl::StrCat("killed by signal ", r.signal());
    case v1::EXIT_KIND_HANG:
      return "hung";
    case v1::EXIT_KIND_OOM:
      return "out of memory";
    case v1::EXIT_KIND_STOPPED:
      return "stopped";
    case v1::EXIT_KIND_LAUNCH:
      return "could not be started";
    default:
      return "ended";
  }
}

v1::AgentCommand StopCommand(const std::string& job_id, uint32_t attempt, uint32_t rank,
                             double grace_s, const std::string& reason,
                             double checkpoint_grace_s = 0) {
  v1::AgentCommand cmd;
  auto* stop = cmd.mutable_stop();
  stop->set_job_id(job_id);
  stop->set_attempt(attempt);
  stop->set_rank(rank);
  stop->set_grace_s(grace_s);
  stop->set_reason(reason);
  stop->set_checkpoint_grace_s(checkpoint_grace_s);
  return cmd;
}

// The restart cause as a low-cardinality label (furnace_job_restarts_total{cause}).
std::string FailureKind(v1::ExitKind kind) {
  switch (kind) {
    case v1::EXIT_KIND_SIGNAL:
      return "signal";
    case v1::EXIT_KIND_HANG:
      return "hang";
    case v1::EXIT_KIND_OOM:
      return "oom";
    case v1::EXIT_KIND_LAUNCH:
      return "launch";
    case v1::EXIT_KIND_LOST:
      return "lost";
    case v1::EXIT_KIND_STOPPED:
      return "stopped";
    default:
      return "exit";
  }
}

bool AllRanks(const v1::AttemptInfo& attempt, v1::RankState state) {
  return std::all_of(attempt.ranks().begin(), attempt.ranks().end(),
                     [&](const v1::RankInfo& r) { return r.state() == state; });
}

// Whether every rank of the attempt but `rank` has exited (`rank` is the last one running).
bool AllRanksButOneExited(const v1::AttemptInfo& attempt, uint32_t rank) {
  for (int r = 0; r < attempt.ranks_size(); ++r) {
    if (static_cast<uint32_t>(r) != rank && attempt.ranks(r).state() != v1::RANK_STATE_EXITED) {
      return false;
    }
  }
  return true;
}

// AllRanks(attempt, RANK_STATE_RUNNING) for the job's current attempt, amortised O(1) per call
// over a job start (Job::running_prefix).
bool AllRunning(Job& job, const v1::AttemptInfo& attempt) {
  if (job.running_prefix_attempt != attempt.attempt()) {
    job.running_prefix_attempt = attempt.attempt();
    job.running_prefix = 0;
  }
  const uint32_t n = static_cast<uint32_t>(attempt.ranks_size());
  while (job.running_prefix < n &&
         attempt.ranks(static_cast<int>(job.running_prefix)).state() == v1::RANK_STATE_RUNNING) {
    ++job.running_prefix;
  }
  if (job.running_prefix < n) return false;
  if (AllRanks(attempt, v1::RANK_STATE_RUNNING)) return true;
  job.running_prefix = 0;  // one seen running has ended since: scan again up to it
  return false;
}

}  // namespace

void JobLifecycle::NoteWeakFailure(Job& job, const std::string& kind, const std::string& cause,
                                   const std::string& worker, double settle_s) {
  if (job.settle_deadline == 0) {
    job.settle_deadline = clock_.MonotonicSeconds() + settle_s;
    job.pending_frozen_named = false;
    job.pending_kind = kind;
    job.pending_cause = cause;
    job.pending_worker = worker;
    job.pending_interrupted = false;
    job.pending_weak = true;
  }
  // Every rank has ended: no root cause can come any more. (Not persisted, the settle deadline
  // stays and Tick retries.)
  if (AllRanks(*job.current(), v1::RANK_STATE_EXITED)) EndAttempt(job).IgnoreError();
}

bool JobLifecycle::FailLater(Job& job, const std::string& kind, const std::string& cause,
                             const std::string& worker, bool interrupted) {
  // A failure pending already: Tick ends it; unless it is only a victim's, which this root cause
  // (a worker leaving, an agent restarting, whose failure the store could not take now) replaces.
  if (job.settle_deadline > 0 && !job.pending_weak) return false;
  job.pending_weak = false;
  job.pending_frozen_named = false;
  job.settle_deadline = clock_.MonotonicSeconds();
  job.pending_kind = kind;
  job.pending_cause = cause;
  job.pending_worker = worker;
  job.pending_interrupted = interrupted;
  return true;
}

absl::Status JobLifecycle::EndAttempt(Job& job) {
  v1::AttemptInfo& attempt = *job.current();
  // (UNSPECIFIED: a rank ended before its kind was recorded, by an older controller.)
  const auto failed = [](const v1::RankInfo& r) {
    return r.exit_kind() != v1::EXIT_KIND_SUCCESS && r.exit_kind() != v1::EXIT_KIND_STOPPED &&
           r.exit_kind() != v1::EXIT_KIND_UNSPECIFIED;
  };
  const auto first_failed = std::find_if(attempt.ranks().begin(), attempt.ranks().end(), failed);
  if (first_failed != attempt.ranks().end() || attempt.failed_unix() > 0) {
    // A rank failed: the cause the settle window holds or, when it is gone (a controller
    // restart), the first failed rank's.
    BlameFrozenRank(job);
    std::string kind = job.pending_kind, cause = job.pending_cause, worker = job.pending_worker;
    bool interrupted = job.pending_interrupted;
    if (job.settle_deadline == 0 || cause.empty()) {
      interrupted = false;
      kind = "exit";
      cause = "a rank failed";
      worker.clear();
      if (first_failed != attempt.ranks().end()) {
        kind = FailureKind(first_failed->exit_kind());
        cause = absl::StrCat("rank ", first_failed->rank(), " on ", first_failed->worker_id(), ": ",
                             first_failed->exit());
        worker = first_failed->worker_id();
      }
    }
    // A pending interruption (a leaving agent's, retried: FailLater) stays one.
    if (!FailAttempt(job, kind.empty() ? "exit" : kind, cause, worker,
                     interrupted ? Failure::kInterrupted : Failure::kRetryable)) {
      return absl::UnavailableError("controller could not record the failure; retry");
    }
    return absl::OkStatus();
  }
  const Job backup = job;  // restored when not written: the attempt stays running, Tick retries
  attempt.set_state(v1::ATTEMPT_STATE_SUCCEEDED);
  attempt.set_ended_unix(clock_.UnixSeconds());
  job.summary.set_cause("");
  absl::Status s;
  if (job.summary.state() == v1::JOB_STARTING) {
    // Every rank finished before the last start report was seen: still a full run.
    s = Transition(job, v1::JOB_RUNNING, "running", "all ranks ran");
  }
  if (s.ok()) {
    s = Transition(job, v1::JOB_SUCCEEDED, "succeeded",
                   absl::StrCat("all ", attempt.ranks_size(), " ranks exited with code 0"));
  }
  if (!s.ok()) {
    job = backup;
    return s;
  }
  CloseScope(job, job.current()->attempt());
  return s;
}

bool JobLifecycle::AgentOfARankIsSilent(const Job& job, double now) const {
  if (!job.pending_weak || job.pending_kind != "exit" || job.current() == nullptr) return false;
  // Agents beat every heartbeat_interval_s: one past 1.5 of them has missed a beat.
  const double missed = 1.5 * options_.heartbeat_interval_s;
  for (const v1::RankInfo& rank : job.current()->ranks()) {
    if (rank.state() == v1::RANK_STATE_EXITED || rank.worker_id() == job.pending_worker) continue;
    const auto it = workers_.workers().find(rank.worker_id());
    if (it == workers_.workers().end() || it->second.info.state() == v1::WORKER_STATE_LOST) {
      continue;
    }
    if (now - it->second.seen->mono.load(std::memory_order_relaxed) > missed) return true;
  }
  return false;
}

void JobLifecycle::BlameFrozenRank(Job& job) {
  if (job.settle_deadline == 0 || !job.pending_weak || job.pending_kind != "hang" ||
      job.pending_frozen_named) {
    return;  // (named already: a retry after a failed write must not wrap the cause again)
  }
  const std::optional<SilentRank> frozen = SilentestRank(job);
  if (!frozen) return;
  job.pending_frozen_named = true;
  job.pending_cause = absl::StrFormat(
      "rank %d on %s: sent nothing for %.1f s, not even its watchdog's heartbeat (frozen: "
      "stopped, or every thread blocked); the ranks hung in a collective waited for it (%s)",
      frozen->rank, frozen->worker_id, frozen->silent_s, job.pending_cause);
  job.pending_worker = frozen->worker_id;
}

std::optional<JobLifecycle::SilentRank> JobLifecycle::SilentestRank(const Job& job) const {
  const v1::AttemptInfo& attempt = job.attempts.back();
  const double now = clock_.MonotonicSeconds();
  std::optional<SilentRank> out;
  for (const v1::RankInfo& rank : attempt.ranks()) {
    if (rank.state() == v1::RANK_STATE_EXITED) continue;
    const Worker* w = workers_.Find(rank.worker_id());
    if (w == nullptr || !w->has_rank || w->info.job_id() != job.summary.job_id() ||
        w->attempt != attempt.attempt() || w->info.rank() != rank.rank()) {
      continue;
    }
    // Only what the agent itself saw (a live rank's silence is under a second whenever it beats):
    // never the age of the agent's last heartbeat, which a slow beat or a long interval inflates.
    const Liveness::RankSilence s = w->seen->Silence();
    if (s.job_id != job.summary.job_id() || s.attempt != attempt.attempt() ||
        s.rank != rank.rank() || s.silent_s < kFrozenEvidenceS) {
      continue;
    }
    const double silent = s.silent_s + (now - s.at);
    if (!out || silent > out->silent_s) {
      out = SilentRank{static_cast<int>(rank.rank()), rank.worker_id(), silent};
    }
  }
  return out;
}

double StopKeepingProgressGraceS(const Job& job, const v1::AttemptInfo& attempt) {
  const bool no_failure = job.summary.state() == v1::JOB_CANCELLED ||
                          attempt.state() == v1::ATTEMPT_STATE_INTERRUPTED ||
                          attempt.failure_kind() == kTimeLimitKind;
  return no_failure ? v1::StopCheckpointGraceS(job.spec) : 0;
}

double JobLifecycle::DeadlineUnix(const Job& job) {
  const double limit = job.spec.resources().time_limit_s();
  if (limit <= 0 || job.attempts.empty() || job.attempts.front().started_unix() <= 0) return 0;
  return job.attempts.front().started_unix() + limit;
}

bool JobLifecycle::PastTimeLimit(const Job& job, double now_unix) const {
  const double deadline = DeadlineUnix(job);
  if (deadline <= 0 || IsFinal(job.summary.state()) || now_unix < deadline) return false;
  // A failure waiting for its settle window (or for the store) ends the attempt first, as the
  // failure it is: its peers are not given a grace for a step they cannot finish.
  if (job.settle_deadline > 0) return false;
  // After a controller restart, the agents of the running attempt's ranks are heard from first,
  // and the exit reports of the ranks that ended while the controller was away (a success among
  // them) arrive: until each agent registered and sent those, the ranks' ends are unknown.
  const v1::AttemptInfo& attempt = *job.current();
  if (attempt.state() == v1::ATTEMPT_STATE_RUNNING) {
    for (const v1::RankInfo& rank : attempt.ranks()) {
      if (rank.state() == v1::RANK_STATE_EXITED) continue;
      const Worker* w = workers_.Find(rank.worker_id());
      if (w == nullptr || w->info.state() == v1::WORKER_STATE_LOST) continue;
      if (!w->seen->in_session.load() || (w->has_rank && w->exit_owed)) return false;
    }
  }
  return true;
}

void JobLifecycle::EndAtTimeLimit(Job& job, double now_unix) {
  const Job backup = job;
  const std::string cause = absl::StrFormat(
      "time limit reached: %.0f s since its first attempt started (resources.time_limit_s %s)",
      now_unix - job.attempts.front().started_unix(),
      ShortestDecimal(job.spec.resources().time_limit_s()));
  v1::AttemptInfo* attempt = job.current();
  const bool running = attempt->state() == v1::ATTEMPT_STATE_RUNNING;
  if (running) {
    attempt->set_state(v1::ATTEMPT_STATE_FAILED);
    attempt->set_cause(cause);
    attempt->set_failure_kind(kTimeLimitKind);
    attempt->set_ended_unix(now_unix);
    if (attempt->failed_unix() == 0) attempt->set_failed_unix(now_unix);
  }
  job.settle_deadline = 0;  // a failure pending (its settle window) is overtaken
  const bool keeps = running && v1::StopCheckpointGraceS(job.spec) > 0;
  job.summary.set_cause(absl::StrCat(
      cause, keeps ? "; its ranks stop after their step and write its checkpoint" : ""));
  if (absl::Status s = Transition(job, v1::JOB_FAILED, "time_limit", job.summary.cause());
      !s.ok()) {
    spdlog::warn("job {}: its end at the time limit is not recorded yet: {}", job.summary.job_id(),
                 s.ToString());
    job = backup;
    return;
  }
  if (running) {
    StopAttemptRanks(job, "job time limit reached", /*keep_progress=*/true);
    CloseScope(job, attempt->attempt());
  }
}

void JobLifecycle::StopAttemptRanks(Job& job, const std::string& reason, bool keep_progress) {
  auto* attempt = job.current();
  if (!attempt) return;
  // A stop that is no failure lets a train job's ranks checkpoint the step in progress first.
  const double checkpoint_grace_s = keep_progress ? v1::StopCheckpointGraceS(job.spec) : 0;
  for (const auto& rank : attempt->ranks()) {
    if (rank.state() == v1::RANK_STATE_EXITED) continue;
    Worker* w = workers_.Find(rank.worker_id());
    if (w == nullptr || w->info.state() == v1::WORKER_STATE_LOST) continue;
    workers_.Enqueue(rank.worker_id(),
                     StopCommand(job.summary.job_id(), attempt->attempt(), rank.rank(),
                                 options_.stop_grace_s, reason, checkpoint_grace_s));
  }
}

bool JobLifecycle::FailAttempt(Job& job, const std::string& kind, const std::string& cause,
                               const std::string& culprit_worker, Failure failure) {
  // A failure whose write failed is pending (FailLater): it came first, so it is the attempt's
  // cause whichever call ends the attempt now (and a free leaving it counted is spent on it).
  if (job.settle_deadline > 0 && !job.pending_weak && !job.pending_cause.empty()) {
    const std::string pending_kind = job.pending_kind, pending_cause = job.pending_cause,
                      pending_worker = job.pending_worker;
    return FailAttemptAs(job, pending_kind, pending_cause, pending_worker,
                         job.pending_interrupted ? Failure::kInterrupted : Failure::kRetryable);
  }
  return FailAttemptAs(job, kind, cause, culprit_worker, failure);
}

bool JobLifecycle::FailAttemptAs(Job& job, const std::string& kind, const std::string& cause,
                                 const std::string& culprit_worker, Failure failure) {
  auto* attempt = job.current();
  if (!attempt || attempt->state() != v1::ATTEMPT_STATE_RUNNING) {
    job.settle_deadline = 0;
    return true;
  }
  // (The backup keeps a pending settle deadline: Tick retries a failure that was not written.)
  const Job backup = job;
  job.settle_deadline = 0;
  attempt->set_state(failure == Failure::kInterrupted ? v1::ATTEMPT_STATE_INTERRUPTED
                                                      : v1::ATTEMPT_STATE_FAILED);
  attempt->set_cause(cause);
  attempt->set_failure_kind(kind);
  attempt->set_culprit_worker(culprit_worker);
  attempt->set_ended_unix(clock_.UnixSeconds());
  if (attempt->failed_unix() == 0) attempt->set_failed_unix(attempt->ended_unix());
  attempt->set_recover_at_unix(attempt->ended_unix());
  const uint32_t n = attempt->attempt();
  const uint32_t max_restarts = job.spec.recovery().max_restarts();
  const uint32_t max_stuck = job.spec.recovery().max_attempts_without_progress();
  const NoProgress stuck = AttemptsWithoutProgress(job.attempts);
  // An activation out-of-memory exit that escalates the memory policy changes the next attempt:
  // that retry may help, so it is never given up as "no progress".
  const bool escalates =
      attempt->activation_oom() && !attempt->memory_policy().empty() &&
      EscalatedMemoryPolicy(attempt->memory_policy(), job.spec.memory().device_budget())
          .has_value();
  const bool gave_up_stuck = failure != Failure::kInterrupted && !escalates && max_stuck > 0 &&
                             stuck.attempts >= max_stuck;
  const std::string stuck_cause = absl::StrFormat(
      "%s (not retried: no progress across %d consecutive attempts, none got past step %d; "
      "recovery.max_attempts_without_progress = %d)",
      cause, stuck.attempts, stuck.step, max_stuck);
  absl::Status persisted;
  if (failure == Failure::kInterrupted) {
    job.recover_at_mono = clock_.MonotonicSeconds();
    job.summary.set_cause(cause);
    persisted = Transition(job, v1::JOB_RECOVERING, "interrupted",
                           absl::StrFormat("attempt %d interrupted: %s; it does not count "
                                           "against recovery.max_restarts",
                                           n, cause));
  } else if (failure == Failure::kCorruptData) {
    // furnace data prepare writes token files; an indexed dataset comes from the tool that made it
    // (Megatron's preprocess_data.py, or another writer of its format).
    const bool indexed = job.spec.data().source() == "indexed";
    job.summary.set_cause(absl::StrCat(
        cause, " (not retried: the data file is corrupt; every attempt would read the same bytes: ",
        indexed ? "write the indexed dataset again with the tool that made it"
                : "prepare it again, e.g. furnace data prepare",
        ")"));
    persisted = Transition(job, v1::JOB_FAILED, "failed", job.summary.cause());
  } else if (failure == Failure::kPermanent) {
    job.summary.set_cause(absl::StrCat(cause, " (not retried: the job's input is invalid)"));
    persisted = Transition(job, v1::JOB_FAILED, "failed", job.summary.cause());
  } else if (failure == Failure::kOutOfMemoryAtLastRung) {
    // Adaptive ran out: it acts on every step that would not fit, so the step's own MoE layer
    // (its routing) needed more than the budget (the rank's message and its start-up warning give
    // the bytes that fit any routing). full_recompute without a budget: the device ran out.
    const bool adaptive = attempt->memory_policy() == "adaptive";
    job.summary.set_cause(absl::StrCat(
        cause, " (not retried: out of memory under memory.policy ", attempt->memory_policy(),
        adaptive ? ", which needs the least of every policy and moves whatever can move when a "
                   "step would not fit: a restart would replay the same step. Either the step's "
                   "routing sent a rank more rows than memory.device_budget holds (raise it: "
                   "each rank's log gives the bytes that fit any routing; or set "
                   "moe.capacity_factor, or lower parallel.micro_batch), or the device itself "
                   "ran out below the budget (set memory.device_budget below the device's "
                   "memory)"
                 : ", the last policy to try without a memory.device_budget; a restart would "
                   "replay the same steps and run out of memory again: lower "
                   "parallel.micro_batch, or set memory.device_budget below the device's memory "
                   "so that memory.policy adaptive can plan against it)"));
    persisted = Transition(job, v1::JOB_FAILED, "failed", job.summary.cause());
  } else if (failure == Failure::kHealthCheck && !gave_up_stuck && max_stuck > 0) {
    // (Free only while the no-progress rule bounds it: with that rule off, 0, a health check
    // that fails every attempt spends recovery.max_restarts like any failure, below.)
    const double delay = job.spec.recovery().backoff().initial_s();
    job.recover_at_mono = clock_.MonotonicSeconds() + delay;
    attempt->set_recover_at_unix(attempt->ended_unix() + delay);
    job.summary.set_cause(cause);
    attempt->set_restarted(true);
    persisted = Transition(
        job, v1::JOB_RECOVERING, "health_check",
        absl::StrFormat("attempt %d failed its health check: %s; restart in %.1f s on spares, not "
                        "counted against recovery.max_restarts (an attempt without progress: "
                        "%d of %d)",
                        n, cause, delay, stuck.attempts, max_stuck));
  } else if (gave_up_stuck &&
             (failure == Failure::kHealthCheck || job.summary.restarts() < max_restarts)) {
    // (With the budget spent too, the budget's message below says so.)
    job.summary.set_cause(stuck_cause);
    persisted = Transition(job, v1::JOB_FAILED, "failed", job.summary.cause());
  } else if (job.summary.restarts() < max_restarts) {
    job.summary.set_restarts(job.summary.restarts() + 1);
    // The backoff grows over a run of failures without progress and starts again from
    // initial_s after an attempt that got past the job's best step: a job that trains for days
    // between rare failures does not wait max_s after each once it has had a few.
    const double delay =
        BackoffDelay(job.spec.recovery().backoff(), std::max<uint32_t>(1, stuck.attempts));
    job.recover_at_mono = clock_.MonotonicSeconds() + delay;
    attempt->set_recover_at_unix(attempt->ended_unix() + delay);
    job.summary.set_cause(cause);
    attempt->set_restarted(true);
    persisted = Transition(job, v1::JOB_RECOVERING, "restart",
                           absl::StrFormat("attempt %d failed: %s; restart %d/%d in %.1f s", n,
                                           cause, job.summary.restarts(), max_restarts, delay));
  } else {
    job.summary.set_cause(absl::StrFormat(
        "%s (attempt %d; gave up after %d restart%s, recovery.max_restarts = %d)", cause, n,
        job.summary.restarts(), job.summary.restarts() == 1 ? "" : "s", max_restarts));
    persisted = Transition(job, v1::JOB_FAILED, "failed", job.summary.cause());
  }
  if (!persisted.ok()) {
    job = backup;  // nothing happened; the next report or tick tries again
    return false;
  }
  // The culprits of this failure and of the run of failures without progress before it (stored
  // with the attempts, so a restarted controller avoids the same workers); never an excluded one.
  job.suspect_workers = SuspectWorkers(job.attempts);
  for (const auto& [worker_id, exclusion] : job.excluded_workers) {
    job.suspect_workers.erase(worker_id);
  }
  StopAttemptRanks(
      job,
      absl::StrCat("attempt ", n, " ", failure == Failure::kInterrupted ? "interrupted" : "failed",
                   ": ", cause),
      /*keep_progress=*/failure == Failure::kInterrupted);
  CloseScope(job, n);
  return true;
}

void JobLifecycle::PersistRecord(Job& job, const std::string& what) {
  if (absl::Status s = Persist(job); !s.ok()) {
    spdlog::warn("job {}: {} not recorded yet: {}", job.summary.job_id(), what, s.ToString());
  }
}

void JobLifecycle::WorkerLeaving(const std::string& worker_id) {
  if (Worker* w = workers_.Find(worker_id)) MarkLost(*w, "its agent is shutting down", true);
}

void JobLifecycle::MarkLost(Worker& worker, const std::string& why, bool leaving) {
  if (worker.info.state() == v1::WORKER_STATE_LOST) return;
  spdlog::warn("worker {} {}: {}", EscapeForLog(worker.info.worker_id()), leaving ? "left" : "lost",
               EscapeForLog(why));
  const WorkerRegistry::Held held = workers_.MarkLost(worker, leaving);
  if (!held.has_rank) return;
  Job* job = Find(held.job_id);
  if (job == nullptr) return;
  // Its agent stops the rank with the job's checkpoint.stop_grace_s to write the step it reached:
  // waited for before the job's next attempt reads the directory (TryStart).
  if (const double grace = v1::StopCheckpointGraceS(job->spec); leaving && grace > 0) {
    job->leaving_drain[worker.info.worker_id()] =
        clock_.MonotonicSeconds() + grace + kLeavingDrainMarginS;
  }
  if (held.attempt == 0 || held.attempt > job->attempts.size()) return;
  v1::AttemptInfo* attempt = &job->attempts[held.attempt - 1];
  // Its rank ended before (a successful exit whose write, and with it the worker's release,
  // waits: ReportRank): that end stands, and the worker held nothing else.
  if (held.rank < static_cast<uint32_t>(attempt->ranks_size()) &&
      attempt->ranks(held.rank).state() == v1::RANK_STATE_EXITED) {
    return;
  }
  if (held.rank < static_cast<uint32_t>(attempt->ranks_size())) {
    auto* rank = attempt->mutable_ranks(held.rank);
    rank->set_state(v1::RANK_STATE_EXITED);
    rank->set_exit(absl::StrCat(leaving ? "left" : "lost", " with its worker (", why, ")"));
    rank->set_exit_kind(v1::EXIT_KIND_LOST);
    NoteRanksExited(*attempt);
    NoteOlderAttemptChanged(*job, *attempt);
    if (attempt->state() == v1::ATTEMPT_STATE_RUNNING && attempt->failed_unix() == 0) {
      attempt->set_failed_unix(worker.seen->unix_s.load(std::memory_order_relaxed));
    }
  }
  if (attempt == job->current() && attempt->state() == v1::ATTEMPT_STATE_RUNNING &&
      !IsFinal(job->summary.state())) {
    // An agent leaving interrupts the attempt: the first few times (summary.leaving_interruptions,
    // stored with the job) that spends no restart; later ones do, so an agent stopped each time
    // it gets a rank (a probe, a supervisor) cannot restart a job forever.
    // (With a root cause pending already, whose write failed, that one ends the attempt:
    // FailAttempt writes it, and this leaving spends nothing.)
    constexpr uint32_t kFreeLeavings = 3;
    const uint32_t free_so_far = job->summary.leaving_interruptions();
    const bool root_pending = job->settle_deadline > 0 && !job->pending_weak;
    const bool interrupted = leaving && !root_pending && free_so_far < kFreeLeavings;
    if (interrupted) job->summary.set_leaving_interruptions(free_so_far + 1);
    if (!FailAttempt(
            *job, interrupted ? "interrupted" : "lost",
            absl::StrCat("worker ", worker.info.worker_id(), leaving ? " left (" : " lost (", why,
                         "); rank ", held.rank, " gone"),
            worker.info.worker_id(), interrupted ? Failure::kInterrupted : Failure::kRetryable)) {
      // Not recorded (a store error). The worker is LOST now, so no later tick comes here
      // again: Tick's settle branch fails the attempt once the store takes it. The free
      // interruption stays counted when that is the failure Tick will write (it writes the
      // count with it); another failure pending already spends none.
      const bool pending = FailLater(
          *job, interrupted ? "interrupted" : "lost",
          absl::StrCat("worker ", worker.info.worker_id(), leaving ? " left (" : " lost (", why,
                       "); rank ", held.rank, " gone"),
          worker.info.worker_id(), interrupted);
      if (!pending) job->summary.set_leaving_interruptions(free_so_far);
      return;
    }
  } else {
    PersistRecord(*job, "a lost worker's rank ended");
  }
  // Silent while holding a rank of the job: kept out of its next attempts (restart_ladder.cc).
  if (!IsFinal(job->summary.state())) {
    Exclude(*job, worker.info.worker_id(), absl::StrCat(leaving ? "left: " : "lost: ", why),
            /*lost=*/true);
  }
}

void JobLifecycle::ForgetLongLostWorkers() {
  if (options_.forget_lost_s <= 0) return;
  const double now_unix = clock_.UnixSeconds();
  std::vector<std::string> gone;
  for (const auto& [id, w] : workers_.workers()) {
    // From when it was declared lost, not last heard from: a worker's stored last-seen time is
    // only as new as its last change of state, and one lost at a controller restart must still
    // be shown lost for the whole window.
    if (w.info.state() != v1::WORKER_STATE_LOST || w.info.lost_unix() <= 0) continue;
    if (now_unix - w.info.lost_unix() > options_.forget_lost_s) gone.push_back(id);
  }
  for (const std::string& id : gone) {
    spdlog::info(
        "forgetting worker {}: lost for over {:.0f} s (--forget-lost-workers); it registers as "
        "a new worker if its agent comes back",
        EscapeForLog(id), options_.forget_lost_s);
    workers_.Forget(id);
  }
}

void JobLifecycle::Tick() {
  const double now = clock_.MonotonicSeconds();
  const double now_unix = clock_.UnixSeconds();
  // Agents that stopped heart-beating. A job may set the limit for its own workers, shorter or
  // longer than --worker-timeout (recovery.heartbeat_timeout_s).
  for (auto& [id, w] : workers_.workers()) {
    if (w.info.state() == v1::WORKER_STATE_LOST) continue;
    double limit = options_.worker_timeout_s;
    if (w.has_rank) {
      auto jt = jobs_.find(w.info.job_id());
      if (jt != jobs_.end() && jt->second.spec.recovery().heartbeat_timeout_s() > 0) {
        limit = jt->second.spec.recovery().heartbeat_timeout_s();
      }
    }
    // Known from the store and not registered since our start: the controller was the one away,
    // so the agent gets the re-attach grace, counted from our start, whatever the job asks.
    if (!w.seen->in_session.load()) limit = std::max(limit, options_.reattach_grace_s);
    const double silent = now - w.seen->mono.load(std::memory_order_relaxed);
    if (silent > limit) MarkLost(w, absl::StrFormat("no heartbeat for %.1f s", silent));
  }
  ForgetLongLostWorkers();
  std::vector<Job*> to_start;  // pending, and recovering past their backoff
  for (auto& [id, job] : jobs_) {
    if (job.settle_deadline > 0 && now >= job.settle_deadline && AgentOfARankIsSilent(job, now)) {
      // A victim's error exit while the agent of another rank of the attempt has missed its
      // heartbeat: that agent is likely dead with its rank (SIGKILL, a machine gone), the peer's
      // broken connection its consequence. The loss (above, at its heartbeat limit) or the agent's
      // restart (Register) is the root cause and takes the failure; the wait ends as soon as the
      // agent is heard from again. (It blamed the healthy peer, as an "exit".)
      job.settle_deadline = now;
    } else if (job.settle_deadline > 0 && now >= job.settle_deadline) {
      BlameFrozenRank(job);
      FailAttempt(job, job.pending_kind.empty() ? "exit" : job.pending_kind, job.pending_cause,
                  job.pending_worker,
                  job.pending_interrupted ? Failure::kInterrupted : Failure::kRetryable);
    }
    // Every rank of the running attempt has ended, yet the attempt was not ended: the write that
    // would have ended it failed (a store error), or a controller restart lost the settle window.
    // Retried here until it lands, so no job is left running with nothing running.
    // (An attempt SUCCEEDED under a job that is not: a store that took the attempt's end but not
    // the job's, loaded after a restart. Ended again.)
    if (v1::AttemptInfo* a = job.current();
        a != nullptr &&
        (a->state() == v1::ATTEMPT_STATE_RUNNING || a->state() == v1::ATTEMPT_STATE_SUCCEEDED) &&
        job.settle_deadline == 0 && !IsFinal(job.summary.state()) && a->ranks_size() > 0 &&
        AllRanks(*a, v1::RANK_STATE_EXITED)) {
      a->set_state(v1::ATTEMPT_STATE_RUNNING);
      if (absl::Status s = EndAttempt(job); !s.ok()) {
        spdlog::warn("job {}: its ended attempt is not recorded yet: {}", job.summary.job_id(),
                     s.ToString());
      }
    }
    if (PastTimeLimit(job, now_unix)) {
      EndAtTimeLimit(job, now_unix);
      continue;
    }
    switch (job.summary.state()) {
      case v1::JOB_PENDING:
        to_start.push_back(&job);
        break;
      case v1::JOB_RECOVERING:
        if (now >= job.recover_at_mono) to_start.push_back(&job);
        break;
      case v1::JOB_STARTING: {
        auto* attempt = job.current();
        const double limit = job.spec.recovery().start_timeout_s();
        if (attempt && attempt->state() == v1::ATTEMPT_STATE_RUNNING &&
            AllRanks(*attempt, v1::RANK_STATE_RUNNING)) {
          // Every rank runs, but the transition could not be written when the last one started
          // or re-attached (nothing was sent on it): retried until it lands.
          attempt->set_all_running_unix(clock_.UnixSeconds());
          if (!Transition(job, v1::JOB_RUNNING, "running", "all ranks running").ok()) {
            attempt->set_all_running_unix(0);
          }
        } else if (attempt && now - job.attempt_started_mono > limit) {
          std::vector<std::string> late;
          for (const auto& r : attempt->ranks()) {
            if (r.state() == v1::RANK_STATE_ASSIGNED) {
              late.push_back(absl::StrCat(r.rank(), " (", r.worker_id(), ")"));
            }
          }
          FailAttempt(job, "start_timeout",
                      absl::StrFormat("ranks %s not running %.0f s after placement "
                                      "(recovery.start_timeout_s)",
                                      absl::StrJoin(late, ", "), limit),
                      "");
        }
        break;
      }
      default:
        break;
    }
  }
  // Recovering jobs first, then pending ones, each oldest first (job ids sort by name, not by
  // submission): a job mid-training gets the workers back before a later one, and the older of
  // two pending jobs has the first go (a younger one still starts on what it cannot use).
  std::stable_sort(to_start.begin(), to_start.end(), [](const Job* a, const Job* b) {
    const bool ra = a->summary.state() == v1::JOB_RECOVERING;
    const bool rb = b->summary.state() == v1::JOB_RECOVERING;
    if (ra != rb) return ra;
    return a->summary.submitted_unix() < b->summary.submitted_unix();
  });
  // One scan of the workers and jobs for every job weighed, again after one starts or ends (the
  // only changes TryStart makes to what the others read).
  std::optional<PlacementScan> scan;
  for (Job* job : to_start) {
    if (!scan) scan = ScanForPlacement();
    const v1::JobState before = job->summary.state();
    TryStart(*job, *scan);
    if (job->summary.state() != before) scan.reset();
  }
}

std::string JobLifecycle::Register(const v1::RegisterRequest& req) {
  Worker& w = workers_.FindOrAdd(req.worker_id());
  const bool known = !w.info.worker_id().empty();
  // A different agent process than the one we knew: what it ran died with the old one.
  const bool agent_restarted =
      known && (w.info.pid() != req.pid() || w.info.instance_id() != req.instance_id());
  if (agent_restarted) {
    for (auto& [id, job] : jobs_) job.leaving_drain.erase(req.worker_id());
  }
  w.info.set_worker_id(req.worker_id());
  w.info.set_host(req.host());
  w.info.set_slot(req.slot());
  w.info.set_device_kind(req.device_kind());
  w.info.set_device_memory(req.device_memory());
  w.info.set_pid(req.pid());
  w.info.set_instance_id(req.instance_id());
  w.info.set_lost_unix(0);
  w.info.set_left(false);
  w.seen->Set(clock_.MonotonicSeconds(), clock_.UnixSeconds());
  w.seen->SetSilence({});  // (a new agent process, or a new session: nothing said yet)
  const bool first_since_start = !workers_.HasSession(req.worker_id());
  const std::string session = workers_.NewSession(req.worker_id(), agent_restarted);

  // The rank it runs: re-attach it if its attempt still wants it; otherwise stop it, and keep the
  // worker busy (draining) until its exit report arrives, so no second rank lands beside it.
  bool runs_our_rank = false;
  for (const auto& rr : req.running()) {
    auto jt = jobs_.find(rr.job_id());
    bool wanted = false;
    if (jt != jobs_.end() && !IsFinal(jt->second.summary.state())) {
      Job& job = jt->second;
      auto* attempt = job.current();
      if (attempt && attempt->attempt() == rr.attempt() &&
          attempt->state() == v1::ATTEMPT_STATE_RUNNING &&
          rr.rank() < static_cast<uint32_t>(attempt->ranks_size()) &&
          attempt->ranks(rr.rank()).worker_id() == req.worker_id() &&
          attempt->ranks(rr.rank()).state() != v1::RANK_STATE_EXITED) {
        wanted = true;
        auto* rank = attempt->mutable_ranks(rr.rank());
        rank->set_state(v1::RANK_STATE_RUNNING);
        rank->set_pid(rr.pid());
        // Only an agent's first registration with this controller run re-attaches: one that
        // registers again (its Register timed out on its side after we took it) brings nothing
        // new.
        if (first_since_start) {
          Event(job, "reattached",
                absl::StrCat("rank ", rr.rank(), " (pid ", rr.pid(), ") on ", req.worker_id()));
        }
        if (job.summary.state() == v1::JOB_STARTING && AllRanks(*attempt, v1::RANK_STATE_RUNNING)) {
          // Nothing is sent on this transition, so a failed write only leaves the job STARTING
          // in memory and in the store; Tick retries it until it lands.
          attempt->set_all_running_unix(clock_.UnixSeconds());
          if (!Transition(job, v1::JOB_RUNNING, "running", "all ranks running (re-attached)")
                   .ok()) {
            attempt->set_all_running_unix(0);
          }
        } else {
          PersistRecord(job, "a re-attached rank");
        }
      }
    }
    if (!wanted) {
      // A rank of a cancelled job or an interrupted attempt may be writing the step it stopped
      // at (the controller restarted meanwhile): this stop keeps its grace, not cut it short.
      double checkpoint_grace_s = 0;
      if (jt != jobs_.end() && rr.attempt() >= 1 && rr.attempt() <= jt->second.attempts.size()) {
        checkpoint_grace_s =
            StopKeepingProgressGraceS(jt->second, jt->second.attempts[rr.attempt() - 1]);
      }
      workers_.Enqueue(
          req.worker_id(),
          StopCommand(rr.job_id(), rr.attempt(), rr.rank(), options_.stop_grace_s,
                      "no attempt of this job wants this rank any more", checkpoint_grace_s));
    }
    w.has_rank = true;
    w.attempt = rr.attempt();
    w.info.set_job_id(rr.job_id());
    w.info.set_rank(rr.rank());
    runs_our_rank = true;
  }
  w.exit_owed = false;
  // A rank we placed here that the agent no longer runs. If the agent itself restarted, the rank
  // died with it (when it is the current attempt's, that attempt fails; an older attempt's rank
  // is simply gone). Otherwise its exit report is on its way (agents re-send unacked reports);
  // a rank still "assigned" never got its start command (lost with a controller restart): send
  // it again, the agent ignores a start it already had.
  if (w.has_rank && !runs_our_rank) {
    Job* job = Find(w.info.job_id());
    v1::AttemptInfo* attempt = job && w.attempt >= 1 && w.attempt <= job->attempts.size()
                                   ? &job->attempts[w.attempt - 1]
                                   : nullptr;
    const uint32_t rank_n = w.info.rank();
    v1::RankInfo* rank = attempt && rank_n < static_cast<uint32_t>(attempt->ranks_size())
                             ? attempt->mutable_ranks(rank_n)
                             : nullptr;
    // (A rank that ended successfully, its exit not written yet, keeps its worker held until it
    // is: ReleaseExits frees it.)
    bool exit_unwritten = false;
    if (auto it = unwritten_exits_.find(w.info.job_id());
        it != unwritten_exits_.end() && rank != nullptr) {
      for (const ExitWaiter& e : it->second) {
        exit_unwritten = exit_unwritten || (e.attempt == w.attempt && e.rank == rank_n);
      }
    }
    if (exit_unwritten) {
      // Nothing to do: the exit's write frees the worker.
    } else if (agent_restarted || rank == nullptr) {
      w.has_rank = false;
      w.attempt = 0;
      w.info.clear_job_id();
      if (rank != nullptr && rank->state() != v1::RANK_STATE_EXITED) {
        rank->set_state(v1::RANK_STATE_EXITED);
        rank->set_exit("lost: its worker agent restarted");
        rank->set_exit_kind(v1::EXIT_KIND_LOST);
        NoteRanksExited(*attempt);  // the recovery's teardown phase ends with the last rank
        NoteOlderAttemptChanged(*job, *attempt);
        if (attempt == job->current() && attempt->state() == v1::ATTEMPT_STATE_RUNNING &&
            !IsFinal(job->summary.state())) {
          const std::string cause =
              absl::StrCat("worker ", req.worker_id(), " restarted; rank ", rank_n, " lost");
          if (!FailAttempt(*job, "agent_restart", cause, req.worker_id())) {
            FailLater(*job, "agent_restart", cause, req.worker_id(),
                      /*interrupted=*/false);  // the rank is gone now
          }
        } else {
          PersistRecord(*job, "a rank lost with its restarted agent");
        }
      }
    } else if (rank->state() == v1::RANK_STATE_ASSIGNED) {
      if (attempt == job->current() && attempt->state() == v1::ATTEMPT_STATE_RUNNING &&
          !IsFinal(job->summary.state())) {
        workers_.Enqueue(req.worker_id(), StartCommand(*job, rank_n, w));
      } else if (first_since_start) {
        // Placed, but its attempt ended before the agent took the start command, which went
        // with a controller restart (as did the stop after it): it never ran and never will,
        // and no exit report will come (heartbeats ask the agent only about ranks that started).
        // Not freed here, the worker would stay busy for good. A start delivered late after all
        // is stopped at the next heartbeat (the controller lists no such rank). (Without a
        // restart, the start and the stop after it are still queued for the agent, whose stop
        // report frees the worker.)
        rank->set_state(v1::RANK_STATE_EXITED);
        rank->set_exit("never started: its attempt ended before its worker took the start command");
        rank->set_exit_kind(v1::EXIT_KIND_STOPPED);
        NoteRanksExited(*attempt);
        NoteOlderAttemptChanged(*job, *attempt);
        PersistLater({job->summary.job_id()});
        w.has_rank = false;
        w.attempt = 0;
        w.info.clear_job_id();
      }
    } else if (rank->state() == v1::RANK_STATE_RUNNING) {
      w.exit_owed = true;  // its exit report is on its way
    }
  }
  w.info.set_state(w.has_rank ? v1::WORKER_STATE_BUSY : v1::WORKER_STATE_READY);
  workers_.Persist(w);
  spdlog::info("worker {} registered (host {}, slot {}, pid {}, {} running rank(s))",
               EscapeForLog(req.worker_id()), EscapeForLog(req.host()), req.slot(), req.pid(),
               req.running_size());
  return session;
}

void JobLifecycle::ReportRank(const v1::RankReport& report, ReportDone done) {
  absl::Status s = HandleReport(report, done);
  if (done) done(std::move(s));  // (moved into a waiter when the answer waits for a write)
}

absl::Status JobLifecycle::HandleReport(const v1::RankReport& report, ReportDone& done) {
  // Ranks being stopped by our own shutdown (on the local workers it stops): ended in the records.
  if (stopped_at_shutdown_.count(report.worker_id()) > 0) return absl::OkStatus();
  workers_.Touch(report.worker_id());
  // A rank of a job, attempt or rank we have no record of (a state directory lost or restored
  // from an older copy): Register stopped it and keeps its worker busy until it exits; its exit
  // frees the worker (Free releases only that exact rank's hold).
  auto unknown = [&] {
    if (report.event() == v1::RANK_EXITED) {
      workers_.Free(report.worker_id(), report.job_id(), report.attempt(), report.rank());
    }
    return absl::OkStatus();
  };
  Job* found = Find(report.job_id());
  if (found == nullptr) return unknown();
  Job& job = *found;
  // A worker that left has stopped its rank: it no longer writes the job's checkpoint.
  if (report.event() == v1::RANK_EXITED) job.leaving_drain.erase(report.worker_id());
  if (report.attempt() == 0 || report.attempt() > job.attempts.size()) return unknown();
  v1::AttemptInfo& attempt = job.attempts[report.attempt() - 1];
  if (report.rank() >= static_cast<uint32_t>(attempt.ranks_size())) return unknown();
  v1::RankInfo& rank = *attempt.mutable_ranks(report.rank());
  if (!HeldBy(job, report.attempt(), report.rank(), report.worker_id())) {
    // (InvalidArgument: an agent drops such a report rather than hold its queue up retrying it.)
    return absl::InvalidArgumentError(absl::StrCat(
        "worker ", report.worker_id(), " reports on rank ", report.rank(), " of attempt ",
        report.attempt(), " of job ", report.job_id(), ", which runs on ", rank.worker_id()));
  }
  const bool current = job.current() == &attempt && attempt.state() == v1::ATTEMPT_STATE_RUNNING &&
                       !IsFinal(job.summary.state());
  NoteOlderAttemptChanged(job, attempt);  // a late report of an old attempt is written too

  if (report.event() == v1::RANK_STARTED) {
    if (rank.state() == v1::RANK_STATE_EXITED) return absl::OkStatus();
    const v1::RankState old_state = rank.state();
    const int32_t old_pid = rank.pid();
    rank.set_state(v1::RANK_STATE_RUNNING);
    rank.set_pid(report.pid());
    if (!current) {
      // Started after its attempt ended (e.g. a late command): stop it.
      PersistLater({job.summary.job_id()});
      if (workers_.Find(report.worker_id()) != nullptr) {
        workers_.Enqueue(report.worker_id(),
                         StopCommand(report.job_id(), report.attempt(), report.rank(),
                                     options_.stop_grace_s, "its attempt is over"));
      }
      return absl::OkStatus();
    }
    if (job.summary.state() == v1::JOB_STARTING && AllRunning(job, attempt)) {
      const double old_all_running = attempt.all_running_unix();
      attempt.set_all_running_unix(clock_.UnixSeconds());
      absl::Status s =
          Transition(job, v1::JOB_RUNNING, "running",
                     absl::StrFormat("attempt %d: all %d ranks running %.2f s after placement",
                                     attempt.attempt(), attempt.ranks_size(),
                                     attempt.all_running_unix() - attempt.started_unix()));
      if (!s.ok()) {  // undone; the agent re-sends the report
        rank.set_state(old_state);
        rank.set_pid(old_pid);
        attempt.set_all_running_unix(old_all_running);
      }
      return s;
    }
    // One rank more running changes nothing else: written behind.
    PersistLater({job.summary.job_id()});
    return absl::OkStatus();
  }

  if (report.event() != v1::RANK_EXITED) return absl::OkStatus();
  if (rank.state() == v1::RANK_STATE_EXITED) {  // a re-sent report
    // Its successful exit not written yet (the first report's answer did not reach the agent):
    // this one waits for the same write instead; the first call, whose client gave up, is
    // answered now, so a store that stays down does not pile calls up.
    if (auto it = unwritten_exits_.find(job.summary.job_id()); it != unwritten_exits_.end()) {
      for (ExitWaiter& w : it->second) {
        if (w.attempt == report.attempt() && w.rank == report.rank()) {
          if (ReportDone first = std::exchange(w.done, nullptr)) {
            first(absl::UnavailableError("superseded by a re-sent report"));
          }
          // After the last flush (shutting down): written now, or not answered OK.
          if (exits_abandoned_) return Persist(job);  // (releases it and its worker)
          w.done = std::exchange(done, nullptr);
          return absl::OkStatus();
        }
      }
    }
    workers_.Free(rank.worker_id(), report.job_id(), report.attempt(), report.rank());
    return absl::OkStatus();
  }
  // Every exit of the running attempt is written now, success included: the worker is freed at
  // once below and may take another job's rank, after which a crash that lost the exit would
  // leave the rank running in the store with no agent to report it (the worker's view lists only
  // the rank it holds). A likely victim's error exit (its peer died and the collective failed; or
  // its own watchdog found it hung inside a collective) only starts the settle window.
  const bool likely_victim =
      (report.exit_kind() == v1::EXIT_KIND_CODE &&
       report.exit_code() != v1::RANK_EXIT_HEALTH_CHECK &&
       report.exit_code() != v1::RANK_EXIT_CORRUPT_DATA &&
       report.exit_code() != v1::RANK_EXIT_UNKNOWN_KIND &&
       report.exit_code() != v1::RANK_EXIT_BAD_INPUT) ||
      (report.exit_kind() == v1::EXIT_KIND_HANG && report.hang_in_collective());
  // On a store error, undo and fail the RPC: the agent re-sends the report. Only a report of the
  // running attempt can fail (a copy of the job is O(ranks): not taken for the thousands of stop
  // reports after a cancel).
  // A successful exit of the running attempt that leaves a rank running is written behind
  // (ReportRank): nothing to undo, so no copy either.
  const bool write_behind = current && !exits_abandoned_ &&
                            report.exit_kind() == v1::EXIT_KIND_SUCCESS &&
                            !AllRanksButOneExited(attempt, report.rank());
  std::optional<Job> backup;
  if ((current && !write_behind) || (!current && exits_abandoned_)) backup.emplace(job);
  auto undo = [&](absl::Status s) {
    if (backup) job = std::move(*backup);
    return s;
  };
  rank.set_state(v1::RANK_STATE_EXITED);
  rank.set_exit(DescribeExit(report));
  rank.set_exit_kind(report.exit_kind());
  NoteRanksExited(attempt);
  if (current && attempt.failed_unix() == 0 && report.exit_kind() != v1::EXIT_KIND_SUCCESS &&
      report.exit_kind() != v1::EXIT_KIND_STOPPED) {
    attempt.set_failed_unix(report.failed_unix() > 0 ? report.failed_unix() : report.unix_time());
  }
  const std::string worker_id = rank.worker_id();
  absl::Status s;
  if (!current && exits_abandoned_) {
    // After the controller's last flush (its shutdown): written now, or the agent sends it again.
    s = Persist(job);
  } else if (!current) {
    PersistLater({job.summary.job_id()});  // a record of an attempt that is over
  } else if (write_behind) {
    PersistLater({job.summary.job_id()});
    unwritten_exits_[job.summary.job_id()].push_back(
        {worker_id, report.attempt(), report.rank(), ++exit_seq_, std::exchange(done, nullptr)});
    return absl::OkStatus();  // the worker is freed when the exit is written (ReleaseExits)
  } else if (report.exit_kind() == v1::EXIT_KIND_SUCCESS) {
    if (AllRanks(attempt, v1::RANK_STATE_EXITED)) {
      // Succeeded only if no rank failed: one that exited with an error code inside the settle
      // window ends the attempt as failed now.
      s = EndAttempt(job);
    } else {
      s = Persist(job);  // (written at once after the last flush at shutdown)
    }
  } else if (report.exit_kind() == v1::EXIT_KIND_CODE &&
             report.exit_code() == v1::RANK_EXIT_HEALTH_CHECK) {
    HealthCheckFailed(job, report);
    if (job.attempts[report.attempt() - 1].state() == v1::ATTEMPT_STATE_RUNNING) {
      s = absl::UnavailableError("controller could not record the failure; retry");
    }
  } else if (report.exit_kind() == v1::EXIT_KIND_CODE &&
             report.exit_code() == v1::RANK_EXIT_CORRUPT_DATA) {
    if (!FailAttempt(job, "corrupt_data",
                     absl::StrCat("rank ", report.rank(), " on ", report.worker_id(), ": ",
                                  DescribeExit(report)),
                     "", Failure::kCorruptData)) {
      s = absl::UnavailableError("controller could not record the failure; retry");
    }
  } else if (report.exit_kind() == v1::EXIT_KIND_CODE &&
             (report.exit_code() == v1::RANK_EXIT_UNKNOWN_KIND ||
              report.exit_code() == v1::RANK_EXIT_BAD_INPUT)) {
    if (!FailAttempt(job, "bad_input",
                     absl::StrCat("rank ", report.rank(), " on ", report.worker_id(), ": ",
                                  DescribeExit(report)),
                     "", Failure::kPermanent)) {
      s = absl::UnavailableError("controller could not record the failure; retry");
    }
  } else if (likely_victim) {
    // Likely a victim: an error exit (its peer died and the collective failed), or a hang its own
    // watchdog found inside a collective (waiting on a peer that hung in its own work, whose
    // watchdog reports in about a second and is the one to blame and to fence).
    s = Persist(job);
    if (s.ok()) {
      const bool hang = report.exit_kind() == v1::EXIT_KIND_HANG;
      NoteWeakFailure(job, hang ? "hang" : "exit",
                      absl::StrCat("rank ", report.rank(), " on ", report.worker_id(), ": ",
                                   DescribeExit(report)),
                      report.worker_id(), hang ? kHangSettleS : kSettleS);
    }
  } else {
    // The rank's own out-of-memory exit (its activation arena refused) escalates the memory
    // policy; the kernel's OOM killer (host RAM, maybe another process) is retried as it is.
    const bool activation_oom = report.exit_kind() == v1::EXIT_KIND_OOM &&
                                report.exit_code() == v1::RANK_EXIT_OUT_OF_MEMORY;
    if (activation_oom) attempt.set_activation_oom(true);
    const bool last_rung =
        activation_oom && !attempt.memory_policy().empty() &&
        !EscalatedMemoryPolicy(attempt.memory_policy(), job.spec.memory().device_budget())
             .has_value();
    FailAttempt(job, FailureKind(report.exit_kind()),
                absl::StrCat("rank ", report.rank(), " on ", report.worker_id(), ": ",
                             DescribeExit(report)),
                report.worker_id(),
                last_rung ? Failure::kOutOfMemoryAtLastRung : Failure::kRetryable);
    if (job.attempts[report.attempt() - 1].state() == v1::ATTEMPT_STATE_RUNNING) {
      s = absl::UnavailableError("controller could not record the failure; retry");
    }
  }
  if (!s.ok()) return undo(s);
  workers_.Free(worker_id, report.job_id(), report.attempt(), report.rank());
  return absl::OkStatus();
}

void JobLifecycle::Shutdown(const std::set<std::string>& stopping_workers) {
  if (stopping_workers.empty()) return;
  for (auto& [id, job] : jobs_) {
    if (job.summary.state() != v1::JOB_STARTING && job.summary.state() != v1::JOB_RUNNING) {
      continue;
    }
    // Only a job with a rank on a worker about to be stopped is interrupted: one whose ranks all
    // run on other agents (started by hand, on other machines) trains on, and the restarted
    // controller re-attaches them, as after a crash.
    const v1::AttemptInfo* current = job.current();
    const bool hit =
        current != nullptr &&
        std::any_of(current->ranks().begin(), current->ranks().end(), [&](const v1::RankInfo& r) {
          return r.state() != v1::RANK_STATE_EXITED && stopping_workers.count(r.worker_id()) > 0;
        });
    if (!hit) continue;
    // The ranks are marked ended only once the interruption is in the store. When it is not,
    // the store keeps the attempt running with its ranks, and the restarted controller treats the
    // stopped agents like any that restarted: the attempt fails and the job recovers.
    if (!FailAttempt(job, "interrupted", "the controller shut down and stopped its local workers",
                     "", Failure::kInterrupted)) {
      continue;
    }
    // Those on the workers stopped: their reports are no longer acted on. A rank on another
    // agent stays running in the records, stopped like any rank of an interrupted attempt (with
    // its checkpoint grace, in its StopRank and its heartbeat's view) and ended by its report,
    // here or, re-sent, at the next controller, whose next attempt waits for it.
    if (auto* attempt = job.current()) {
      for (auto& rank : *attempt->mutable_ranks()) {
        if (rank.state() != v1::RANK_STATE_EXITED && stopping_workers.count(rank.worker_id()) > 0) {
          rank.set_state(v1::RANK_STATE_EXITED);
          rank.set_exit("stopped: the controller shut down");
          rank.set_exit_kind(v1::EXIT_KIND_STOPPED);
        }
      }
      NoteRanksExited(*attempt);
      PersistRecord(job, "the ranks stopped at shutdown");
    }
  }
  for (auto& [wid, w] : workers_.workers()) {
    if (stopping_workers.count(wid) == 0) continue;
    w.has_rank = false;
    w.attempt = 0;
    w.info.clear_job_id();
    if (w.info.state() == v1::WORKER_STATE_BUSY) w.info.set_state(v1::WORKER_STATE_READY);
    workers_.Persist(w);
  }
  stopped_at_shutdown_ = stopping_workers;
}

}  // namespace furnace::controller
