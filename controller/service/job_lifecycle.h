// JobLifecycle: the jobs, their attempts and ranks, and every transition between their states:
// submission, gang placement, start, cancel (job_lifecycle.cc), and failure detection and recovery:
// rank reports, lost and re-registering workers, the settle window, restarts with backoff, and
// shutdown (recovery.cc), and the restart ladder's worker rules: suspects, exclusions, the health
// check's verdict, the layout that no longer fits (restart_ladder.cc).
//
// What it owns: the in-memory jobs (loaded from and written to the JobStore), their rendezvous
// scopes' lifetime (a scope opens when its attempt starts and closes when it ends: that is the
// fencing the rendezvous checks by itself), and the rank commands it queues for workers through
// the WorkerRegistry.
//
// Durability: every transition is written to the JobStore (one transaction) before it takes
// effect, i.e. before any command reaches a worker and before any caller sees the new state. On a
// failed write the job's in-memory state is restored and nothing is sent; the next report, tick or
// registration tries again. Events and the drop of an ended attempt's rendezvous keys are written
// behind, in order (`records`); GetJob waits for what is queued before it reads the events.
//
// Threading: externally synchronised. Only the Controller calls it, holding its state mutex; the
// same mutex guards the WorkerRegistry's records, which change together with the ranks. The
// transition writes stay under that mutex on purpose: the in-memory state, the commands queued
// and the store must change in one order, and the writes are single small transactions. Bulk
// data (telemetry, logs, reads for GetJob and series) is written and read without it.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "controller/service/rendezvous.h"
#include "controller/service/worker_registry.h"
#include "controller/store/group_commit.h"
#include "controller/store/job_store.h"
#include "furnace/v1/agent.pb.h"
#include "furnace/v1/controller.pb.h"
#include "runtime/base/clock.h"

