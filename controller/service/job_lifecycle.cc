// Jobs from submission to placement and cancel; failures and recovery are in recovery.cc.
#include "controller/service/job_lifecycle.h"

#include <algorithm>
#include <filesystem>
#include <limits>
#include <map>
#include <set>
#include <system_error>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "controller/spec/job_spec.h"
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

namespace fs = std::filesystem;
namespace v1 = furnace::v1;
using v1::JobState;

namespace {
// Backfill's allowance, beyond the stop graces, from a job's time limit to its workers reported
// free: the limit is acted on at a tick (later while a failure settles), and the exits' reports
// take their way here.
constexpr double kBackfillMarginS = 15.0;
}  // namespace

JobLifecycle::JobLifecycle(const ControllerOptions& options, const Clock& clock, JobStore& store,
                           GroupCommit& records, WorkerRegistry& workers, Rendezvous& rendezvous)
    : options_(options),
      clock_(clock),
      store_(store),
      records_(records),
      workers_(workers),
      rendezvous_(rendezvous) {}

absl::StatusOr<int> JobLifecycle::Load() {
  const double now = clock_.MonotonicSeconds();
  ASSIGN_OR_RETURN(auto jobs, store_.LoadJobs());
  int active = 0;
  // Whether the rank that holds each worker (below) belongs to a running attempt.
  std::map<std::string, bool> held_by_running;
  for (auto& stored : jobs) {
    Job& job = jobs_[stored.summary.job_id()];
    job.summary = std::move(stored.summary);
    job.spec = std::move(stored.spec);
    job.attempts = std::move(stored.attempts);
    job.attempt_started_mono = now;
    job.recover_at_mono = now;
    // A rank not known to have exited still occupies its worker, whatever its job's state
    // (a cancelled job's rank may still be stopping); its exit report frees the worker. Where
    // two ranks claim one worker (the exit of an attempt that is over is written behind, so a
    // controller that stopped before writing it left that rank unexited, while the rank placed
    // on the freed worker since was written at once), the running attempt's holds it, so its
    // worker's reports reach it; between ranks alike, the one loaded last (jobs by submission,
    // attempts ascending: the newer).
    for (const auto& attempt : job.attempts) {
      const bool running = attempt.state() == v1::ATTEMPT_STATE_RUNNING;
      for (const auto& rank : attempt.ranks()) {
        Worker* w = workers_.Find(rank.worker_id());
        if (w == nullptr || rank.state() == v1::RANK_STATE_EXITED) continue;
        if (w->has_rank && held_by_running[rank.worker_id()] && !running) continue;
        held_by_running[rank.worker_id()] = running;
        w->has_rank = true;
        w->attempt = attempt.attempt();
        w->info.set_job_id(job.summary.job_id());
        w->info.set_rank(rank.rank());
      }
    }
    if (IsFinal(job.summary.state())) continue;
    ++active;
    // The workers its failures were blamed on, as the controller before this one had them.
    job.suspect_workers = SuspectWorkers(job.attempts);
    // A job in its restart backoff keeps what is left of it (the failed attempt's
    // recover_at_unix): a controller restart must not turn a backoff meant to let a flapping
    // dependency recover into an immediate retry. Bounded by the backoff of the job's restart
    // count, should the wall clock have jumped.
    if (const auto* failed = job.current();
        failed != nullptr && job.summary.state() == v1::JOB_RECOVERING) {
      const double longest =
          BackoffDelay(job.spec.recovery().backoff(), std::max(1u, job.summary.restarts()));
      const double left = failed->recover_at_unix() - clock_.UnixSeconds();
      if (left > 0) job.recover_at_mono = now + std::min(left, longest);
    }
    if (auto* attempt = job.current(); attempt && attempt->state() == v1::ATTEMPT_STATE_RUNNING) {
      const Rendezvous::Scope scope{job.summary.job_id(), attempt->attempt()};
      std::set<std::string> workers;
      for (const auto& rank : attempt->ranks()) workers.insert(rank.worker_id());
      rendezvous_.OpenScope(scope, std::move(workers));
      ASSIGN_OR_RETURN(auto kv, store_.KvLoad(job.summary.job_id(), attempt->attempt()));
      for (auto& [key, value] : kv) rendezvous_.Set(scope, key, value);
    }
    // (A pending or recovering job has no ranks out there to re-attach.)
    const v1::AttemptInfo* current = job.current();
    Event(job, "controller",
          current != nullptr && current->state() == v1::ATTEMPT_STATE_RUNNING
              ? "controller restarted; waiting for the job's workers to re-attach"
              : "controller restarted");
  }
  for (auto& [id, w] : workers_.workers()) {
    if (w.info.state() != v1::WORKER_STATE_LOST)
      w.info.set_state(w.has_rank ? v1::WORKER_STATE_BUSY : v1::WORKER_STATE_READY);
  }
  return active;
}

void JobLifecycle::Forget(const std::string& job_id) {
  jobs_.erase(job_id);
  unwritten_exits_.erase(job_id);
}

Job* JobLifecycle::Find(const std::string& job_id) {
  auto it = jobs_.find(job_id);
  return it == jobs_.end() ? nullptr : &it->second;
}

// ---------------------------------------------------------------------------------------------
// Persistence helpers

uint64_t JobLifecycle::StepNow(const Job& job) {
  return job.step_stale && job.current() != nullptr ? ProgressOf(job) : job.summary.step();
}

v1::JobSummary JobLifecycle::SummaryNow(const Job& job) {
  v1::JobSummary s = job.summary;
  s.set_step(StepNow(job));
  if (s.state() == v1::JOB_PENDING || s.state() == v1::JOB_RECOVERING) {
    s.set_waiting(job.waiting_reason);
  }
  s.set_deadline_unix(DeadlineUnix(job));
  return s;
}

uint64_t JobLifecycle::ProgressOf(const Job& job) {
  const v1::AttemptInfo& attempt = *job.current();
  uint64_t min_step = UINT64_MAX;
  bool all_known = true;
  for (const auto& r : attempt.ranks()) {
    min_step = std::min<uint64_t>(min_step, r.step());
    // A rank of a restarted attempt says where it starts when it has restored its checkpoint
    // (step > 0), or found none (its start-up record: checkpoint_load_unix).
    all_known = all_known && (r.step() > 0 || r.checkpoint_load_unix() > 0);
  }
  if (attempt.ranks_size() == 0) return job.summary.step();
  // Until then the job has not lost its progress: a restart does not show 0/N while it starts.
  // (A train rank says where it starts; other kinds start from 0, reporting as they go.)
  if (!all_known && attempt.attempt() > 1 && job.spec.kind() == "train") {
    return job.summary.step();
  }
  return min_step;
}

absl::Status JobLifecycle::Persist(Job& job) {
  job.summary.set_updated_unix(clock_.UnixSeconds());
  job.summary.set_step(StepNow(job));
  job.step_stale = false;
  std::lock_guard<std::mutex> order(write_order_mu_);  // after a flush of an older copy
  absl::Status s = store_.Transaction([&]() -> absl::Status {
    RETURN_IF_ERROR(store_.PutSummary(job.summary));
    for (size_t i = job.FirstAttemptToWrite(); i < job.attempts.size(); ++i) {
      RETURN_IF_ERROR(store_.PutAttempt(job.summary.job_id(), job.attempts[i]));
    }
    return absl::OkStatus();
  });
  if (s.ok()) {
    later_.erase(job.summary.job_id());
    job.oldest_changed = SIZE_MAX;
    ReleaseExits(job.summary.job_id());  // every exit recorded so far was in this write
  }
  return s;
}

