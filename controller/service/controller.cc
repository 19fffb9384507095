#include "controller/service/controller.h"

#include <algorithm>
#include <filesystem>
#include <future>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "controller/service/recovery_phases.h"
#include "controller/spec/input_roots.h"
#include "controller/spec/job_spec.h"
#include "controller/store/job_state.h"
#include "proto/furnace/v1/job_paths.h"
#include "proto/furnace/v1/state_names.h"
#include "runtime/base/log_text.h"
#include "runtime/base/status.h"
#include "runtime/base/utf8.h"
#include "spdlog/spdlog.h"

namespace furnace::controller {

namespace fs = std::filesystem;
namespace v1 = furnace::v1;

absl::StatusOr<std::unique_ptr<Controller>> Controller::Create(const ControllerOptions& options,
                                                               const Clock& clock) {
  std::error_code ec;
  fs::create_directories(fs::path(options.state_dir) / "logs" / "jobs", ec);
  if (ec) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot create state dir ", options.state_dir, ": ", ec.message()));
  }
  // Before the database is opened: a second controller on the directory leaves it alone.
  ASSIGN_OR_RETURN(StateDirLock lock, StateDirLock::Acquire(options.state_dir));
  ASSIGN_OR_RETURN(auto store,
                   JobStore::Open((fs::path(options.state_dir) / "furnace.db").string()));
  std::unique_ptr<Controller> controller(
      new Controller(options, clock, std::move(lock), std::move(store)));
  RETURN_IF_ERROR(controller->Load());
  controller->started_unix_ = clock.UnixSeconds();
  return controller;
}

Controller::Controller(const ControllerOptions& options, const Clock& clock, StateDirLock lock,
                       std::unique_ptr<JobStore> store)
    : options_(options),
      clock_(clock),
      state_lock_(std::move(lock)),
      store_(std::move(store)),
      submit_limiter_(options_.submit_rate, options_.submit_burst, clock_),
      logs_((fs::path(options_.state_dir) / "logs" / "jobs").string()),
      workers_(*store_, clock_),
      telemetry_(*store_),
      jobs_(options_, clock_, *store_, kv_commit_, workers_, rendezvous_) {
  // Runs under mu_ (StartCommand is called by JobLifecycle, which mu_ guards, as it guards
  // telemetry_).
  jobs_.SetCheckpointHintSource([this](const Job& job) {
    const double now = clock_.UnixSeconds();
    ClusterFailureRate cluster;
    for (const auto& [id, other] : jobs_.jobs()) cluster.Add(other.attempts, now);
    return telemetry_.CheckpointHint(job.summary.job_id(), job.attempts, now, cluster,
                                     static_cast<int>(spec::WorldSize(job.spec)));
  });
}

Controller::~Controller() {
  kv_commit_.Run([] { return absl::OkStatus(); }).IgnoreError();  // after every write before it
}