namespace furnace::controller {

struct ControllerOptions {
  std::string state_dir;
  std::string advertise_address;      // what ranks dial for rendezvous
  double heartbeat_interval_s = 1.0;  // told to agents
  // Told to agents: how often they push telemetry and logs. 0: sized to the fleet, so a step's
  // records (every rank ends a step at once) arrive at about 10,000 a second or fewer:
  // clamp(workers / 10,000 s, 0.2 s, 2 s), the workers registered in this controller run.
  double telemetry_flush_s = 0;
  double worker_timeout_s = 10.0;  // an agent silent this long is lost
  // After a controller (re)start, agents known from the store get this long to register again
  // before their silence counts: the controller's own absence is not the workers' fault, and
  // their ranks kept running. A job's shorter recovery.heartbeat_timeout_s applies only after.
  double reattach_grace_s = 30.0;
  // --forget-lost-workers: a worker lost this long (since it was declared lost, WorkerInfo
  // lost_unix, stored, so a controller restart does not renew it) is forgotten: dropped from the
  // registry, the store and furnace_workers. An elastic fleet's departed hosts must not pile up.
  // 0: never.
  double forget_lost_s = 86400.0;
  // --forget-ended-jobs: a job that ended this long ago (its summary's updated_unix) is deleted
  // from the store and from memory, with its controller-side log; its checkpoints stay. A
  // controller that runs for months must not keep every job it ever ran. 0: never.
  double forget_ended_s = 0;
  // --reserve-after: a job pending this long (since its submission) has the next workers to free
  // up reserved for it: a job submitted after it starts only on workers beyond those, so a stream
  // of small jobs cannot hold a large one back forever. 0: never (younger jobs start on whatever
  // is free).
  double reserve_after_s = 600;
  // --default-time-limit / --max-time-limit: a job that sets no resources.time_limit_s gets the
  // default (or else the maximum) written into its spec at submit, so every reader (recovery's
  // deadline, backfill's shadow times, status, metrics) sees one limit; a job asking more than the
  // maximum is refused. A cluster whose jobs all have limits is one where backfill can plan.
  // 0: none.
  double default_time_limit_s = 0;
  double max_time_limit_s = 0;
  uint32_t local_workers = 0;  // capacity the embedded launcher will provide
  double stop_grace_s = 5.0;   // SIGTERM -> SIGKILL grace for ranks we stop
  // --data-root / --checkpoint-root, resolved (runtime/base/path_root.h); empty: paths are not
  // confined. Every path a job names is resolved under them at submit.
  std::string data_root;
  std::string checkpoint_root;
  // --submit-rate / --submit-burst: per caller identity (rate_limiter.h); rate <= 0: no limit.
  double submit_rate = 2.0;
  double submit_burst = 20.0;
  // --audit-keep: the audit log keeps its newest entries, this many; 0: all, forever.
  uint64_t audit_keep = 1'000'000;
};

// The answer to a rank report (JobLifecycle::ReportRank).
using ReportDone = std::function<void(absl::Status)>;

// A rank's successful exit written behind: its report's answer and its worker's release wait for
// the write (JobLifecycle::ReportRank).
struct ExitWaiter {
  std::string worker_id;
  uint32_t attempt = 0;
  uint32_t rank = 0;
  uint64_t seq = 0;  // the order exits were recorded in (a flush covers those up to its copy)
  ReportDone done;   // empty once answered
};

struct Job {
  furnace::v1::JobSummary summary;
  furnace::v1::JobSpec spec;
  std::vector<furnace::v1::AttemptInfo> attempts;  // index = attempt - 1
  double attempt_started_mono = 0;
  double recover_at_mono = 0;
  // spec.checkpoint.dir as the one-writer check compares it (lexically normal, and resolved
  // through symlinks on this machine): worked out once, on first use, not on every submit's scan
  // of the live jobs (the filesystem calls run under the controller's lock).
  mutable std::vector<std::string> checkpoint_dir_spellings;
  mutable bool checkpoint_dir_spelled = false;
  // The restart ladder's view of the workers (recovery.cc says the rules). Suspects: a rank of
  // theirs failed in the last attempt; placed only after spares, and vetted by the next attempt's
  // health check. Excluded: failed the health check, or went silent; never placed for this job
  // until recovery.exclude_s has passed, or sooner: a worker that failed the health check when
  // its agent restarts (registers as a new process), a silent one when it registers again.
  // In memory only: a restarted controller starts with none (the health check vets again).
  struct Exclusion {
    std::string reason;
    std::string instance_id;  // the agent process that failed
    bool lost = false;        // went silent: any registration ends it
    double until_mono = 0;
    double until_unix = 0;
  };
  std::set<std::string> suspect_workers;
  std::map<std::string, Exclusion> excluded_workers;
  // Workers that left (their agent stopping) holding a rank of this train job, which may still be
  // writing the checkpoint of the step it stopped at (checkpoint.stop_grace_s): worker id ->
  // monotonic time after which it is no longer waited for. The next attempt starts once each has
  // reported its rank's end, registered again or run out of time. In memory only.
  std::map<std::string, double> leaving_drain;
  double unfit_since_mono = 0;  // recovering and no allowed layout fits the workers left: since
  std::string waiting_reason;   // last "cannot place" message logged
  // A rank that exits with an error code is often a victim (its peer died and the collective
  // failed), so such a failure waits kSettleS for a root cause (a signal, a hang, an OOM, a
  // lost worker) before the attempt fails with the best cause seen. So does a rank whose own
  // watchdog found it hung inside a collective (waiting on its peers: every rank's watchdog fires
  // within about a second of the others'), for kHangSettleS, for the report of the rank that
  // hung in its own work.
  double settle_deadline = 0;  // 0: no failure pending
  std::string pending_kind, pending_cause, pending_worker;
  bool pending_interrupted = false;  // the pending failure interrupts (JobLifecycle::FailLater)
  // The pending failure is a victim's (NoteWeakFailure): a root cause that must be retried
  // (FailLater) takes its place.
  bool pending_weak = false;
  // BlameFrozenRank rewrote the pending cause to name a frozen rank (done once per failure).
  bool pending_frozen_named = false;
  // A rank of the current attempt reported a step since summary.step was last set to the lowest
  // rank step (done when the job is written, not per record: that is O(ranks) per record).
  bool step_stale = false;
  // Writes cover the two newest attempts (a failing one and the next), and from here on: the
  // index of the oldest older attempt changed since the job was last written (a late exit report,
  // a lost worker's draining rank); SIZE_MAX: none (JobLifecycle::NoteOlderAttemptChanged).
  size_t oldest_changed = SIZE_MAX;
  // The index of the first attempt a write of the job covers.
  size_t FirstAttemptToWrite() const {
    const size_t n = attempts.size();
    return std::min(n >= 2 ? n - 2 : 0, oldest_changed);
  }
  // ReportRank asks "is every rank of the attempt running now?" once per rank start: O(ranks)
  // each, O(ranks^2) per job start. Ranks below running_prefix (of attempt running_prefix_attempt)
  // were seen running, so the scan resumes there; a full check confirms the answer when it
  // reaches the end (a rank seen running may have exited since). See AllRunning (recovery.cc).
  uint32_t running_prefix_attempt = 0;
  uint32_t running_prefix = 0;
  // NoteRankTimes asks "has every rank of the attempt this start-up point?" once per record, for
  // four points (rendezvous, setup, checkpoint load, first step): the same way, ranks below
  // times_prefix[point] (of attempt times_prefix_attempt) had it at the last look (a rank's time,
  // once set, stays), so the scan resumes there (recovery_timing.cc).
  uint32_t times_prefix_attempt = 0;
  std::array<uint32_t, 4> times_prefix = {};
  // The ranks of an attempt (1-based): its layout's world, which recovery.shrink may make smaller
  // than the job's; 0 for an attempt it does not have.
  uint32_t AttemptWorld(uint32_t attempt) const {
    return attempt >= 1 && attempt <= attempts.size()
               ? static_cast<uint32_t>(attempts[attempt - 1].ranks_size())
               : 0;
  }
  furnace::v1::AttemptInfo* current() { return attempts.empty() ? nullptr : &attempts.back(); }
  const furnace::v1::AttemptInfo* current() const {
    return attempts.empty() ? nullptr : &attempts.back();
  }
};

// The checkpoint grace (checkpoint.stop_grace_s) a rank of `attempt` gets when it is stopped:
// the job's when the stop is no failure (the job cancelled, the attempt interrupted or ended at
// resources.time_limit_s), so the rank writes the step it reaches first; 0 otherwise.
double StopKeepingProgressGraceS(const Job& job, const furnace::v1::AttemptInfo& attempt);

// "12:34:56 UTC": when an exclusion ends, in events (restart_ladder.cc).
std::string UnixClock(double unix_s);

class JobLifecycle {
 public:
  // `records` writes behind what is a record and orders with nothing but itself: events and the
  // drop of an ended attempt's rendezvous keys (one committer for them and the keys' own writes).
  JobLifecycle(const ControllerOptions& options, const Clock& clock, JobStore& store,
               GroupCommit& records, WorkerRegistry& workers, Rendezvous& rendezvous);