void JobLifecycle::AbandonExitWaiters() {
  exits_abandoned_ = true;
  // The exits stay listed as unwritten: one sent again is written at once (ReportRank).
  for (auto& [id, waiters] : unwritten_exits_) {
    for (ExitWaiter& w : waiters) {
      if (ReportDone done = std::exchange(w.done, nullptr)) {
        done(absl::UnavailableError(
            "the controller shut down before the exit was recorded; send it again"));
      }
    }
  }
}

void JobLifecycle::ReleaseExits(const std::string& job_id, uint64_t seq) {
  auto it = unwritten_exits_.find(job_id);
  if (it == unwritten_exits_.end()) return;
  std::vector<ExitWaiter>& waiters = it->second;
  std::vector<ExitWaiter> written;
  auto first_left = std::stable_partition(waiters.begin(), waiters.end(),
                                          [&](const ExitWaiter& w) { return w.seq <= seq; });
  written.assign(std::make_move_iterator(waiters.begin()), std::make_move_iterator(first_left));
  waiters.erase(waiters.begin(), first_left);
  if (waiters.empty()) unwritten_exits_.erase(it);
  for (ExitWaiter& w : written) {
    workers_.Free(w.worker_id, job_id, w.attempt, w.rank);
    if (w.done) w.done(absl::OkStatus());
  }
}

void JobLifecycle::NoteOlderAttemptChanged(Job& job, const v1::AttemptInfo& attempt) {
  const size_t index = static_cast<size_t>(&attempt - job.attempts.data());
  if (index < job.attempts.size()) job.oldest_changed = std::min(job.oldest_changed, index);
}

void JobLifecycle::PersistLater(const std::set<std::string>& job_ids) {
  later_.insert(job_ids.begin(), job_ids.end());
}

void JobLifecycle::FlushLater(std::unique_lock<std::mutex>& state_lock) {
  if (later_.empty()) return;
  // Copied under the state mutex, written without it: an fsync must not stall every RPC. A
  // transition written meanwhile (Persist) waits on write_order_mu_, so it lands after this older
  // copy, never before it.
  struct Copy {
    v1::JobSummary summary;
    std::vector<v1::AttemptInfo> attempts;  // from FirstAttemptToWrite, as Persist writes them
    size_t first = 0;                       // the index of attempts[0]
    uint64_t exits_to = 0;                  // exits recorded up to here are in this copy
  };
  std::vector<Copy> copies;
  const std::set<std::string> ids = std::move(later_);
  later_.clear();
  for (const auto& id : ids) {
    auto it = jobs_.find(id);
    if (it == jobs_.end()) continue;
    Job& job = it->second;
    job.summary.set_step(StepNow(job));
    job.step_stale = false;
    job.summary.set_updated_unix(clock_.UnixSeconds());
    Copy c{job.summary, {}, job.FirstAttemptToWrite(), exit_seq_};
    for (size_t i = c.first; i < job.attempts.size(); ++i) c.attempts.push_back(job.attempts[i]);
    job.oldest_changed = SIZE_MAX;  // in this copy; marked again below if it is not written
    copies.push_back(std::move(c));
  }
  std::unique_lock<std::mutex> order(write_order_mu_);
  state_lock.unlock();
  const absl::Status s = store_.Transaction([&]() -> absl::Status {
    for (const Copy& c : copies) {
      RETURN_IF_ERROR(store_.PutSummary(c.summary));
      for (const auto& a : c.attempts) RETURN_IF_ERROR(store_.PutAttempt(c.summary.job_id(), a));
    }
    return absl::OkStatus();
  });
  order.unlock();
  state_lock.lock();
  if (s.ok()) {
    for (const Copy& c : copies) ReleaseExits(c.summary.job_id(), c.exits_to);
    return;
  }
  // Marked again: the next flush tries again (the exits' answers wait for it).
  spdlog::warn("{} job(s)' progress not recorded yet: {}", ids.size(), s.ToString());
  later_.insert(ids.begin(), ids.end());
  for (const Copy& c : copies) {
    auto it = jobs_.find(c.summary.job_id());
    if (it != jobs_.end()) it->second.oldest_changed = std::min(it->second.oldest_changed, c.first);
  }
}

void JobLifecycle::Event(Job& job, const std::string& kind, const std::string& message) {
  v1::JobEvent event;
  event.set_unix_time(clock_.UnixSeconds());
  event.set_kind(kind);
  event.set_message(message);
  // Events quote what callers and ranks sent (file names, the paths a job names, a rank's
  // reason): escaped for the log, where a control character could forge a line.
  spdlog::info("job {}: [{}] {}", job.summary.job_id(), kind, EscapeForLog(message));
  // Written behind (an fsync each, under the state mutex, before): an event is a record of what
  // happened, written in order, and promises nothing to anyone waiting.
  records_.Submit([this, id = job.summary.job_id(), event] { return store_.AddEvent(id, event); },
                  [id = job.summary.job_id()](absl::Status s) {
                    if (!s.ok()) spdlog::error("job {}: cannot record event: {}", id, s.ToString());
                  });
}

absl::Status JobLifecycle::Transition(Job& job, JobState to, const std::string& event_kind,
                                      const std::string& message) {
  RETURN_IF_ERROR(CheckTransition(job.summary.state(), to));
  const JobState from = job.summary.state();
  job.summary.set_state(to);
  if (absl::Status s = Persist(job); !s.ok()) {
    job.summary.set_state(from);
    spdlog::error("job {}: transition to {} not persisted: {}", job.summary.job_id(), StateName(to),
                  s.ToString());
    return s;
  }
  Event(job, event_kind,
        absl::StrCat(StateName(from), " -> ", StateName(to), message.empty() ? "" : ": ", message));
  return absl::OkStatus();
}

uint32_t JobLifecycle::Capacity(const std::string& device_kind) const {
  const uint32_t known = workers_.CountUsable(device_kind);
  const uint32_t local = device_kind == "cpu" ? options_.local_workers : 0;
  return std::max(known, local);
}

// ---------------------------------------------------------------------------------------------
// Submit, cancel, progress

namespace {

// A checkpoint.dir as compared (lexically normal, no trailing slash).
std::string NormalDir(const std::string& path) {
  std::string s = fs::path(path).lexically_normal().string();
  while (s.size() > 1 && s.back() == '/') s.pop_back();
  return s;
}

// Whether normal directory `dir` is `parent` or lies under it (whole components: /a/bc is not
// under /a/b).
bool IsWithin(const std::string& dir, const std::string& parent) {
  if (dir.empty() || parent.empty()) return false;
  if (dir == parent) return true;
  const std::string prefix = parent == "/" ? parent : parent + "/";
  return dir.compare(0, prefix.size(), prefix) == 0;
}

// The spellings of a directory the checkpoint checks compare: its lexically normal form and, where
// it differs, the form with the symlinks of its existing part resolved on this machine (a link to
// another job's directory is that directory). Empty for an empty path.
std::vector<std::string> DirSpellings(const std::string& path) {
  const std::string normal = NormalDir(path);
  if (normal.empty()) return {};
  std::vector<std::string> out{normal};
  std::error_code ec;
  const fs::path resolved = fs::weakly_canonical(fs::path(path), ec);
  if (!ec && NormalDir(resolved.string()) != normal) out.push_back(NormalDir(resolved.string()));
  return out;
}

// Whether a spelling of `dir` is a spelling of `parent` or lies under one.
bool IsWithinAny(const std::vector<std::string>& dir, const std::vector<std::string>& parent) {
  for (const std::string& d : dir) {
    for (const std::string& p : parent) {
      if (IsWithin(d, p)) return true;
    }
  }
  return false;
}

}  // namespace