absl::Status Controller::Load() {
  std::lock_guard<std::mutex> lock(mu_);
  ASSIGN_OR_RETURN(auto workers, store_->LoadWorkers());
  workers_.Load(std::move(workers));
  ASSIGN_OR_RETURN(const int active, jobs_.Load());
  for (const auto& entry : jobs_.jobs()) {
    const std::string& id = entry.first;
    Job& job = *jobs_.Find(id);
    RETURN_IF_ERROR(store_->ForEachStep(id, [&](const v1::StepRecord& st) {
      telemetry_.CountStep(id, st);
      JobLifecycle::NoteStoredStep(job, st);
    }));
  }
  spdlog::info("job store loaded: {} jobs ({} active), {} workers", jobs_.jobs().size(), active,
               workers_.workers().size());
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------------
// JobService

std::string Controller::SubmittedFileName(const std::string& filename) {
  // The caller's file name is theirs to choose (any bytes: ESC, CR, LF, a path of kilobytes) and
  // is stored with the job, logged, and quoted in every problem of a refusal: its printable base
  // name is all the controller keeps.
  std::string name = PrintableBaseName(filename, kMaxJobFileNameBytes);
  return name.empty() ? "<job>" : name;
}

absl::StatusOr<v1::JobSpec> Controller::ParseSubmitted(const std::string& yaml,
                                                       const std::string& filename) const {
  ASSIGN_OR_RETURN(v1::JobSpec spec, spec::ParseJobYaml(yaml, filename));
  RETURN_IF_ERROR(spec::ConfineJobPaths({options_.data_root, options_.checkpoint_root}, spec));
  return spec;
}

absl::StatusOr<std::string> Controller::Submit(const std::string& yaml, const std::string& filename,
                                               std::vector<std::string>* defaults) {
  ASSIGN_OR_RETURN(v1::JobSpec spec, ParseSubmitted(yaml, filename));
  std::lock_guard<std::mutex> lock(mu_);
  return jobs_.Submit(std::move(spec), filename, defaults);
}

absl::StatusOr<std::string> Controller::SubmitAs(const std::string& identity,
                                                 const std::string& yaml,
                                                 const std::string& filename,
                                                 std::vector<std::string>* defaults) {
  const std::string name = SubmittedFileName(filename);
  const absl::Status admitted = submit_limiter_.Admit(identity);
  const absl::StatusOr<std::string> id =
      admitted.ok() ? Submit(yaml, name, defaults) : absl::StatusOr<std::string>(admitted);
  Audit(identity, "submit", id.ok() ? *id : "", id.status(),
        id.ok() ? absl::StrCat("submitted ", name) : "");
  return id;
}

absl::StatusOr<v1::SubmitJobResponse> Controller::CheckSubmitAs(const std::string& identity,
                                                                const std::string& yaml,
                                                                const std::string& filename) {
  const std::string name = SubmittedFileName(filename);
  RETURN_IF_ERROR(submit_limiter_.Admit(identity));
  ASSIGN_OR_RETURN(v1::JobSpec spec, ParseSubmitted(yaml, name));
  std::vector<std::string> given;
  {
    std::lock_guard<std::mutex> lock(mu_);
    RETURN_IF_ERROR(jobs_.CheckSubmit(spec, name, given));
  }
  v1::SubmitJobResponse response;
  for (std::string& d : given) response.add_defaults(std::move(d));
  *response.mutable_spec() = std::move(spec);
  return response;
}

absl::StatusOr<v1::JobSummary> Controller::CancelAs(const std::string& identity,
                                                    const std::string& job_id) {
  absl::StatusOr<v1::JobSummary> job = Cancel(job_id);
  Audit(identity, "cancel", job_id, job.status(),
        job.ok() ? absl::StrCat("now ", v1::StateWord(job->state())) : "");
  return job;
}

absl::StatusOr<v1::ListAuditEventsResponse> Controller::ListAuditEvents(
    const v1::ListAuditEventsRequest& req) {
  const int limit = req.limit() == 0 ? 100 : static_cast<int>(std::min(req.limit(), 10000u));
  ASSIGN_OR_RETURN(auto events, store_->LoadAudit(req.job_id(), limit));
  v1::ListAuditEventsResponse resp;
  for (auto& e : events) *resp.add_events() = std::move(e);
  return resp;
}

void Controller::AuditRefused(double unix_time, const std::string& identity,
                              const std::string& action, const absl::Status& outcome) {
  Audit(identity, action, "", outcome, "", unix_time);
}

void Controller::Audit(const std::string& identity, const std::string& action,
                       const std::string& job_id, const absl::Status& outcome,
                       const std::string& detail, std::optional<double> unix_time) {
  // Messages quote what the caller sent (file names, job ids): kept to valid UTF-8 and bounded,
  // so the log can always be served back (a protobuf string field must be UTF-8).
  constexpr size_t kMaxDetail = 2000;
  v1::AuditEvent e;
  e.set_unix_time(unix_time.value_or(clock_.UnixSeconds()));
  e.set_identity(SanitizeUtf8(identity, 256));
  e.set_action(action);
  e.set_job_id(SanitizeUtf8(job_id, 256));
  e.set_accepted(outcome.ok());
  e.set_code(absl::StatusCodeToString(outcome.code()));
  e.set_detail(SanitizeUtf8(outcome.ok() ? detail : std::string(outcome.message()), kMaxDetail));
  if (absl::Status s = store_->AddAudit(e); !s.ok()) {
    spdlog::error("audit log: cannot record {} by {}: {}", action, EscapeForLog(identity),
                  s.ToString());
  }
  // Retention (--audit-keep): trimmed every kAuditTrimEvery entries, so the log holds at most
  // audit_keep + kAuditTrimEvery of them.
  if (options_.audit_keep > 0 && ++audits_since_trim_ >= kAuditTrimEvery) {
    audits_since_trim_ = 0;
    if (absl::Status s = store_->TrimAudit(options_.audit_keep); !s.ok()) {
      spdlog::warn("audit log: cannot trim to the newest {}: {}", options_.audit_keep,
                   s.ToString());
    }
  }
}

namespace {

// Submission order: by time, then id (jobs submitted within one clock tick).
bool SubmittedBefore(const v1::JobSummary& a, const v1::JobSummary& b) {
  if (a.submitted_unix() != b.submitted_unix()) return a.submitted_unix() < b.submitted_unix();
  return a.job_id() < b.job_id();
}

void SortBySubmission(std::vector<v1::JobSummary>& jobs) {
  std::sort(jobs.begin(), jobs.end(), SubmittedBefore);
}

// "ranks 0..3", "rank 0 only": the numbers first..last that exist.
std::string Existing(const char* what, uint32_t first, uint32_t last) {
  return first == last ? absl::StrCat(what, " ", first, " only")
                       : absl::StrCat(what, "s ", first, "..", last);
}

// NotFound for a rank or attempt the job does not have: a filter that matches nothing would print
// nothing and look like a rank that wrote nothing. An attempt is one that has started; a rank,
// one of that attempt's (a shrunk attempt has fewer), or without an attempt, of the job's layout,
// the largest it runs.
absl::Status CheckLogsFilter(const Job& job, const v1::GetLogsRequest& req) {
  const std::string& id = job.summary.job_id();
  const size_t attempts = job.attempts.size();
  if (req.attempt() > 0 && static_cast<size_t>(req.attempt()) > attempts) {
    return absl::NotFoundError(absl::StrCat(
        "job ", id, " has no attempt ", req.attempt(), "; it has ",
        attempts == 0 ? absl::StrCat("no attempt yet (", v1::StateWord(job.summary.state()), ")")
                      : Existing("attempt", 1, static_cast<uint32_t>(attempts))));
  }
  if (req.rank() < 0) return absl::OkStatus();
  uint32_t ranks = spec::WorldSize(job.spec);
  const v1::AttemptInfo* attempt =
      req.attempt() > 0 ? &job.attempts[static_cast<size_t>(req.attempt()) - 1] : nullptr;
  if (attempt != nullptr && attempt->ranks_size() > 0) {
    ranks = static_cast<uint32_t>(attempt->ranks_size());
  } else if (attempt == nullptr) {
    for (const v1::AttemptInfo& a : job.attempts) {
      ranks = std::max(ranks, static_cast<uint32_t>(a.ranks_size()));
    }
  }
  if (static_cast<uint32_t>(req.rank()) < ranks) return absl::OkStatus();
  const std::string whose = attempt == nullptr
                                ? absl::StrCat("job ", id)
                                : absl::StrCat("attempt ", attempt->attempt(), " of job ", id);
  return absl::NotFoundError(absl::StrCat(whose, " has no rank ", req.rank(), "; it has ",
                                          Existing("rank", 0, ranks - 1)));
}

}  // namespace

std::vector<v1::JobSummary> Controller::ListJobs() {
  std::vector<v1::JobSummary> out;
  {
    std::lock_guard<std::mutex> lock(mu_);
    out.reserve(jobs_.jobs().size());
    for (const auto& [id, job] : jobs_.jobs()) out.push_back(JobLifecycle::SummaryNow(job));
  }
  SortBySubmission(out);  // not under the state lock: the heartbeats wait for it
  return out;
}

v1::ListJobsResponse Controller::RecentJobs(size_t ended) {
  // Under the state lock only a pass over the jobs and the copies returned: the ended jobs (all
  // of them, on a controller that has run for months) are ranked by a pointer each, not copied.
  std::vector<v1::JobSummary> shown;
  size_t omitted = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<const v1::JobSummary*> finals;
    for (const auto& [id, job] : jobs_.jobs()) {
      if (IsFinal(job.summary.state())) {
        finals.push_back(&job.summary);
      } else {
        shown.push_back(JobLifecycle::SummaryNow(job));
      }
    }
    if (finals.size() > ended) {
      omitted = finals.size() - ended;
      // The newest `ended` by submission.
      std::nth_element(finals.begin(), finals.begin() + static_cast<std::ptrdiff_t>(omitted),
                       finals.end(),
                       [](const auto* a, const auto* b) { return SubmittedBefore(*a, *b); });
      finals.erase(finals.begin(), finals.begin() + static_cast<std::ptrdiff_t>(omitted));
    }
    for (const v1::JobSummary* j : finals) shown.push_back(*j);
  }
  SortBySubmission(shown);
  v1::ListJobsResponse out;
  out.set_omitted(static_cast<uint32_t>(omitted));
  for (v1::JobSummary& j : shown) *out.add_jobs() = std::move(j);
  return out;
}