  // Rebuilds jobs, attempts, the ranks' workers and the open rendezvous scopes from the store
  // (the registry's workers are loaded first). Returns how many jobs are still active.
  absl::StatusOr<int> Load();

  Job* Find(const std::string& job_id);
  // Drops an ended job from memory (Controller::ForgetEndedJobs, once the store has let it go).
  void Forget(const std::string& job_id);
  const std::map<std::string, Job>& jobs() const { return jobs_; }

  // checkpoint.every auto: what each rank of a new attempt is told about the job's failures and
  // measurements (RankTask.checkpoint_hint). Called under the same external synchronisation.
  using CheckpointHintSource = std::function<furnace::v1::CheckpointHint(const Job&)>;
  void SetCheckpointHintSource(CheckpointHintSource source) { hint_source_ = std::move(source); }

  // --- job_lifecycle.cc ---------------------------------------------------------------------
  // A validated spec: refused (InvalidArgument naming resources.workers) when this controller
  // cannot ever hold its ranks; InvalidArgument when its checkpoint.dir is --checkpoint-root
  // itself or lies under DefaultCheckpointParent (reserved for jobs that name none: a job could
  // otherwise fill the directory a later job gets and have it resume from that);
  // FailedPrecondition when its checkpoint.dir (its default one included) is, contains or lies
  // in another job's that has not ended (CheckpointDirUser); otherwise stored as PENDING and
  // placed when workers are free and no other job's ranks still hold its checkpoint.dir.
  // `filled_in` (when given) gets what the controller filled in that the file left out
  // (SubmitJobResponse.defaults).
  absl::StatusOr<std::string> Submit(furnace::v1::JobSpec spec, const std::string& filename,
                                     std::vector<std::string>* filled_in = nullptr);
  // Submit's checks and what it fills in, storing nothing (a server-side dry run, and Submit's
  // first half): `spec` becomes what Submit would store, `given` gets what it filled in. All of
  // Submit's refusals but the one that needs the job's id: a checkpoint.dir left out stays empty
  // (Submit gives the job <DefaultCheckpointParent>/<id>, a directory no other job can use).
  absl::Status CheckSubmit(furnace::v1::JobSpec& spec, const std::string& filename,
                           std::vector<std::string>& given) const;
  absl::StatusOr<furnace::v1::JobSummary> Cancel(const std::string& job_id);
  // Where jobs without a checkpoint.dir get theirs (<parent>/<job id>): <--checkpoint-root>/jobs,
  // else <--state-dir>/checkpoints.
  std::filesystem::path DefaultCheckpointParent() const;
  // One writer per checkpoint directory (compared as normalised paths): a job other than `self`
  // whose checkpoint.dir is `dir`, contains it or lies in it, and that has not ended (kNotEnded:
  // every job is scanned), or whose ranks a worker that is not lost still holds (kRanksRunning);
  // nullptr when there is none.
  enum class CheckpointDirUse { kNotEnded, kRanksRunning };
  const Job* CheckpointDirUser(const Job* self, const std::string& dir, CheckpointDirUse use) const;
  // kRanksRunning with the jobs whose ranks a worker not lost holds already gathered.
  const Job* CheckpointDirUser(const Job* self, const std::string& dir,
                               const std::set<std::string>& holding) const;
  // A rank's reported progress: updates its step (the job's follows when the job is next
  // written); false when the record names no rank of the job, or is one the job already counted
  // (its TelemetryRecord.seq is not above the rank's telemetry_seq: an agent re-sent a batch
  // whose answer it lost), and then nothing else is done with it. PersistLater then marks the job.
  bool NoteProgress(Job& job, const furnace::v1::TelemetryRecord& record);
  // A stored step (the controller loading its store): when every rank of its attempt reported it,
  // their steps, and the job's for its current attempt, are at least that. The steps are stored
  // as they complete, the job's step only written behind (FlushLater): a controller killed in
  // between would otherwise start from the older step, and the dashboards' step go back.
  static void NoteStoredStep(Job& job, const furnace::v1::StepRecord& step);
  // Whether a report, record or log line of (attempt, rank) may come from `worker_id`: the rank
  // exists and was placed on that worker, or the sender names no worker (in-process callers). One
  // worker cannot speak for another's ranks, nor for ranks that do not exist (auth_processor.h
  // binds a worker's identity to its host's certificate).
  static bool HeldBy(const Job& job, uint32_t attempt, uint32_t rank, const std::string& worker_id);
  // A checkpoint the ranks could not commit (checkpoint.async's write failed): an event
  // "checkpoint_failed" naming the step and the error. Training goes on.
  void NoteCheckpointFailure(Job& job, uint64_t step, const std::string& error);
  // The attempt's ranks resumed from a checkpoint: an event "checkpoint_restored" with rank 0's
  // account (the step, the layout that wrote it, and every newer checkpoint passed over and why).
  void NoteCheckpointRestored(Job& job, const std::string& account);
  // Write-behind of changes that are records, not transitions (a rank's step, a rank started or
  // ended while nothing else changes): PersistLater marks the job, FlushLater writes every marked
  // job (the Controller calls it about once a second). A transition is written at once, with the
  // marked changes (Persist writes the whole job). At thousands of ranks, a transaction per
  // telemetry batch or rank report wrote the whole attempt (every rank) each time: O(ranks^2)
  // bytes and an fsync per call, under the state mutex (bench/controlplane/REPORT.md). A
  // controller that dies loses at most the last interval of such records: rank steps come back
  // with the next telemetry, and started or ended ranks with the agents' re-registration and
  // heartbeat reconciliation, as for a PersistRecord that failed.
  void PersistLater(const std::set<std::string>& job_ids);
  // The job's unwritten exits recorded up to `seq` are in the store now: their workers are freed
  // and their reports answered.
  void ReleaseExits(const std::string& job_id, uint64_t seq = UINT64_MAX);
  // ReportRank's work; moves `done` into the job's exit waiters when the answer waits.
  absl::Status HandleReport(const furnace::v1::RankReport& report, ReportDone& done);
  // `state_lock` holds the state mutex: it is released while the store is written and held again
  // on return.
  void FlushLater(std::unique_lock<std::mutex>& state_lock);
  // --- recovery_timing.cc -------------------------------------------------------------------
  // A rank's start-up points and first step (TelemetryRecord.startup, the first step record):
  // kept on its RankInfo and, once every rank has them, on the attempt; when they complete an
  // attempt started by a restart, its RecoveryPhases and a "recovered" event. True when the
  // record changed the attempt (PersistLater marks it).
  bool NoteRankTimes(Job& job, const furnace::v1::TelemetryRecord& record);