absl::Status JobLifecycle::CheckSubmit(v1::JobSpec& spec, const std::string& filename,
                                       std::vector<std::string>& given) const {
  const uint32_t world = spec::WorldSize(spec);
  const uint32_t capacity = Capacity(spec.resources().device());
  if (world > capacity) {
    const std::string& kind = spec.resources().device();
    if (capacity == 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: resources.device: no %s worker has registered with this controller, and the job "
          "needs %d (pp*dp*tp = %d*%d*%d); start workers of that kind (furnace-worker "
          "--device-kind %s), or choose a device its workers have",
          filename, kind, world, spec.parallel().pp(), spec.parallel().dp(), spec.parallel().tp(),
          kind));
    }
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: resources.workers: the job needs %d ranks (pp*dp*tp = %d*%d*%d) but this controller "
        "has %d %s worker%s; allowed: at most %d",
        filename, world, spec.parallel().pp(), spec.parallel().dp(), spec.parallel().tp(), capacity,
        kind, capacity == 1 ? "" : "s", capacity));
  }
  // The cluster's time limits (--max-time-limit, --default-time-limit). A file that leaves
  // resources.time_limit_s out gets the default (else the maximum); one that writes 0 (none) keeps
  // it where there is no maximum, and is refused where there is one, as is a limit above it.
  const bool asked = spec.resources().has_time_limit_s();
  const double asked_limit = spec.resources().time_limit_s();
  const double max_limit = options_.max_time_limit_s;
  const double default_limit =
      options_.default_time_limit_s > 0 ? options_.default_time_limit_s : max_limit;
  if (max_limit > 0 && asked && (asked_limit <= 0 || asked_limit > max_limit)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: resources.time_limit_s: %s is more than this controller allows (--max-time-limit "
        "%s s); allowed: more than 0 and at most %s, or leave it out for the controller's %s "
        "(%s s)",
        filename, asked_limit <= 0 ? "0 (no limit)" : ShortestDecimal(asked_limit) + " s",
        ShortestDecimal(max_limit), ShortestDecimal(max_limit),
        options_.default_time_limit_s > 0 ? "default" : "maximum", ShortestDecimal(default_limit)));
  }
  if (!asked && default_limit > 0) {
    spec.mutable_resources()->set_time_limit_s(default_limit);
    given.push_back(absl::StrCat(
        "resources.time_limit_s ", ShortestDecimal(default_limit), " s from the controller's ",
        options_.default_time_limit_s > 0 ? "--default-time-limit" : "--max-time-limit"));
  }
  // A limit an agent heart-beating at this controller's interval could miss with nothing wrong.
  const double heartbeat_timeout = spec.recovery().heartbeat_timeout_s();
  const double min_timeout = 2 * options_.heartbeat_interval_s;
  if (heartbeat_timeout > 0 && heartbeat_timeout < min_timeout) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: recovery.heartbeat_timeout_s: %g s is shorter than two heartbeats of this "
        "controller's agents (every %g s); allowed: at least %g, or leave it out for the "
        "controller's --worker-timeout (%g s)",
        filename, heartbeat_timeout, options_.heartbeat_interval_s, min_timeout,
        options_.worker_timeout_s));
  }
  // The directories the controller gives jobs without a checkpoint.dir: reserved, so no job can
  // name (and fill) one before the job it belongs to exists, which would then resume from it.
  const fs::path defaults = DefaultCheckpointParent();
  const bool named = !spec.checkpoint().dir().empty();
  if (named) {
    // Without --checkpoint-root (which resolves a relative path under itself) a relative path
    // would be resolved against each worker's own working directory: a different directory per
    // machine, and none the one-writer check below could compare.
    if (options_.checkpoint_root.empty() && fs::path(spec.checkpoint().dir()).is_relative()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: checkpoint.dir %s is a relative path, which each worker would resolve against its "
          "own working directory; allowed: an absolute path (or start the controller with "
          "--checkpoint-root, under which relative paths are resolved)",
          filename, spec.checkpoint().dir()));
    }
    const std::vector<std::string> dir = DirSpellings(spec.checkpoint().dir());
    const std::vector<std::string> root = DirSpellings(options_.checkpoint_root);
    if (std::any_of(dir.begin(), dir.end(), [&](const std::string& d) {
          return std::find(root.begin(), root.end(), d) != root.end();
        })) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: checkpoint.dir %s is --checkpoint-root itself, which holds every job's directory; "
          "allowed: a directory under it",
          filename, spec.checkpoint().dir()));
    }
    const std::vector<std::string> reserved = DirSpellings(defaults.string());
    // The default directory of a job that exists (its id is taken, so no later job gets it) may be
    // named to continue that job's run, in another layout or with other settings; the one-writer
    // check below still holds it while that job has not ended.
    // Every spelling inside the reserved directory must be `<reserved>/<id>` of one job, and the
    // directory must be that job's own (it may have named another): a symlink there leads nowhere
    // else, and naming a job's id continues that job.
    std::string id_named;
    bool only_that_job = true;
    for (const std::string& d : dir) {
      for (const std::string& r : reserved) {
        if (!IsWithin(d, r)) continue;
        const fs::path rel = fs::path(d).lexically_relative(r);
        const bool one_name =
            !rel.empty() && rel == rel.filename() && rel.string() != "." && rel.string() != "..";
        if (!one_name || (!id_named.empty() && id_named != rel.string())) only_that_job = false;
        if (one_name) id_named = rel.string();
      }
    }
    bool existing_default = false;
    if (only_that_job && !id_named.empty()) {
      if (const auto it = jobs_.find(id_named); it != jobs_.end()) {
        const std::vector<std::string> theirs = DirSpellings(it->second.spec.checkpoint().dir());
        existing_default = std::any_of(dir.begin(), dir.end(), [&](const std::string& d) {
          return std::find(theirs.begin(), theirs.end(), d) != theirs.end();
        });
      }
    }
    if (!existing_default && (IsWithinAny(dir, reserved) || IsWithinAny(reserved, dir))) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: checkpoint.dir %s is %s %s, where the controller puts the checkpoints of jobs "
          "that name none; allowed: a directory outside it, an existing job's own directory "
          "there (to continue that job's run), or leave checkpoint.dir out",
          filename, spec.checkpoint().dir(), IsWithinAny(dir, reserved) ? "under" : "around",
          defaults.string()));
    }
  }
  // One writer per checkpoint directory (OneWriter). A named directory is checked before the job
  // takes a number (a refused submit uses none); a default one, once it has its id (Submit).
  if (named) RETURN_IF_ERROR(OneWriter(spec, filename));
  return absl::OkStatus();
}

absl::Status JobLifecycle::OneWriter(const v1::JobSpec& spec, const std::string& filename) const {
  // Two jobs committing into one directory (or one inside the other's) would uncommit and delete
  // each other's steps. A job that has ended but whose ranks are still stopping only delays the
  // start (TryStart).
  const Job* other =
      CheckpointDirUser(nullptr, spec.checkpoint().dir(), CheckpointDirUse::kNotEnded);
  if (other == nullptr) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrFormat(
      "%s: checkpoint.dir %s is in use by job %s (%s, checkpoint.dir %s): two jobs committing "
      "into one directory (or one inside the other) would uncommit and delete each other's "
      "checkpoints; allowed: another directory, or this one once %s has ended (furnace cancel "
      "%s)",
      filename, spec.checkpoint().dir(), other->summary.job_id(), StateName(other->summary.state()),
      other->spec.checkpoint().dir(), other->summary.job_id(), other->summary.job_id()));
}