absl::StatusOr<v1::JobDetail> Controller::GetJob(const std::string& job_id) {
  v1::JobDetail detail;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const Job* job = jobs_.Find(job_id);
    if (job == nullptr) return absl::NotFoundError(absl::StrCat("no job '", job_id, "'"));
    *detail.mutable_summary() = JobLifecycle::SummaryNow(*job);
    *detail.mutable_spec() = job->spec;
    for (const auto& a : job->attempts) *detail.add_attempts() = a;
    if (job->spec.kind() == "train") {
      *detail.mutable_goodput() = telemetry_.Goodput(
          job_id, job->attempts, !IsFinal(job->summary.state()), clock_.UnixSeconds());
    }
    if (auto eval = telemetry_.LastEval(job_id)) *detail.mutable_last_eval() = *eval;
    // The job's MFU, as the dashboard and furnace_job_mfu_ratio have it: the current attempt's.
    if (auto step = telemetry_.LastStep(job_id);
        step && step->attempt() == detail.summary().attempt() && step->mfu() > 0) {
      detail.set_job_mfu(step->mfu());
      detail.set_job_mfu_step(step->step());
    }
  }
  // Events are written behind: what was queued before this call is read too.
  RETURN_IF_ERROR(kv_commit_.Run([] { return absl::OkStatus(); }));
  ASSIGN_OR_RETURN(auto events, store_->LoadEvents(job_id, 50));
  for (auto& e : events) *detail.add_events() = std::move(e);
  ASSIGN_OR_RETURN(auto comm, store_->LoadCommResults(job_id));
  for (auto& c : comm) *detail.add_comm() = std::move(c);
  // The current attempt's figures only: after a restart, the failed attempt's last loss beside the
  // new attempt's step would read as where the job is now.
  ASSIGN_OR_RETURN(auto latest, store_->LatestRecord(job_id, 0));
  if (latest && latest->has_train() && latest->attempt() == detail.summary().attempt()) {
    *detail.mutable_telemetry() = latest->train();
    detail.set_telemetry_step(latest->step());
  }
  return detail;
}

absl::StatusOr<v1::JobSummary> Controller::Cancel(const std::string& job_id) {
  std::lock_guard<std::mutex> lock(mu_);
  return jobs_.Cancel(job_id);
}

std::vector<v1::WorkerInfo> Controller::ListWorkers() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<v1::WorkerInfo> out;
  for (const auto& [id, w] : workers_.workers()) out.push_back(WorkerRegistry::Info(w));
  return out;
}