  // --- recovery.cc, restart_ladder.cc --------------------------------------------------------
  // A worker agent (re-)registers: its session starts, the ranks it still runs are re-attached
  // when their attempt wants them and stopped otherwise; returns the session id.
  std::string Register(const furnace::v1::RegisterRequest& req);
  // A worker's agent says it is shutting down (HeartbeatRequest.leaving): the worker is lost
  // now, not a heartbeat timeout later, and the attempt it holds a rank of is interrupted.
  void WorkerLeaving(const std::string& worker_id);
  // `done` gets the answer: Unavailable when the store could not record the report (the agent
  // re-sends it). Every report is answered at once except a rank's successful exit that does not
  // end its attempt (and a re-sent one while it waits): that is written behind (FlushLater, or
  // the job's next Persist), and answered, with its worker freed, once the write has landed. So
  // the thousands of such exits at the end of a large job share a few writes where each wrote
  // the whole attempt (O(ranks^2) bytes and an fsync per rank under the state mutex), and still
  // no agent is told its exit is recorded, nor its worker given other work, before it is in the
  // store (a controller that died with it unwritten would find the rank running on a worker that
  // runs something else).
  void ReportRank(const furnace::v1::RankReport& report, ReportDone done);
  // Failure detection (silent workers, settle windows, start timeouts) and (re)placement.
  void Tick();
  // See Controller::Shutdown: `stopping_workers` are the ids of the workers about to be stopped
  // (none: state is left as is).
  void Shutdown(const std::set<std::string>& stopping_workers);
  // A worker Shutdown stopped (a local one, its ranks ended in the records).
  bool StoppedAtShutdown(const std::string& worker_id) const {
    return stopped_at_shutdown_.count(worker_id) > 0;
  }
  // After the last flush at shutdown: exits still unwritten (the store refused the flush) are
  // answered Unavailable, so the agent server's calls end and the agents re-send them to the next
  // controller; their workers stay held.
  void AbandonExitWaiters();