absl::StatusOr<std::string> JobLifecycle::Submit(v1::JobSpec spec, const std::string& filename,
                                                 std::vector<std::string>* filled_in) {
  std::vector<std::string> given;  // what the file left out and the controller filled in
  RETURN_IF_ERROR(CheckSubmit(spec, filename, given));
  const uint32_t world = spec::WorldSize(spec);
  ASSIGN_OR_RETURN(uint64_t seq, store_.NextJobSeq());
  const std::string id = absl::StrCat(spec.name(), "-", seq);
  if (spec.checkpoint().dir().empty()) {
    spec.mutable_checkpoint()->set_dir((DefaultCheckpointParent() / id).string());
    RETURN_IF_ERROR(OneWriter(spec, filename));
  }
  Job job;
  job.spec = std::move(spec);
  auto& s = job.summary;
  s.set_job_id(id);
  s.set_name(job.spec.name());
  s.set_kind(job.spec.kind());
  s.set_state(v1::JOB_PENDING);
  s.set_world_size(world);
  // Known from the spec before a rank reports it (a pending job shows 0/N, not 0).
  if (job.spec.kind() == "train") s.set_total_steps(job.spec.train().steps());
  s.set_submitted_unix(clock_.UnixSeconds());
  s.set_updated_unix(s.submitted_unix());
  RETURN_IF_ERROR(store_.PutJob(s, job.spec));
  auto [it, inserted] = jobs_.emplace(id, std::move(job));
  Event(it->second, "submitted",
        absl::StrCat("from ", filename, ", ", world, world == 1 ? " rank" : " ranks",
                     given.empty() ? "" : "; ", absl::StrJoin(given, "; ")));
  TryStart(it->second);
  if (filled_in != nullptr) *filled_in = std::move(given);
  return id;
}

fs::path JobLifecycle::DefaultCheckpointParent() const {
  // Under --checkpoint-root when there is one (the workers refuse anything outside it).
  return options_.checkpoint_root.empty() ? fs::path(options_.state_dir) / "checkpoints"
                                          : fs::path(options_.checkpoint_root) / "jobs";
}

namespace {

// A job's checkpoint.dir spellings (DirSpellings), worked out once per job.
const std::vector<std::string>& SpellingsOf(const Job& job) {
  if (!job.checkpoint_dir_spelled) {
    job.checkpoint_dir_spellings = DirSpellings(job.spec.checkpoint().dir());
    job.checkpoint_dir_spelled = true;
  }
  return job.checkpoint_dir_spellings;
}

std::vector<std::string> SpellingsFor(const Job* self, const std::string& dir) {
  return self != nullptr && dir == self->spec.checkpoint().dir() ? SpellingsOf(*self)
                                                                 : DirSpellings(dir);
}

bool SameTree(const std::vector<std::string>& want, const Job& other) {
  const std::vector<std::string>& theirs = SpellingsOf(other);
  return IsWithinAny(want, theirs) || IsWithinAny(theirs, want);
}

}  // namespace

const Job* JobLifecycle::CheckpointDirUser(const Job* self, const std::string& dir,
                                           CheckpointDirUse use) const {
  if (use == CheckpointDirUse::kRanksRunning) {
    // A job's ranks may outlive it (a cancelled or failed job's are being stopped, and a single
    // rank stopped writes its final checkpoint): the workers that are not lost say which still
    // hold one.
    std::set<std::string> holding;
    for (const auto& [id, worker] : workers_.workers()) {
      if (worker.has_rank && worker.info.state() != v1::WORKER_STATE_LOST) {
        holding.insert(worker.info.job_id());
      }
    }
    return CheckpointDirUser(self, dir, holding);
  }
  const std::vector<std::string> want = SpellingsFor(self, dir);
  if (want.empty()) return nullptr;
  for (const auto& [id, other] : jobs_) {
    // (Ended ones are passed over before the comparison, which reads the filesystem.)
    if (&other != self && !IsFinal(other.summary.state()) && SameTree(want, other)) return &other;
  }
  return nullptr;
}

const Job* JobLifecycle::CheckpointDirUser(const Job* self, const std::string& dir,
                                           const std::set<std::string>& holding) const {
  const std::vector<std::string> want = SpellingsFor(self, dir);
  if (want.empty()) return nullptr;
  for (const std::string& id : holding) {  // in id order, as a scan of every job
    const auto it = jobs_.find(id);
    if (it != jobs_.end() && &it->second != self && SameTree(want, it->second)) return &it->second;
  }
  return nullptr;
}

absl::StatusOr<v1::JobSummary> JobLifecycle::Cancel(const std::string& job_id) {
  Job* found = Find(job_id);
  if (found == nullptr) return absl::NotFoundError(absl::StrCat("no job '", job_id, "'"));
  Job& job = *found;
  if (IsFinal(job.summary.state())) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", job_id, " already ended (", StateName(job.summary.state()), ")"));
  }
  const Job backup = job;
  if (auto* attempt = job.current(); attempt && attempt->state() == v1::ATTEMPT_STATE_RUNNING) {
    attempt->set_state(v1::ATTEMPT_STATE_CANCELLED);
    attempt->set_cause("cancelled by user");
    attempt->set_ended_unix(clock_.UnixSeconds());
  }
  job.summary.set_cause("cancelled by user");
  if (absl::Status s = Transition(job, v1::JOB_CANCELLED, "cancelled", "cancelled by user");
      !s.ok()) {
    job = backup;
    return s;
  }
  StopAttemptRanks(job, "job cancelled", /*keep_progress=*/true);
  if (auto* attempt = job.current()) CloseScope(job, attempt->attempt());
  return job.summary;
}

void JobLifecycle::NoteCheckpointFailure(Job& job, uint64_t step, const std::string& error) {
  Event(job, "checkpoint_failed",
        absl::StrCat("the checkpoint after step ", step,
                     " was not committed (training goes on; the previous one stays): ", error));
}

void JobLifecycle::NoteCheckpointRestored(Job& job, const std::string& account) {
  Event(job, "checkpoint_restored", account);
}

bool JobLifecycle::HeldBy(const Job& job, uint32_t attempt, uint32_t rank,
                          const std::string& worker_id) {
  if (worker_id.empty()) return true;
  if (attempt == 0 || attempt > job.attempts.size()) return false;
  const v1::AttemptInfo& a = job.attempts[attempt - 1];
  if (rank >= static_cast<uint32_t>(a.ranks_size())) return false;
  const std::string& placed = a.ranks(static_cast<int>(rank)).worker_id();
  return placed.empty() || placed == worker_id;
}