absl::StatusOr<v1::GetLogsResponse> Controller::GetLogs(const v1::GetLogsRequest& req) {
  bool done = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const Job* job = jobs_.Find(req.job_id());
    if (job == nullptr) return absl::NotFoundError(absl::StrCat("no job '", req.job_id(), "'"));
    RETURN_IF_ERROR(CheckLogsFilter(*job, req));
    done = IsFinal(job->summary.state());
  }
  absl::StatusOr<v1::GetLogsResponse> resp = logs_.Read(req);
  if (resp.ok()) resp->set_job_done(done);
  return resp;
}

absl::StatusOr<v1::JobSeries> Controller::GetJobSeries(const v1::GetJobSeriesRequest& req) {
  uint64_t dropped = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (jobs_.Find(req.job_id()) == nullptr) {
      return absl::NotFoundError(absl::StrCat("no job '", req.job_id(), "'"));
    }
    dropped = telemetry_.dropped();
  }
  v1::JobSeries series;
  std::vector<v1::StepRecord> steps;
  if (req.page_size() > 0) {
    if (req.since_step() > 0 || req.max_points() > 0) {
      return absl::InvalidArgumentError(
          "GetJobSeries: page_size pages through every step: since_step and max_points must be 0");
    }
    if (req.page_size() > kMaxSeriesPageSize) {
      return absl::InvalidArgumentError(absl::StrCat("GetJobSeries: page_size ", req.page_size(),
                                                     " (allowed: 1 to ", kMaxSeriesPageSize, ")"));
    }
    bool more = false;
    ASSIGN_OR_RETURN(steps, store_->LoadStepPage(req.job_id(), req.after_attempt(),
                                                 req.after_step(), req.page_size(), &more));
    series.set_more(more);
  } else {
    if (req.max_points() > kMaxSeriesPageSize) {
      return absl::InvalidArgumentError(absl::StrCat("GetJobSeries: max_points ", req.max_points(),
                                                     " (allowed: 0 for all, or 1 to ",
                                                     kMaxSeriesPageSize, ")"));
    }
    const bool cursor = req.after_attempt() > 0 || req.after_step() > 0;
    if (cursor && req.since_step() > 0) {
      return absl::InvalidArgumentError(
          "GetJobSeries: since_step or the cursor (after_attempt, after_step), not both");
    }
    // Only the new steps are read: the dashboard polls with its cursor every few seconds; and
    // of a long history, only the points asked for.
    const StepCursor after{.attempt = req.after_attempt(), .step = req.after_step()};
    absl::StatusOr<std::vector<v1::StepRecord>> loaded =
        store_->LoadSteps(req.job_id(), req.since_step(), req.max_points(), kMaxSeriesPageSize,
                          cursor ? &after : nullptr);
    if (absl::IsResourceExhausted(loaded.status())) {
      return absl::ResourceExhaustedError(
          absl::StrCat("GetJobSeries: ", loaded.status().message(),
                       ", more than one reply holds: page through them (page_size, at most ",
                       kMaxSeriesPageSize, ") or thin them (max_points)"));
    }
    RETURN_IF_ERROR(loaded.status());
    steps = *std::move(loaded);
  }
  series.set_job_id(req.job_id());
  series.set_telemetry_dropped(dropped);
  for (auto& st : steps) *series.add_steps() = std::move(st);
  return series;
}

MetricsSnapshot Controller::Metrics() {
  std::lock_guard<std::mutex> lock(mu_);
  MetricsSnapshot snap;
  snap.unix_time = clock_.UnixSeconds();
  snap.telemetry_dropped_total = telemetry_.dropped();
  snap.telemetry_records_total = telemetry_.records();
  for (const auto st : {v1::WORKER_STATE_READY, v1::WORKER_STATE_BUSY, v1::WORKER_STATE_LOST}) {
    snap.workers_by_state[st] = 0;
  }
  for (const auto& [id, w] : workers_.workers()) {
    ++snap.workers_by_state[w.info.state()];
    if (w.info.state() == v1::WORKER_STATE_LOST && w.info.left()) ++snap.workers_left;
  }
  for (const auto& [id, job] : jobs_.jobs()) {
    // A job over for a day leaves the export (its record stays in the store and the CLI): the
    // series of the jobs ever run would otherwise only grow.
    if (IsFinal(job.summary.state()) &&
        snap.unix_time - job.summary.updated_unix() > kFinishedJobMetricsS) {
      continue;
    }
    JobMetrics m;
    m.job_id = id;
    m.name = job.summary.name();
    m.kind = job.summary.kind();
    m.state = job.summary.state();
    m.attempt = job.summary.attempt();
    m.step = JobLifecycle::StepNow(job);
    m.total_steps = job.summary.total_steps();
    if (!IsFinal(job.summary.state())) m.deadline_unix = JobLifecycle::DeadlineUnix(job);
    telemetry_.Fill(id, m);
    m.goodput = telemetry_.Goodput(id, job.attempts, !IsFinal(job.summary.state()), snap.unix_time);
    for (size_t i = 0; i < job.attempts.size(); ++i) {
      const auto& a = job.attempts[i];
      // A restart: a failed attempt the job went on from (recorded when it failed, so the count
      // never goes down; a record older than that field: one a new attempt followed). The failure
      // that ended the job is not one.
      const bool restarted = a.restarted() || i + 1 < job.attempts.size();
      if (a.state() == v1::ATTEMPT_STATE_FAILED && restarted) {
        ++m.restarts_by_cause[a.failure_kind().empty() ? "exit" : a.failure_kind()];
      }
      // From the failure, so the time to detect it counts, as in the recovery's phases.
      if (i > 0 && a.all_running_unix() > 0 && job.attempts[i - 1].ended_unix() > 0) {
        m.last_recovery_seconds = a.all_running_unix() - FailureUnix(job.attempts[i - 1]);
      }
      if (a.has_recovery()) {
        m.last_recovery_phases = RecoveryPhaseList(a.recovery());
        m.last_recovery_phases.emplace_back("total", a.recovery().total_s());
      }
    }
    snap.jobs.push_back(std::move(m));
  }
  return snap;
}