  // summary.step: the lowest step over the current attempt's ranks, once each has said where it
  // starts; before that, a restarted attempt keeps the job's progress.
  static uint64_t ProgressOf(const Job& job);
  // The job's step as of now: from the ranks' latest telemetry (ProgressOf), which the stored
  // summary gets only when it is next written (behind).
  static uint64_t StepNow(const Job& job);
  // The job's summary with StepNow's step (and what is filled in when read: waiting,
  // deadline_unix).
  static furnace::v1::JobSummary SummaryNow(const Job& job);
  // When resources.time_limit_s ends the job (JobSummary.deadline_unix); 0: no limit, or its
  // first attempt has not started.
  static double DeadlineUnix(const Job& job);

 private:
  // Ends the current attempt: persisted first, then its ranks are told to stop. A retryable
  // failure counts against recovery.max_restarts; a permanent one (the job's input is invalid:
  // retrying cannot help) ends the job FAILED at once; an interruption (the controller itself
  // stopping the workers) restarts without counting.
  // kOutOfMemoryAtLastRung: an out-of-memory exit under a memory policy with nothing left to
  // escalate to (controller/store/memory_escalation.h: adaptive at a budget, full_recompute
  // without one); a restart would replay the same steps and fail again.
  // kHealthCheck: the attempt's pre-training health check failed; restarted without counting
  // against recovery.max_restarts (no training failed), but it is an attempt without progress.
  // kCorruptData: a rank found the data file damaged; retrying cannot help.
  enum class Failure {
    kRetryable,
    kPermanent,
    kInterrupted,
    kOutOfMemoryAtLastRung,
    kHealthCheck,
    kCorruptData
  };