bool JobLifecycle::NoteProgress(Job& job, const v1::TelemetryRecord& rec) {
  if (rec.attempt() == 0 || rec.attempt() > job.attempts.size()) return false;
  auto& attempt = job.attempts[rec.attempt() - 1];
  if (rec.rank() >= static_cast<uint32_t>(attempt.ranks_size())) return false;
  v1::RankInfo& rank = *attempt.mutable_ranks(rec.rank());
  if (rec.seq() > 0) {
    if (rec.seq() <= rank.telemetry_seq()) return false;  // a re-sent batch brought it again
    rank.set_telemetry_seq(rec.seq());
  }
  // Never back within an attempt: after a controller restart a rank's step may come from its
  // stored steps (NoteStoredStep) while its agent re-sends records older than those, whose seq is
  // above the one written behind.
  rank.set_step(std::max(rank.step(), rec.step()));
  // A late batch of an attempt before the newest two is written as well: its ranks' steps feed
  // the no-progress rule after a controller restart, and their sequence numbers the dedup.
  NoteOlderAttemptChanged(job, attempt);
  if (&attempt == job.current()) {
    job.step_stale = true;
    job.summary.set_total_steps(std::max(job.summary.total_steps(), rec.total_steps()));
  }
  return true;
}

void JobLifecycle::NoteStoredStep(Job& job, const v1::StepRecord& step) {
  if (step.attempt() == 0 || step.attempt() > job.attempts.size()) return;
  v1::AttemptInfo& attempt = job.attempts[step.attempt() - 1];
  if (attempt.ranks_size() == 0 || step.ranks() < static_cast<uint32_t>(attempt.ranks_size())) {
    return;  // stored without every rank (some rank's record never came): not their progress
  }
  for (v1::RankInfo& rank : *attempt.mutable_ranks()) {
    if (rank.step() < step.step()) rank.set_step(step.step());
  }
  if (&attempt == job.current() && job.summary.step() < step.step()) {
    job.summary.set_step(step.step());
  }
}

// ---------------------------------------------------------------------------------------------
// Placement

namespace {

// The memory policy of the attempt about to start (train jobs only): the spec's for the first
// attempt; after a rank ran out of activation memory the next rung of EscalatedMemoryPolicy (a
// replayed spike would fail the same way again); after any other failure the previous attempt's.
std::string NextAttemptMemoryPolicy(const Job& job) {
  if (job.spec.kind() != "train") return "";
  const std::string& spec_policy = job.spec.memory().policy();
  const v1::AttemptInfo* last = job.current();
  if (last == nullptr || last->memory_policy().empty()) {
    return spec_policy.empty() ? "none" : spec_policy;
  }
  if (!last->activation_oom()) return last->memory_policy();
  return EscalatedMemoryPolicy(last->memory_policy(), job.spec.memory().device_budget())
      .value_or(last->memory_policy());
}

}  // namespace

bool JobLifecycle::HoldsReservation(const Job& job, uint32_t known) const {
  // A job needing more workers than are known could never start: reserving for it would idle
  // them.
  return options_.reserve_after_s > 0 && job.summary.state() == v1::JOB_PENDING &&
         clock_.UnixSeconds() - job.summary.submitted_unix() >= options_.reserve_after_s &&
         job.summary.world_size() <= known;
}

bool JobLifecycle::HoldsReservation(const Job& job) const {
  return HoldsReservation(job, workers_.CountUsable(job.spec.resources().device()));
}

JobLifecycle::Reserved JobLifecycle::ReservedByOlderPending(const Job& job,
                                                            const PlacementScan::OfKind& kind) {
  const std::pair<double, std::string> mine{job.summary.submitted_unix(), job.summary.job_id()};
  const auto end =
      std::lower_bound(kind.reserving.begin(), kind.reserving.end(), mine,
                       [](const auto& entry, const std::pair<double, std::string>& key) {
                         return entry.first < key;
                       });
  const auto n = static_cast<size_t>(end - kind.reserving.begin());
  return {.workers = kind.reserved_before.empty() ? 0 : kind.reserved_before[n], .jobs = n};
}

std::string JobLifecycle::ReservedNames(const PlacementScan::OfKind& kind, size_t n) {
  std::string out;
  for (size_t i = 0; i < std::min(n, kNamedReserved); ++i) {
    absl::StrAppend(&out, i > 0 ? ", " : "", kind.reserving[i].first.second);
  }
  if (n > kNamedReserved) absl::StrAppend(&out, " and ", n - kNamedReserved, " more");
  return out;
}

const JobLifecycle::PlacementScan::OfKind& JobLifecycle::PlacementScan::Of(
    const std::string& device_kind) const {
  static const OfKind kNone;
  const auto it = kinds.find(device_kind);
  return it == kinds.end() ? kNone : it->second;
}

namespace {

// Known from the store and not registered again since this controller started (within the
// re-attach grace it is not lost: it is expected back).
bool AwaitingRegistration(const Worker& w) {
  return w.info.state() != v1::WORKER_STATE_LOST && !w.seen->in_session.load();
}

}  // namespace

JobLifecycle::PlacementScan JobLifecycle::ScanForPlacement() const {
  PlacementScan scan;
  scan.slots = workers_.Slots();
  for (const WorkerSlot& slot : scan.slots) scan.kinds[slot.device_kind].free += slot.free;
  for (const auto& [id, w] : workers_.workers()) {
    PlacementScan::OfKind& kind = scan.kinds[w.info.device_kind()];
    const bool lost = w.info.state() == v1::WORKER_STATE_LOST;
    if (w.has_rank) ++kind.holders[w.info.job_id()];
    if (lost) {
      kind.lost.emplace_back(id, w.info.left());
      continue;
    }
    ++kind.usable;
    if (w.has_rank) scan.holding.insert(w.info.job_id());
    if (AwaitingRegistration(w)) {
      ++kind.unregistered;
    } else if (w.has_rank) {
      ++kind.busy[w.info.job_id()];
    }
  }
  // The recovering jobs' claims, and the pending jobs holding reservations (oldest first).
  for (const auto& [id, job] : jobs_) {
    PlacementScan::OfKind& kind = scan.kinds[job.spec.resources().device()];
    if (job.summary.state() == v1::JOB_RECOVERING) {
      const v1::AttemptInfo* last = job.current();
      kind.claimed += last != nullptr ? LayoutWorld(last->parallel()) : job.summary.world_size();
      kind.claimed_by.push_back(id);
    } else if (HoldsReservation(job, kind.usable)) {
      kind.reserving.push_back({{job.summary.submitted_unix(), id}, job.summary.world_size()});
    }
  }
  for (auto& [name, kind] : scan.kinds) {
    std::sort(kind.reserving.begin(), kind.reserving.end());
    kind.reserved_before.assign(1, 0);
    for (const auto& entry : kind.reserving) {
      kind.reserved_before.push_back(kind.reserved_before.back() + entry.second);
    }
    if (kind.claimed == 0) continue;
    // Free, or about to be for the recovering jobs: draining one of their ranks, or known from
    // the store and not registered again yet (not lost).
    kind.free_or_freeing = kind.unregistered;
    for (const auto& [id, w] : workers_.workers()) {
      if (w.info.device_kind() != name || w.info.state() == v1::WORKER_STATE_LOST ||
          AwaitingRegistration(w)) {
        continue;
      }
      if (!w.has_rank) {
        kind.free_or_freeing += w.info.state() == v1::WORKER_STATE_READY ? 1 : 0;
      } else if (std::find(kind.claimed_by.begin(), kind.claimed_by.end(), w.info.job_id()) !=
                 kind.claimed_by.end()) {
        ++kind.free_or_freeing;
      }
    }
  }
  return scan;
}

double JobLifecycle::FreedByUnix(const Job& job, double deadline_unix) const {
  return deadline_unix + v1::StopCheckpointGraceS(job.spec) + options_.stop_grace_s +
         kBackfillMarginS;
}