// ---------------------------------------------------------------------------------------------
// AgentService

absl::StatusOr<v1::RegisterResponse> Controller::Register(const v1::RegisterRequest& req) {
  if (req.worker_id().empty()) return absl::InvalidArgumentError("worker_id is empty");
  v1::RegisterResponse resp;
  {
    std::lock_guard<std::mutex> lock(mu_);
    resp.set_session_id(jobs_.Register(req));
  }
  resp.set_heartbeat_interval_s(options_.heartbeat_interval_s);
  resp.set_telemetry_flush_s(TelemetryFlushS());
  return resp;
}

v1::HeartbeatResponse Controller::Heartbeat(const v1::HeartbeatRequest& req) {
  return Beat(req, /*wait=*/true);
}

v1::HeartbeatResponse Controller::TryHeartbeat(const v1::HeartbeatRequest& req) {
  return Beat(req, /*wait=*/false);
}

v1::HeartbeatResponse Controller::Beat(const v1::HeartbeatRequest& req, bool wait) {
  v1::HeartbeatResponse resp;
  // The most silent of the ranks it runs (one, or an older attempt's still stopping beside it).
  Liveness::RankSilence silence;
  for (const v1::RunningRank& r : req.running()) {
    if (r.silent_s() > silence.silent_s) {
      silence = {r.job_id(), r.attempt(), r.rank(), r.silent_s(), 0};
    }
  }
  if (!workers_.Beat(req.worker_id(), req.session_id(), std::move(silence))) {
    resp.set_reregister(true);
    return resp;
  }
  resp.set_telemetry_flush_s(TelemetryFlushS());
  if (req.leaving()) {  // rare (an agent's last word): worth the wait for the state mutex
    std::lock_guard<std::mutex> lock(mu_);
    jobs_.WorkerLeaving(req.worker_id());
    return resp;
  }
  std::unique_lock<std::mutex> lock(mu_, std::defer_lock);
  if (wait) {
    lock.lock();
  } else if (!lock.try_lock()) {
    return resp;  // recorded; no view this time
  }
  if (const Worker* w = workers_.Find(req.worker_id())) FillRankView(*w, resp);
  return resp;
}

double Controller::TelemetryFlushS() const {
  if (options_.telemetry_flush_s > 0) return options_.telemetry_flush_s;
  const double fleet = static_cast<double>(workers_.MailboxCount());
  return std::clamp(fleet / 10000.0, 0.2, 2.0);
}

void Controller::FillRankView(const Worker& w, v1::HeartbeatResponse& resp) {
  // Once Shutdown has ended the attempts on the local workers it stops, the records no longer list
  // their ranks, and a view from them would have those agents stop the ranks as unknown, at once,
  // cutting the checkpoint grace their StopRank gave them: they get no view until the next
  // controller's (other agents' ranks train on and keep theirs).
  if (jobs_.StoppedAtShutdown(w.info.worker_id())) return;
  resp.set_reconcile(true);
  if (!w.has_rank) return;
  Job* job = jobs_.Find(w.info.job_id());
  if (job == nullptr || w.attempt == 0 || w.attempt > job->attempts.size()) return;
  const v1::AttemptInfo& attempt = job->attempts[w.attempt - 1];
  if (w.info.rank() >= static_cast<uint32_t>(attempt.ranks_size())) return;
  const v1::RankInfo& rank = attempt.ranks(w.info.rank());
  if (rank.worker_id() != w.info.worker_id() || rank.state() == v1::RANK_STATE_EXITED) return;
  v1::ControllerRankView* view = resp.add_ranks();
  view->set_job_id(w.info.job_id());
  view->set_attempt(w.attempt);
  view->set_rank(w.info.rank());
  view->set_wanted(&attempt == job->current() && attempt.state() == v1::ATTEMPT_STATE_RUNNING &&
                   !IsFinal(job->summary.state()));
  view->set_started(rank.state() == v1::RANK_STATE_RUNNING);
  // As StopAttemptRanks stops it: a cancel, an interruption or the time limit keeps the progress.
  if (!view->wanted()) view->set_checkpoint_grace_s(StopKeepingProgressGraceS(*job, attempt));
}

absl::StatusOr<std::vector<v1::AgentCommand>> Controller::NextCommands(
    const std::string& worker_id, const std::string& session_id, double wait_s) {
  return workers_.NextCommands(worker_id, session_id, wait_s);
}

absl::StatusOr<std::vector<v1::AgentCommand>> Controller::TakeCommands(
    const std::string& worker_id, const std::string& session_id, WorkerRegistry::Wake wake) {
  return workers_.TakeCommands(worker_id, session_id, std::move(wake));
}