  absl::Status Transition(Job& job, furnace::v1::JobState to, const std::string& event_kind,
                          const std::string& message);
  absl::Status Persist(Job& job);
  // Writes a change that is a record, not a transition: a rank's end or pid in an attempt that is
  // already over in the store, or whose state does not change. Nothing is sent because of it, so
  // no promise depends on it: a failed write is logged and the in-memory state kept. The job's next
  // write carries it (Persist writes the two newest attempts); a controller restarted before that
  // finds the rank not ended, which the agents' re-registration resolves (a rank an agent no longer
  // runs is ended then, or its exit report, which agents re-send, ends it).
  void PersistRecord(Job& job, const std::string& what);
  void Event(Job& job, const std::string& kind, const std::string& message);
  // What TryStart reads of the workers and of the other jobs, gathered in one pass over each. A
  // pass per job weighed made a scheduler tick O(pending x workers) under the state mutex
  // (bench/controlplane/REPORT.md: 700 ms a tick at 4,096 workers and 1,000 pending jobs, ticks
  // every 100 ms). Tick gathers it once for the jobs it weighs, and again after one of them
  // starts or ends (nothing else changes the workers or the jobs meanwhile); TryStart for one job
  // gathers its own.
  struct PlacementScan {
    std::vector<WorkerSlot> slots;  // WorkerRegistry::Slots
    std::set<std::string> holding;  // jobs whose ranks a worker that is not lost still holds
    struct OfKind {
      uint32_t usable = 0;        // not lost: free, busy, or to register again (CountUsable)
      uint32_t free = 0;          // free for placement (FreeNow over `slots`)
      uint32_t unregistered = 0;  // not lost, not registered again since a restart
      // Job id -> its workers holding a rank: any (holders), or registered and not lost (busy,
      // which CheckBackfill weighs).
      std::map<std::string, uint32_t> holders, busy;
      std::vector<std::pair<std::string, bool>> lost;  // (id, left) of the lost ones, by id
      // The recovering jobs' claim (ClaimedByRecovering) and FreeOrFreeing for them.
      uint32_t claimed = 0;
      std::vector<std::string> claimed_by;
      uint32_t free_or_freeing = 0;
      // The pending jobs holding a reservation (HoldsReservation), oldest first:
      // ((submitted_unix, id), world size); reserved_before[i]: the workers of the first i.
      std::vector<std::pair<std::pair<double, std::string>, uint32_t>> reserving;
      std::vector<uint64_t> reserved_before;
    };
    std::map<std::string, OfKind> kinds;
    const OfKind& Of(const std::string& device_kind) const;
  };
  PlacementScan ScanForPlacement() const;
  void TryStart(Job& job);
  void TryStart(Job& job, const PlacementScan& scan);
  // `kind` labels the cause (AttemptInfo.failure_kind): signal, hang, oom, exit, lost, ...
  // Returns false when the failure could not be persisted (the job is left as it was). A failure
  // pending already (FailLater: its write failed) is written instead of the one given: it came
  // first.
  bool FailAttempt(Job& job, const std::string& kind, const std::string& cause,
                   const std::string& culprit_worker, Failure failure = Failure::kRetryable);
  // FailAttempt with exactly this failure.
  bool FailAttemptAs(Job& job, const std::string& kind, const std::string& cause,
                     const std::string& culprit_worker, Failure failure);
  // resources.time_limit_s: true when `job` (not ended, started) has run past it since its first
  // attempt started; EndAtTimeLimit then ends it FAILED and stops its ranks keeping their
  // progress (a failed write leaves it as it was: Tick tries again).
  bool PastTimeLimit(const Job& job, double now_unix) const;
  void EndAtTimeLimit(Job& job, double now_unix);
  // Stops the attempt's ranks still running; keep_progress (a cancel, an interruption: no failure)
  // gives a train job's ranks checkpoint.stop_grace_s to stop after their step with a checkpoint.
  void StopAttemptRanks(Job& job, const std::string& reason, bool keep_progress = false);
  // Only ranks that hung inside a collective reported (a weak "hang" pending): the one they wait
  // for may be a rank that sends nothing at all (frozen: SIGSTOP, every thread blocked), which its
  // agent calls hung only at 1.5 x hang_timeout_s, after the settle window. The pending failure
  // then names that rank and blames its worker instead of a victim's.
  void BlameFrozenRank(Job& job);
  // The current attempt's running rank that its agent says has sent nothing for the longest, at
  // least kFrozenEvidenceS (recovery.cc); nullopt: none.
  struct SilentRank {
    int rank = 0;
    std::string worker_id;
    double silent_s = 0;
  };
  std::optional<SilentRank> SilentestRank(const Job& job) const;
  // The job's pending failure is a victim's error exit and the agent of another of its attempt's
  // ranks still running has missed a heartbeat (Tick then keeps the failure pending).
  bool AgentOfARankIsSilent(const Job& job, double now) const;
  // Records a failure of a rank of the current attempt that may be a victim's (an error exit, a
  // hang inside a collective; `kind` as FailAttempt's); fails the attempt at once when every rank
  // has ended, otherwise after `settle_s` (Tick) unless a root cause comes first. The first such
  // failure is kept.
  void NoteWeakFailure(Job& job, const std::string& kind, const std::string& cause,
                       const std::string& worker, double settle_s);
  // Ends the current attempt, every rank of which has ended: failed when a rank failed (the
  // settle window's cause, else the first failed rank's), succeeded otherwise. Unavailable when
  // it could not be written (the job is left as it was; Tick retries).
  absl::Status EndAttempt(Job& job);
  furnace::v1::AgentCommand StartCommand(const Job& job, uint32_t rank, const Worker& worker) const;
  // `leaving`: the agent said it is shutting down; its attempt is interrupted (not counted
  // against recovery.max_restarts) rather than failed.
  void MarkLost(Worker& worker, const std::string& why, bool leaving = false);
  // Forgets the workers lost for longer than options_.forget_lost_s (WorkerInfo.lost_unix; Tick).
  void ForgetLongLostWorkers();
  // A rank exited with RANK_EXIT_HEALTH_CHECK: finds who is to blame from the attempt's
  // rendezvous keys (ranks that never arrived) and fails the attempt, excluding those workers.
  void HealthCheckFailed(Job& job, const furnace::v1::RankReport& report);
  // Keeps `worker_id` out of the job's placements (see Job::Exclusion); says so in an event.
  void Exclude(Job& job, const std::string& worker_id, const std::string& reason, bool lost);
  // Ends exclusions whose time is over or whose agent restarted (events say which and why).
  void ReleaseExclusions(Job& job);
  // Workers of the job's device kind neither lost nor excluded for the job (busy or free); lists
  // the ones left out, with why, in `left_out`.
  uint32_t HealthyWorkers(const Job& job, const PlacementScan::OfKind& kind,
                          std::string* left_out) const;
  // --reserve-after: the pending jobs submitted before `job` (same device kind) that have waited
  // options_.reserve_after_s or longer and could run on the kind's known workers (not lost): the
  // workers they need together, and how many they are (the first of kind.reserving). A pending
  // job starts only beyond those.
  struct Reserved {
    uint64_t workers = 0;
    size_t jobs = 0;
  };
  static Reserved ReservedByOlderPending(const Job& job, const PlacementScan::OfKind& kind);
  // The ids of the first `n` reserving jobs of the kind, for a message: the first kNamedReserved,
  // then how many more (a waiting reason naming a thousand jobs helps no one, and costs a
  // tick O(pending^2) bytes).
  static std::string ReservedNames(const PlacementScan::OfKind& kind, size_t n);
  static constexpr size_t kNamedReserved = 8;
  // Whether `job` is pending, has waited options_.reserve_after_s or longer, and could run on the
  // kind's known workers: the next workers to free up are then reserved for it.
  bool HoldsReservation(const Job& job) const;
  // The same with the kind's known workers counted already (WorkerRegistry::CountUsable).
  bool HoldsReservation(const Job& job, uint32_t known) const;
  // Backfill, as batch schedulers do it: a job that older pending jobs' reservations (the first
  // `reserved_jobs` of kind.reserving)
  // hold back starts anyway where it cannot hold one of them back past its shadow time: when, at
  // the latest, enough of the kind's workers are free for that job and every older reserved one,
  // beyond the recovering jobs' `ahead` (the busy workers free up by their jobs' time limits,
  // FreedByUnix). The job starts if its own limit frees its workers by the earliest shadow time,
  // or if it takes only workers spare at every one. A worker whose job has no time limit (or is
  // past it), or whose agent has not registered again since a restart, may never free up: past
  // it there is no shadow time, and no backfill. `free_all`: the kind's free workers;
  // `free_for_it`: those the job may use (not excluded for it). Returns the "backfill" event's
  // message, or nullopt and in `why_not` what stands in the way ("" when nothing to say).
  struct Backfill {
    std::optional<std::string> start;  // the "backfill" event's message
    std::string why_not;               // appended to the waiting reason
  };
  Backfill CheckBackfill(const Job& job, const PlacementScan::OfKind& kind, uint32_t world,
                         uint32_t free_all, uint32_t free_for_it, uint32_t ahead,
                         size_t reserved_jobs) const;
  // When the workers of `job`, whose time limit ends it at `deadline_unix`, are free again at the
  // latest: its ranks' checkpoint.stop_grace_s, then options_.stop_grace_s from SIGTERM to
  // SIGKILL, and kBackfillMarginS for the exits to be reported.
  double FreedByUnix(const Job& job, double deadline_unix) const;
  // The slots placement may use now for `device_kind` (excluded workers already marked unfree).
  static uint32_t FreeNow(const std::vector<WorkerSlot>& slots, const std::string& device_kind);
  // No allowed layout fits the workers left for recovery.wait_for_workers_s: the job ends FAILED.
  void FailUnfit(Job& job, const std::string& why);
  void CloseScope(Job& job, uint32_t attempt);
  // A failure FailAttempt could not record (a store error) whose trigger will not come again (a
  // worker already marked lost, a rank already marked gone): Tick's settle branch fails the
  // attempt with it at its next run, and again until the store takes it.
  // `interrupted`: it is an interruption (an agent leaving), which spends no restart.
  // Returns whether this failure is the one pending now (false: another was pending already).
  bool FailLater(Job& job, const std::string& kind, const std::string& cause,
                 const std::string& worker, bool interrupted);
  // Sets ranks_exited_unix once every rank of the attempt has ended (recovery_timing.cc).
  void NoteRanksExited(furnace::v1::AttemptInfo& attempt);
  // `attempt` (one of job.attempts) changed: the job's next write covers it even when it is older
  // than the newest two (Job::oldest_changed).
  static void NoteOlderAttemptChanged(Job& job, const furnace::v1::AttemptInfo& attempt);
  uint32_t Capacity(const std::string& device_kind) const;
  // One writer per checkpoint directory: FailedPrecondition naming the job that has not ended
  // whose checkpoint.dir is, contains or lies in `spec`'s.
  absl::Status OneWriter(const furnace::v1::JobSpec& spec, const std::string& filename) const;

  const ControllerOptions& options_;
  const Clock& clock_;
  JobStore& store_;
  GroupCommit& records_;
  WorkerRegistry& workers_;
  Rendezvous& rendezvous_;
  std::map<std::string, Job> jobs_;
  std::set<std::string> later_;  // jobs with changes not written yet (PersistLater)
  // Per job, successful exits written behind and not in the store yet, in the order recorded
  // (ReportRank). Kept here, not in Job, so no undo copy of a Job carries (and gives back) an
  // answer already given.
  std::map<std::string, std::vector<ExitWaiter>> unwritten_exits_;
  uint64_t exit_seq_ = 0;
  bool exits_abandoned_ = false;  // AbandonExitWaiters ran: exits are written at once again
  // Orders job writes: held while one is written (Persist, FlushLater), so a flush's copy, taken
  // under the state mutex and written without it, never lands after a newer Persist.
  std::mutex write_order_mu_;
  // The workers Shutdown stopped: their rank reports are no longer acted on, their agents get no
  // rank view.
  std::set<std::string> stopped_at_shutdown_;
  CheckpointHintSource hint_source_;
};

}  // namespace furnace::controller