JobLifecycle::Backfill JobLifecycle::CheckBackfill(const Job& job,
                                                   const PlacementScan::OfKind& kind,
                                                   uint32_t world, uint32_t free_all,
                                                   uint32_t free_for_it, uint32_t ahead,
                                                   size_t reserved_jobs) const {
  Backfill out;
  if (free_for_it < ahead + world) return out;  // it does not fit now anyway
  const double now = clock_.UnixSeconds();
  constexpr double kNever = std::numeric_limits<double>::infinity();
  const auto find = [&](const std::string& id) -> const Job* {
    const auto it = jobs_.find(id);
    return it == jobs_.end() ? nullptr : &it->second;
  };
  // When each busy worker of the kind is free again at the latest; one we cannot tell that of
  // (its job has no time limit, is past it, or is gone; its agent has not registered again since
  // a restart) never, as far as backfill goes.
  const uint32_t unregistered = kind.unregistered;
  std::vector<std::pair<double, uint32_t>> frees;  // (free by, workers)
  std::vector<std::string> unknown;                // why some never are, as far as we know
  for (const auto& [id, n] : kind.busy) {
    const Job* other = find(id);
    double by = kNever;
    if (other == nullptr) {
      unknown.push_back(absl::StrCat("job ", id, " (forgotten) still holds ", n));
    } else if (IsFinal(other->summary.state())) {
      // Stopping since its attempt ended: free by then plus the graces.
      const v1::AttemptInfo* attempt = other->current();
      const double ended = attempt != nullptr && attempt->ended_unix() > 0
                               ? attempt->ended_unix()
                               : other->summary.updated_unix();
      by = FreedByUnix(*other, ended);
      if (by < now) unknown.push_back(absl::StrCat("job ", id, " is stopping past its graces"));
    } else if (const double deadline = DeadlineUnix(*other); deadline > 0) {
      by = FreedByUnix(*other, deadline);
      if (by < now) unknown.push_back(absl::StrCat("job ", id, " is past its time limit"));
    } else {
      unknown.push_back(absl::StrCat("job ", id, " has no resources.time_limit_s"));
    }
    if (by < now) by = kNever;
    frees.emplace_back(by, n);
  }
  if (unregistered > 0) {
    frees.emplace_back(kNever, unregistered);
    unknown.push_back(absl::StrCat(unregistered,
                                   unregistered == 1 ? " worker has" : " workers have",
                                   " not registered again since the controller started"));
  }
  std::sort(frees.begin(), frees.end());
  // The reserved jobs, oldest first (the order they start in): each may start once the workers
  // for it and every older one are free (its shadow time), and the job must hold none of those
  // then: it ends by the shadow time, or takes only workers spare at it.
  if (reserved_jobs == 0) return out;  // (none to hold back: not called so)
  double shadow = kNever;              // the earliest of the shadow times
  int64_t spare = INT64_MAX;           // the fewest workers spare at its own shadow time
  uint32_t reserved = 0;
  int64_t available = int64_t{free_all} - ahead;
  double at = now;
  size_t next = 0;
  for (size_t i = 0; i < reserved_jobs; ++i) {
    reserved += kind.reserving[i].second;
    while (available < reserved && next < frees.size()) {
      at = frees[next].first;
      available += frees[next++].second;
    }
    // Its start is unknown: no worker is spare for sure. (A job ending by the oldest's shadow time
    // is still safe: the younger reserved jobs start after it.)
    if (available < reserved || at == kNever) {
      spare = -1;
      break;
    }
    // Workers freed at the same time count as spare at it too.
    while (next < frees.size() && frees[next].first == at) available += frees[next++].second;
    shadow = std::min(shadow, at);
    spare = std::min(spare, available - int64_t{reserved});
  }
  const std::string& oldest = kind.reserving.front().first.second;
  const std::string them =
      absl::StrCat("job", reserved_jobs == 1 ? " " : "s ", ReservedNames(kind, reserved_jobs));
  const double limit = job.spec.resources().time_limit_s();
  const double ends_by = limit > 0 ? FreedByUnix(job, now + limit) : kNever;
  if (shadow != kNever && ends_by <= shadow) {
    out.start = absl::StrFormat(
        "backfilled beside %s's reservation: resources.time_limit_s %s ends it by %s, before "
        "the workers for job %s are free (by %s at the latest, as the jobs on them end)",
        them, ShortestDecimal(limit), UnixClock(ends_by), oldest, UnixClock(shadow));
    return out;
  }
  if (spare >= world) {  // (every reserved job's shadow time is known)
    out.start = absl::StrFormat(
        "backfilled beside %s's reservation: it takes %d worker%s beyond what the reserved "
        "jobs need once enough are free for them (by %s at the latest, as the jobs on them end)",
        them, world, world == 1 ? "" : "s", UnixClock(shadow));
    return out;
  }
  if (shadow == kNever) {
    if (!unknown.empty()) {
      out.why_not = absl::StrCat("; no backfill: when the reserved workers free up is unknown (",
                                 absl::StrJoin(unknown, "; "), ")");
    }
    return out;
  }
  const double end_by =
      shadow - v1::StopCheckpointGraceS(job.spec) - options_.stop_grace_s - kBackfillMarginS;
  if (end_by > now) {
    out.why_not = absl::StrFormat(
        "; it could start beside %s as a backfill if resources.time_limit_s ended it by %s", them,
        UnixClock(end_by));
  }
  return out;
}

uint32_t JobLifecycle::FreeNow(const std::vector<WorkerSlot>& slots,
                               const std::string& device_kind) {
  uint32_t n = 0;
  for (const WorkerSlot& slot : slots) n += slot.free && slot.device_kind == device_kind;
  return n;
}

void JobLifecycle::TryStart(Job& job) { TryStart(job, ScanForPlacement()); }