void Controller::Requeue(const std::string& worker_id, const std::string& session_id,
                         std::vector<v1::AgentCommand> commands) {
  workers_.Requeue(worker_id, session_id, std::move(commands));
}

void Controller::ReportRank(const v1::RankReport& report, std::function<void(absl::Status)> done) {
  std::lock_guard<std::mutex> lock(mu_);
  jobs_.ReportRank(report, std::move(done));
}

absl::Status Controller::ReportRank(const v1::RankReport& report) {
  // (Shared: a written-behind exit's answer comes after this returns.)
  // (Written under the state mutex, by this call or a later flush: read under it too.)
  auto answer = std::make_shared<std::optional<absl::Status>>();
  std::lock_guard<std::mutex> lock(mu_);
  jobs_.ReportRank(report, [answer](absl::Status s) {
    if (!*answer) *answer = std::move(s);
  });
  return answer->value_or(absl::OkStatus());
}

void Controller::PushTelemetry(const v1::TelemetryBatch& batch, Done done, v1::TelemetryAck* ack) {
  AcceptTelemetry(batch, ack, [](absl::Status s) {
    // Said once per 1000 failures: a slow or full disk must not flood the log as well.
    static std::atomic<uint64_t> failures{0};
    if (!s.ok() && failures++ % 1000 == 0) {
      spdlog::warn("telemetry records not stored ({} time(s) so far): {}", failures.load(),
                   s.ToString());
    }
  });
  done(absl::OkStatus());
}

void Controller::AcceptTelemetry(const v1::TelemetryBatch& batch, v1::TelemetryAck* ack,
                                 Done written) {
  std::vector<v1::TelemetryRecord> records;
  std::vector<TelemetryAggregator::Trim> trim;
  bool steps = false;  // a step was completed (and queued for the store)
  {
    std::lock_guard<std::mutex> lock(mu_);
    workers_.Touch(batch.worker_id());
    telemetry_.NoteBatch(batch);
    std::set<std::string> touched;
    std::map<std::string, uint32_t> kept;  // job -> its world, for the ones with raw records
    // Just started: agents push what they held as they register again, each its backlog first.
    const size_t max_pending = clock_.UnixSeconds() - started_unix_ < kEndedSettleS
                                   ? TelemetryAggregator::kMaxPendingStepsAfterStart
                                   : TelemetryAggregator::kMaxPendingSteps;
    int foreign = 0;  // records of ranks another worker runs: not taken
    int beyond = 0;   // records of a step past the job's train.steps: not taken
    for (const auto& rec : batch.records()) {
      Job* job = jobs_.Find(rec.job_id());
      if (job == nullptr) continue;
      if (!JobLifecycle::HeldBy(*job, rec.attempt(), rec.rank(), batch.worker_id())) {
        ++foreign;
        continue;
      }
      // No rank trains past train.steps: such a record (a faulty or forged agent's) would become
      // the job's newest step, and every real step after it would read as stale and be dropped.
      if (job->spec.kind() == "train" && rec.step() > job->spec.train().steps()) {
        ++beyond;
        continue;
      }
      const uint32_t world = job->AttemptWorld(rec.attempt());
      // A record of no rank of the job, or one counted already, is not progress again. Sent again
      // (a push whose answer was lost, or held records an agent pushes to a controller it
      // registered with anew: TelemetryBatch), it still goes to its step: one a restarted
      // controller was merging when it died needs it, and a step takes each rank's record once.
      if (!jobs_.NoteProgress(*job, rec)) {
        if (rec.has_train() && telemetry_.Accumulate(rec.job_id(), world, rec, max_pending)) {
          steps = true;
        }
        continue;
      }
      if (telemetry_.KeepRaw(rec, world)) {
        records.push_back(rec);
        kept[rec.job_id()] = world;
      }
      jobs_.NoteRankTimes(*job, rec);
      touched.insert(rec.job_id());
      // Every rank reports an uncommitted checkpoint alike: rank 0's says it once.
      if (rec.has_train() && rec.rank() == 0 && !rec.train().checkpoint_error().empty()) {
        jobs_.NoteCheckpointFailure(*job, rec.step(), rec.train().checkpoint_error());
      }
      if (rec.rank() == 0 && rec.phase() == "restored") {
        jobs_.NoteCheckpointRestored(*job, rec.message());
      }
      if (rec.has_train() && telemetry_.Accumulate(rec.job_id(), world, rec, max_pending)) {
        steps = true;
      }
    }
    // Written behind (JobLifecycle::PersistLater), in order with the transitions: both are
    // written under the mutex.
    jobs_.PersistLater(touched);
    trim = telemetry_.TrimDue(kept, records.size());
    if (foreign > 0) {
      spdlog::warn("worker {} sent {} telemetry record(s) of ranks it does not run: ignored",
                   EscapeForLog(batch.worker_id()), foreign);
    }
    if (beyond > 0) {
      spdlog::warn(
          "worker {} sent {} telemetry record(s) of a step past the job's train.steps: "
          "ignored",
          EscapeForLog(batch.worker_id()), beyond);
    }
    if (ack != nullptr) {
      // How far each job the agent holds step records of is stored (the agent lets go of those).
      std::set<std::string> asked(batch.unsettled_jobs().begin(), batch.unsettled_jobs().end());
      for (const auto& rec : batch.records()) {
        if (rec.has_train()) asked.insert(rec.job_id());
      }
      // A job is over for this once its ranks' last batches had time to come (kEndedSettleS, as
      // for Tick's StoreUnfinished), counted from this controller's start too: an agent that
      // reaches it before registering again must not let go of what the one before was merging.
      constexpr size_t kMaxAsked = 1024;  // a bound against a bad batch (an agent runs a few jobs)
      const double now = clock_.UnixSeconds();
      for (const std::string& id : asked) {
        if (static_cast<size_t>(ack->settled_size()) >= kMaxAsked) break;
        const Job* job = jobs_.Find(id);
        const bool over = job == nullptr || (IsFinal(job->summary.state()) &&
                                             now - EndedAttempts(*job).second > kEndedSettleS);
        *ack->add_settled() = telemetry_.Settled(id, over);
      }
    }
  }
  telemetry_.Store(std::move(records), std::move(trim), steps, std::move(written));
}