void JobLifecycle::TryStart(Job& job, const PlacementScan& scan) {
  ReleaseExclusions(job);
  const PlacementScan::OfKind& kind = scan.Of(job.spec.resources().device());
  const double now = clock_.MonotonicSeconds();
  auto wait = [&](const std::string& reason) {
    if (reason != job.waiting_reason) {
      job.waiting_reason = reason;
      Event(job, "waiting", reason);
    }
  };
  // A first attempt runs the job's own layout (Submit checked that this controller can hold it);
  // a recovering job the first allowed layout that fits the healthy workers left (recovery.shrink).
  const bool recovering = job.summary.state() == v1::JOB_RECOVERING;
  std::vector<v1::ParallelSpec> layouts = AllowedLayouts(job.spec);
  if (!recovering) layouts.resize(1);
  std::string left_out;
  const uint32_t healthy = HealthyWorkers(job, kind, &left_out);
  const int chosen = recovering ? FirstFittingLayout(layouts, healthy) : 0;
  if (chosen < 0) {
    if (job.unfit_since_mono == 0) job.unfit_since_mono = now;
    const double limit = job.spec.recovery().wait_for_workers_s();
    const uint32_t smallest = LayoutWorld(layouts.back());
    const std::string why =
        absl::StrFormat("needs %d healthy %s workers for %s%s, %d left%s", smallest,
                        job.spec.resources().device(), DescribeLayout(layouts.back()),
                        layouts.size() > 1 ? " (the smallest layout recovery.shrink allows)" : "",
                        healthy, left_out.empty() ? "" : absl::StrCat(" (", left_out, ")"));
    if (now - job.unfit_since_mono >= limit) {
      FailUnfit(job, why);
      return;
    }
    wait(
        absl::StrFormat("%s; gives up after waiting %.0f s for workers to come back "
                        "(recovery.wait_for_workers_s)",
                        why, limit));
    return;
  }
  job.unfit_since_mono = 0;
  // The last attempt's ranks may still be writing the checkpoint of the step they stopped at (a
  // stop that keeps the progress); the next attempt reads the directory once they are out: ranks
  // on workers still known to run them, and ranks of workers that left (leaving_drain).
  if (recovering && job.spec.kind() == "train" && !job.spec.checkpoint().dir().empty()) {
    uint32_t stopping = 0;
    for (const auto& [id, w] : workers_.workers()) {
      stopping += w.has_rank && w.info.state() != v1::WORKER_STATE_LOST &&
                  w.info.job_id() == job.summary.job_id();
    }
    for (auto it = job.leaving_drain.begin(); it != job.leaving_drain.end();) {
      if (now >= it->second) {
        it = job.leaving_drain.erase(it);
      } else {
        ++stopping;
        ++it;
      }
    }
    if (stopping > 0) {
      wait(absl::StrFormat(
          "waits for %d rank%s of its last attempt to stop (each may be writing the checkpoint "
          "of the step it stopped at)",
          stopping, stopping == 1 ? "" : "s"));
      return;
    }
  }
  // Only running ranks hold a start back (a job waits for no other pending one: Submit let one
  // job that has not ended have the directory, so two never wait on each other).
  if (const Job* other = CheckpointDirUser(&job, job.spec.checkpoint().dir(), scan.holding)) {
    wait(absl::StrCat("checkpoint.dir ", job.spec.checkpoint().dir(), " is job ",
                      other->summary.job_id(), "'s, whose ranks are still ",
                      IsFinal(other->summary.state()) ? "stopping" : "running"));
    return;
  }
  const v1::ParallelSpec& layout = layouts[chosen];
  const uint32_t world = LayoutWorld(layout);
  // Excluded workers are never placed: to placement they are not free (a copy of the slots for
  // a job that has some).
  const uint32_t free_all = kind.free;
  std::vector<WorkerSlot> own_slots;
  if (!job.excluded_workers.empty()) {
    own_slots = scan.slots;
    for (WorkerSlot& slot : own_slots) {
      if (job.excluded_workers.count(slot.worker_id)) slot.free = false;
    }
  }
  const std::vector<WorkerSlot>& slots = job.excluded_workers.empty() ? scan.slots : own_slots;
  std::optional<std::string> backfilled;
  if (!recovering) {
    // A job that is recovering keeps its claim on as many workers as its last attempt ran on: a
    // job submitted or pending beside it starts only on the workers beyond those (it took the
    // recovering job's workers during its backoff, and a job mid-training waited on a later one).
    // The claim counts the workers free now and those about to be: still draining a recovering
    // job's rank, or known and not registered again yet after a controller restart (within the
    // re-attach grace they are not lost). Where even those are fewer than the claim (workers were
    // lost), a job may still start on what is free: holding it back would idle workers no one can
    // use yet.
    const uint32_t claimed = kind.claimed;
    const std::vector<std::string>& by = kind.claimed_by;
    const uint32_t coming = claimed > 0 ? kind.free_or_freeing : 0;
    if (claimed > 0 && coming >= claimed && coming < claimed + world) {
      wait(absl::StrFormat(
          "waits behind recovering job%s %s, which claim%s %d %s workers first: %d are free or "
          "freeing up, %d are needed for both",
          by.size() == 1 ? "" : "s", absl::StrJoin(by, ", "), by.size() == 1 ? "s" : "", claimed,
          job.spec.resources().device(), coming, claimed + world));
      return;
    }
    // Likewise the pending jobs submitted before it that have waited --reserve-after: without a
    // reservation a stream of smaller jobs, each starting on what the larger one cannot use yet,
    // would hold it back forever.
    // The recovering jobs' claim comes first: the reserved workers are beyond it (a job held
    // back by neither alone must not take what both together need).
    const Reserved older = ReservedByOlderPending(job, kind);
    const auto reserved = static_cast<uint32_t>(older.workers);
    if (older.jobs > 0) {
      const uint32_t ahead = claimed > 0 && coming >= claimed ? claimed : 0;
      const uint32_t free =
          job.excluded_workers.empty() ? free_all : FreeNow(slots, job.spec.resources().device());
      if (free < ahead + reserved + world) {
        Backfill backfill = CheckBackfill(job, kind, world, free_all, free, ahead, older.jobs);
        if (!backfill.start) {
          wait(absl::StrFormat(
              "waits behind job%s %s, pending over %.0f s: the next %d %s workers to free up are "
              "reserved for %s (--reserve-after); %d free, %d needed%s%s",
              older.jobs == 1 ? "" : "s", ReservedNames(kind, older.jobs), options_.reserve_after_s,
              reserved, job.spec.resources().device(), older.jobs == 1 ? "it" : "them", free,
              ahead + reserved + world,
              ahead > 0 ? absl::StrCat(" with the ", ahead, " recovering job ",
                                       absl::StrJoin(by, ", "), " claims")
                        : " for both",
              backfill.why_not));
          return;
        }
        backfilled = std::move(backfill.start);
      }
    }
  }
  auto placement = PlaceRanks(slots, world, job.spec.resources().device(), job.suspect_workers);
  if (!placement.ok()) {
    // Who holds the others: the jobs whose ranks run on this kind's workers.
    // And, after a controller restart, the workers known from the store not registered again.
    std::map<std::string, uint32_t> busy = kind.holders;
    busy.erase(job.summary.job_id());
    const uint32_t unregistered = kind.unregistered;
    const uint32_t known = kind.usable;  // not lost: free, busy, or about to register again
    std::vector<std::string> notes;
    // Workers lost since it was accepted: no job ending frees enough, only agents (re)joining.
    if (known < world) {
      notes.push_back(absl::StrCat("only ", known, " ", job.spec.resources().device(),
                                   known == 1 ? " worker is" : " workers are",
                                   " not lost: it starts once ", world - known, " more join"));
    }
    if (!busy.empty()) {
      notes.push_back(
          absl::StrCat("busy with ", absl::StrJoin(busy, ", ", [](std::string* out, const auto& b) {
                         absl::StrAppend(out, "job ", b.first, " (", b.second, ")");
                       })));
    }
    if (unregistered > 0) {
      notes.push_back(absl::StrCat(unregistered, unregistered == 1 ? " worker" : " workers",
                                   " not registered again since the controller started"));
    }
    if (!left_out.empty()) notes.push_back(left_out);
    wait(absl::StrCat(placement.status().message(),
                      notes.empty() ? "" : absl::StrCat(" (", absl::StrJoin(notes, "; "), ")"),
                      HoldsReservation(job)
                          ? absl::StrFormat("; the next workers to free up are reserved for it "
                                            "(pending over %.0f s: --reserve-after)",
                                            options_.reserve_after_s)
                          : ""));
    return;
  }
  job.waiting_reason.clear();
  const uint32_t n = job.summary.attempt() + 1;
  v1::AttemptInfo attempt;
  attempt.set_attempt(n);
  attempt.set_state(v1::ATTEMPT_STATE_RUNNING);
  attempt.set_memory_policy(NextAttemptMemoryPolicy(job));
  *attempt.mutable_parallel() = layout;
  for (const auto& [id, ex] : job.excluded_workers) {
    attempt.add_excluded(
        absl::StrCat(id, " (", ex.reason, "; until ", UnixClock(ex.until_unix), ")"));
  }
  const v1::AttemptInfo* previous = job.current();
  const bool escalated = previous != nullptr && !previous->memory_policy().empty() &&
                         previous->memory_policy() != attempt.memory_policy();
  const std::string escalation =
      escalated ? absl::StrCat("attempt ", previous->attempt(),
                               " ran out of memory under memory.policy ", previous->memory_policy(),
                               "; attempt ", n, " runs with ", attempt.memory_policy())
                : "";
  // The layout changes: shrunk (too few healthy workers for a larger one) or grown back.
  const v1::ParallelSpec previous_layout =
      previous != nullptr && previous->has_parallel() ? previous->parallel() : job.spec.parallel();
  std::string relayout;
  if (LayoutWorld(previous_layout) != world || previous_layout.dp() != layout.dp() ||
      previous_layout.ep() != layout.ep() || previous_layout.pp() != layout.pp()) {
    const uint64_t global = uint64_t{layout.micro_batch()} * layout.micro_batches() * layout.dp();
    relayout = absl::StrFormat(
        "attempt %d %s from %s to %s: %d healthy %s workers left%s; micro_batches %d -> %d keeps "
        "the global batch at %d sequences",
        n, chosen > 0 ? "shrunk" : "grown back", DescribeLayout(previous_layout),
        DescribeLayout(layout), healthy, job.spec.resources().device(),
        left_out.empty() ? "" : absl::StrCat(" (", left_out, ")"), previous_layout.micro_batches(),
        layout.micro_batches(), global);
  }
  attempt.set_started_unix(clock_.UnixSeconds());
  for (uint32_t r = 0; r < placement->size(); ++r) {
    const Worker& w = *workers_.Find((*placement)[r]);
    auto* rank = attempt.add_ranks();
    rank->set_rank(r);
    rank->set_worker_id(w.info.worker_id());
    rank->set_host(w.info.host());
    rank->set_state(v1::RANK_STATE_ASSIGNED);
  }
  const Job backup = job;
  job.attempts.push_back(attempt);
  job.summary.set_attempt(n);
  // A later attempt shows the job's progress until its ranks say where they start (ProgressOf).
  if (n == 1) job.summary.set_step(0);
  // PENDING -> SCHEDULED -> STARTING lands in the store as one write (the STARTING one), so a
  // controller that dies in between never finds a job parked in SCHEDULED.
  if (job.summary.state() == v1::JOB_PENDING) {
    if (!CheckTransition(v1::JOB_PENDING, v1::JOB_SCHEDULED).ok()) return;
    job.summary.set_state(v1::JOB_SCHEDULED);
  }
  // The first workers name the placement; at thousands of ranks the whole list would make one
  // event of hundreds of kilobytes (`furnace status` lists every rank with its worker anyway).
  constexpr size_t kNamed = 16;
  std::string placed = absl::StrJoin(
      placement->begin(), placement->begin() + std::min(placement->size(), kNamed), ", ");
  if (placement->size() > kNamed)
    absl::StrAppend(&placed, ", ... (", placement->size() - kNamed, " more)");
  if (!Transition(
           job, v1::JOB_STARTING, "starting",
           absl::StrCat("attempt ", n, ": ", placement->size(),
                        placement->size() == 1 ? " rank placed on " : " ranks placed on ", placed))
           .ok()) {
    job = backup;
    return;
  }
  rendezvous_.OpenScope({job.summary.job_id(), n},
                        std::set<std::string>(placement->begin(), placement->end()));
  if (backfilled) Event(job, "backfill", *backfilled);
  if (escalated) Event(job, "escalate", escalation);
  if (!relayout.empty()) Event(job, chosen > 0 ? "shrink" : "grow", relayout);
  // A drill aimed at a worker (fault.worker) hits whichever rank runs there: one that holds no
  // rank of an attempt the drill is for would leave the drill silently undone.
  if (const v1::FaultSpec& fault = job.spec.fault();
      !fault.mode().empty() && !fault.worker().empty() && (n == 1 || fault.every_attempt()) &&
      std::find(placement->begin(), placement->end(), fault.worker()) == placement->end()) {
    Event(job, "fault_not_injected",
          absl::StrCat("fault.worker ", EscapeForLog(fault.worker()), " holds no rank of attempt ",
                       n, ", so its ", fault.mode(), " drill does not run in it",
                       workers_.Find(fault.worker()) == nullptr
                           ? " (no worker of that name has registered)"
                           : ""));
  }
  job.attempt_started_mono = clock_.MonotonicSeconds();
  for (uint32_t r = 0; r < placement->size(); ++r) {
    workers_.Assign(*workers_.Find((*placement)[r]), job.summary.job_id(), n, r);
  }
  workers_.FlushNow();  // every placed worker's record in one transaction, before any command
  for (uint32_t r = 0; r < placement->size(); ++r) {
    const Worker& w = *workers_.Find((*placement)[r]);
    workers_.Enqueue(w.info.worker_id(), StartCommand(job, r, w));
  }
}

v1::AgentCommand JobLifecycle::StartCommand(const Job& job, uint32_t rank,
                                            const Worker& worker) const {
  v1::AgentCommand cmd;
  auto* task = cmd.mutable_start();
  task->set_job_id(job.summary.job_id());
  task->set_attempt(job.summary.attempt());
  task->set_rank(rank);
  *task->mutable_spec() = job.spec;
  task->set_worker_id(worker.info.worker_id());
  task->set_world_size(job.summary.world_size());
  // The attempt's policy, which an out-of-memory exit may have made more conservative than the
  // spec's; the stored spec keeps what the user submitted.
  if (const v1::AttemptInfo* attempt = job.current();
      attempt && !attempt->memory_policy().empty()) {
    task->mutable_spec()->mutable_memory()->set_policy(attempt->memory_policy());
  }
  // The attempt's layout (recovery.shrink may have made it smaller than the spec's): the ranks
  // build their groups, batch and world from task.spec.parallel and task.world_size.
  if (const v1::AttemptInfo* attempt = job.current(); attempt && attempt->has_parallel()) {
    *task->mutable_spec()->mutable_parallel() = attempt->parallel();
    task->set_world_size(static_cast<uint32_t>(attempt->ranks_size()));
    task->mutable_spec()->mutable_resources()->set_workers(task->world_size());
  }
  task->set_controller_address(options_.advertise_address);
  task->set_host(worker.info.host());
  if (const v1::AttemptInfo* attempt = job.current(); attempt != nullptr) {
    uint32_t on_host = 0;
    for (const auto& r : attempt->ranks()) on_host += r.host() == worker.info.host() ? 1 : 0;
    task->set_ranks_on_host(std::max<uint32_t>(1, on_host));
  }
  if (job.spec.checkpoint().every_auto() && hint_source_) {
    *task->mutable_checkpoint_hint() = hint_source_(job);
  }
  return cmd;
}

void JobLifecycle::CloseScope(Job& job, uint32_t attempt) {
  rendezvous_.Close({job.summary.job_id(), attempt});
  // After the keys' own writes (the same committer): none of them lands after the drop.
  records_.Submit(
      [this, id = job.summary.job_id(), attempt] { return store_.KvDropScope(id, attempt); },
      [id = job.summary.job_id()](absl::Status s) {
        if (!s.ok()) spdlog::warn("job {}: cannot drop rendezvous keys: {}", id, s.ToString());
      });
}

}  // namespace furnace::controller