absl::Status Controller::PushTelemetry(const v1::TelemetryBatch& batch, v1::TelemetryAck* ack) {
  std::promise<absl::Status> result;
  std::future<absl::Status> status = result.get_future();
  AcceptTelemetry(batch, ack, [&result](absl::Status s) { result.set_value(std::move(s)); });
  return status.get();
}

absl::Status Controller::PushLogs(const v1::LogBatch& batch) {
  std::map<std::string, std::string> by_job;
  {
    std::lock_guard<std::mutex> lock(mu_);
    workers_.Touch(batch.worker_id());
    int foreign = 0;  // lines of ranks another worker runs: not this worker's to write
    for (const auto& line : batch.lines()) {
      const Job* job = jobs_.Find(line.job_id());
      if (job == nullptr) continue;
      if (!JobLifecycle::HeldBy(*job, line.attempt(), line.rank(), batch.worker_id())) {
        ++foreign;
        continue;
      }
      by_job[line.job_id()] += LogStore::Format(line);
    }
    if (foreign > 0) {
      spdlog::warn("worker {} sent {} log line(s) of ranks it does not run: ignored",
                   EscapeForLog(batch.worker_id()), foreign);
    }
  }
  return logs_.Append(by_job);
}

void Controller::KvSet(const v1::KvSetRequest& req, Done done, const std::string& caller) {
  // Fencing without the state mutex: the scope is open only while its attempt runs, and only to
  // the workers of its ranks (rendezvous.h).
  if (absl::Status s =
          rendezvous_.CheckCaller({req.scope().job_id(), req.scope().attempt()}, caller);
      !s.ok()) {
    done(s);
    return;
  }
  // Bounded before anything is written (rendezvous.h: what one attempt may keep).
  if (absl::Status s = rendezvous_.Admit({req.scope().job_id(), req.scope().attempt()}, req.key(),
                                         req.value().size());
      !s.ok()) {
    done(s);
    return;
  }
  // Persisted before it is visible: a key is write-once data of its own scope and orders with
  // nothing else. A scope closed in between only leaves a row (and no in-memory key: Set ignores
  // a closed scope) of an attempt that is over, which every later call is refused. Group commit:
  // a job start's thousands of keys share a few transactions.
  kv_commit_.Submit(
      [this, job = req.scope().job_id(), attempt = req.scope().attempt(), key = req.key(),
       value = req.value()] { return store_->KvPut(job, attempt, key, value); },
      [this, scope = Rendezvous::Scope{req.scope().job_id(), req.scope().attempt()},
       key = req.key(), value = req.value(), done = std::move(done)](absl::Status s) {
        if (s.ok()) rendezvous_.Set(scope, key, value);
        done(std::move(s));
      });
}

absl::Status Controller::KvSet(const v1::KvSetRequest& req) {
  std::promise<absl::Status> result;
  std::future<absl::Status> status = result.get_future();
  KvSet(req, [&result](absl::Status s) { result.set_value(std::move(s)); });
  return status.get();
}

void Controller::KvGet(const v1::KvGetRequest& req, KvGetDone done, const std::string& caller) {
  // The rendezvous refuses a scope that is not open (fencing) by itself; a worker that holds no
  // rank of it, here.
  const Rendezvous::Scope scope{req.scope().job_id(), req.scope().attempt()};
  if (absl::Status s = rendezvous_.CheckCaller(scope, caller); !s.ok()) {
    done(s);
    return;
  }
  if (req.indexed_count() > 0) {
    if (req.keys_size() > 0) {
      done(absl::InvalidArgumentError("KvGet: an indexed wait names no keys"));
      return;
    }
    rendezvous_.WaitIndexed(scope, req.indexed_prefix(), req.indexed_count(), req.timeout_s(),
                            [done = std::move(done)](absl::StatusOr<Rendezvous::Arrivals> a) {
                              if (!a.ok()) return done(a.status());
                              v1::KvGetResponse resp;
                              resp.set_complete(a->complete);
                              resp.set_present(a->present);
                              for (uint32_t i : a->missing) resp.add_missing(i);
                              done(std::move(resp));
                            });
    return;
  }
  std::vector<std::string> keys(req.keys().begin(), req.keys().end());
  rendezvous_.Get(scope, keys, req.timeout_s(), [done = std::move(done)](Rendezvous::Values v) {
    if (!v.ok()) return done(v.status());
    v1::KvGetResponse resp;
    for (auto& value : *v) resp.add_values(std::move(value));
    done(std::move(resp));
  });
}

absl::Status Controller::RecordLocalWorker(uint32_t slot, int pid) {
  return store_->PutLocalWorker(slot, pid);
}

std::vector<std::pair<uint32_t, int>> Controller::LocalWorkers() {
  auto local = store_->LoadLocalWorkers();
  return local.ok() ? *local : std::vector<std::pair<uint32_t, int>>();
}

std::pair<uint32_t, double> Controller::EndedAttempts(const Job& job) const {
  const bool final = IsFinal(job.summary.state());
  // (A final job's summary changes no more: when it ended. A recovering one's changes with every
  // event: its ended attempt says.)
  double ended = std::max(final ? job.summary.updated_unix() : 0.0, started_unix_);
  if (job.attempts.empty()) return {1, ended};
  const v1::AttemptInfo& current = job.attempts.back();
  const bool current_ended = final || current.state() != v1::ATTEMPT_STATE_RUNNING;
  const uint32_t below = current.attempt() + (current_ended ? 1 : 0);
  if (below >= 2) ended = std::max(ended, job.attempts[below - 2].ended_unix());
  return {below, ended};
}

void Controller::Tick() {
  std::unique_lock<std::mutex> lock(mu_);
  jobs_.Tick();
  // An attempt that ended with steps some rank never reported (its agent went away): once its
  // ranks' last batches had time to come, they are stored with the ranks that did (also while the
  // job recovers or waits for workers, so no agent holds their records that long).
  const double now_unix = clock_.UnixSeconds();
  for (const std::string& id : telemetry_.JobsWithPendingSteps()) {
    const Job* job = jobs_.Find(id);
    if (job == nullptr || job->attempts.empty()) {
      telemetry_.StoreUnfinished(id);
      continue;
    }
    const auto [below, ended] = EndedAttempts(*job);
    if (below >= 2 && now_unix - ended > kEndedSettleS) telemetry_.StoreUnfinished(id, below);
  }
  telemetry_.RetryFailedWrites(clock_.MonotonicSeconds());
  ForgetEndedJobs(lock);
  // Written behind (JobLifecycle::PersistLater, WorkerRegistry::Persist), without the state
  // mutex held during the writes: worker records every tick, jobs' records about once a second
  // (a job's write carries every rank of its attempt).
  workers_.Flush(lock);
  const double now = clock_.MonotonicSeconds();
  if (now - last_job_flush_mono_ >= kJobFlushIntervalS) {
    jobs_.FlushLater(lock);
    last_job_flush_mono_ = now;
  }
}

void Controller::ForgetEndedJobs(std::unique_lock<std::mutex>& lock) {
  if (options_.forget_ended_s <= 0) return;
  const double now = clock_.MonotonicSeconds();
  if (now - last_forget_mono_ < kForgetIntervalS) return;
  last_forget_mono_ = now;
  const double before_unix = clock_.UnixSeconds() - options_.forget_ended_s;
  std::vector<std::string> ids;
  for (const auto& [id, job] : jobs_.jobs()) {
    if (IsFinal(job.summary.state()) && job.summary.updated_unix() < before_unix) {
      ids.push_back(id);
      if (ids.size() == kForgetPerPass) break;  // a bounded transaction; the rest next time
    }
  }
  if (ids.empty()) return;
  // The deletes run without the state mutex (heartbeats wait for it); the jobs are final, so
  // nothing changes them meanwhile, and they leave memory only once the store has let them go.
  lock.unlock();
  absl::Status deleted = store_->DeleteJobs(ids);
  lock.lock();
  if (!deleted.ok()) {
    spdlog::warn("could not forget {} ended job(s) (--forget-ended-jobs): {}", ids.size(),
                 deleted.ToString());
    return;
  }
  for (const std::string& id : ids) {
    jobs_.Forget(id);
    telemetry_.Forget(id);
    if (absl::Status s = logs_.Remove(id); !s.ok()) spdlog::warn("{}", s.ToString());
  }
  spdlog::info("forgot {} job(s) that ended over {:.0f} s ago (--forget-ended-jobs): {}",
               ids.size(), options_.forget_ended_s, absl::StrJoin(ids, ", "));
}

void Controller::Shutdown(bool stopping_workers) {
  rendezvous_.Shutdown();
  const std::vector<std::pair<uint32_t, int>> local =
      stopping_workers ? LocalWorkers() : std::vector<std::pair<uint32_t, int>>();
  std::unique_lock<std::mutex> lock(mu_);
  // The local workers by the slot and pid the launcher recorded (an agent started by hand on this
  // machine has a slot and pid of its own).
  std::set<std::string> stopping;
  for (const auto& [id, w] : workers_.workers()) {
    for (const auto& [slot, pid] : local) {
      if (w.info.slot() == slot && w.info.pid() == pid) stopping.insert(id);
    }
  }
  jobs_.Shutdown(stopping);
  jobs_.FlushLater(lock);
  jobs_.AbandonExitWaiters();
  workers_.Flush(lock);
}

void Controller::FlushRecords() {
  std::unique_lock<std::mutex> lock(mu_);
  jobs_.FlushLater(lock);
  workers_.Flush(lock);
}

}  // namespace furnace::controller
