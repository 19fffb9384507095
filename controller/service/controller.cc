#include "controller/service/controller.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "controller/spec/job_spec.h"
#include "controller/store/backoff.h"
#include "controller/store/job_state.h"
#include "controller/store/placement.h"
#include "proto/telemetry_labels.h"
#include "runtime/base/status.h"
#include "spdlog/spdlog.h"

namespace furnace::controller {
namespace {

namespace fs = std::filesystem;
using v1::JobState;

constexpr const char* kReady = "ready";
constexpr const char* kBusy = "busy";
constexpr const char* kLost = "lost";
// How long an error exit waits for a root-cause failure of another rank (see Job).
constexpr double kSettleS = 1.0;

std::string RandomHex(int n) {
  std::random_device rd;
  std::mt19937_64 gen(rd());
  std::string out;
  for (int i = 0; i < n; ++i) out += "0123456789abcdef"[gen() % 16];
  return out;
}

std::string DescribeExit(const v1::RankReport& r) {
  if (!r.reason().empty()) return r.reason();
  switch (r.exit_kind()) {
    case v1::EXIT_KIND_SUCCESS: return "exited with code 0";
    case v1::EXIT_KIND_CODE: return absl::StrCat("exited with code ", r.exit_code());
    case v1::EXIT_KIND_SIGNAL: return absl::StrCat("killed by signal ", r.signal());
    case v1::EXIT_KIND_HANG: return "hung";
    case v1::EXIT_KIND_OOM: return "out of memory";
    case v1::EXIT_KIND_STOPPED: return "stopped";
    case v1::EXIT_KIND_LAUNCH: return "could not be started";
    default: return "ended";
  }
}

v1::AgentCommand StopCommand(const std::string& job_id, uint32_t attempt, uint32_t rank,
                             double grace_s, const std::string& reason) {
  v1::AgentCommand cmd;
  auto* stop = cmd.mutable_stop();
  stop->set_job_id(job_id);
  stop->set_attempt(attempt);
  stop->set_rank(rank);
  stop->set_grace_s(grace_s);
  stop->set_reason(reason);
  return cmd;
}

// The restart cause as a low-cardinality label (furnace_job_restarts_total{cause}).
std::string FailureKind(v1::ExitKind kind) {
  switch (kind) {
    case v1::EXIT_KIND_SIGNAL: return "signal";
    case v1::EXIT_KIND_HANG: return "hang";
    case v1::EXIT_KIND_OOM: return "oom";
    case v1::EXIT_KIND_LAUNCH: return "launch";
    case v1::EXIT_KIND_STOPPED: return "stopped";
    default: return "exit";
  }
}

bool AllRanks(const v1::AttemptInfo& attempt, const std::string& state) {
  return std::all_of(attempt.ranks().begin(), attempt.ranks().end(),
                     [&](const v1::RankInfo& r) { return r.state() == state; });
}

}  // namespace

absl::StatusOr<std::unique_ptr<Controller>> Controller::Create(const ControllerOptions& options,
                                                               const Clock& clock) {
  std::error_code ec;
  fs::create_directories(fs::path(options.state_dir) / "logs" / "jobs", ec);
  if (ec) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot create state dir ", options.state_dir, ": ", ec.message()));
  }
  ASSIGN_OR_RETURN(auto store, JobStore::Open((fs::path(options.state_dir) / "furnace.db").string()));
  std::unique_ptr<Controller> controller(new Controller(options, clock, std::move(store)));
  RETURN_IF_ERROR(controller->Load());
  return controller;
}

Controller::Controller(const ControllerOptions& options, const Clock& clock,
                       std::unique_ptr<JobStore> store)
    : options_(options), clock_(clock), store_(std::move(store)), instance_id_(RandomHex(8)) {}

absl::Status Controller::Load() {
  std::lock_guard<std::mutex> lock(mu_);
  const double now = clock_.MonotonicSeconds();
  ASSIGN_OR_RETURN(auto workers, store_->LoadWorkers());
  for (auto& info : workers) {
    Worker& w = workers_[info.worker_id()];
    w.info = info;
    // Until it registers again, a known worker is silent since our start: it gets the full
    // timeout to come back before it is declared lost. Which rank it holds is rebuilt from the
    // attempts below, the one source of truth.
    w.last_seen_mono = now;
    w.has_rank = false;
    w.info.clear_job_id();
    w.info.set_rank(0);
  }
  ASSIGN_OR_RETURN(auto jobs, store_->LoadJobs());
  int active = 0;
  for (auto& stored : jobs) {
    Job& job = jobs_[stored.summary.job_id()];
    job.summary = std::move(stored.summary);
    job.spec = std::move(stored.spec);
    job.attempts = std::move(stored.attempts);
    job.attempt_started_mono = now;
    job.recover_at_mono = now;
    // A rank not known to have exited still occupies its worker, whatever its job's state
    // (a cancelled job's rank may still be stopping); its exit report frees the worker.
    for (const auto& attempt : job.attempts) {
      for (const auto& rank : attempt.ranks()) {
        auto it = workers_.find(rank.worker_id());
        if (it == workers_.end() || rank.state() == "exited") continue;
        Worker& w = it->second;
        if (w.has_rank && w.attempt > attempt.attempt()) continue;
        w.has_rank = true;
        w.attempt = attempt.attempt();
        w.info.set_job_id(job.summary.job_id());
        w.info.set_rank(rank.rank());
      }
    }
    ASSIGN_OR_RETURN(auto steps, store_->LoadSteps(job.summary.job_id()));
    for (const auto& st : steps) CountStep(job, st);
    if (IsFinal(job.summary.state())) continue;
    ++active;
    if (auto* attempt = job.current()) {
      ASSIGN_OR_RETURN(auto kv, store_->KvLoad(job.summary.job_id(), attempt->attempt()));
      for (auto& [key, value] : kv) {
        rendezvous_.Set({job.summary.job_id(), attempt->attempt()}, key, value);
      }
    }
    Event(job, "controller", "controller restarted; waiting for the job's workers to re-attach");
  }
  for (auto& [id, w] : workers_) {
    if (w.info.state() != kLost) w.info.set_state(w.has_rank ? kBusy : kReady);
  }
  spdlog::info("job store loaded: {} jobs ({} active), {} workers", jobs_.size(), active,
               workers_.size());
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------------
// Persistence helpers

absl::Status Controller::Persist(Job& job) {
  job.summary.set_updated_unix(clock_.UnixSeconds());
  return store_->Transaction([&]() -> absl::Status {
    RETURN_IF_ERROR(store_->PutSummary(job.summary));
    // The two newest attempts can change (a failing one and the next); older ones are final.
    const size_t n = job.attempts.size();
    for (size_t i = n >= 2 ? n - 2 : 0; i < n; ++i) {
      RETURN_IF_ERROR(store_->PutAttempt(job.summary.job_id(), job.attempts[i]));
    }
    return absl::OkStatus();
  });
}

void Controller::Event(Job& job, const std::string& kind, const std::string& message) {
  v1::JobEvent event;
  event.set_unix_time(clock_.UnixSeconds());
  event.set_kind(kind);
  event.set_message(message);
  spdlog::info("job {}: [{}] {}", job.summary.job_id(), kind, message);
  if (absl::Status s = store_->AddEvent(job.summary.job_id(), event); !s.ok()) {
    spdlog::error("job {}: cannot record event: {}", job.summary.job_id(), s.ToString());
  }
}

absl::Status Controller::Transition(Job& job, JobState to, const std::string& event_kind,
                                    const std::string& message) {
  RETURN_IF_ERROR(CheckTransition(job.summary.state(), to));
  const JobState from = job.summary.state();
  job.summary.set_state(to);
  if (absl::Status s = Persist(job); !s.ok()) {
    job.summary.set_state(from);
    spdlog::error("job {}: transition to {} not persisted: {}", job.summary.job_id(),
                  StateName(to), s.ToString());
    return s;
  }
  Event(job, event_kind, absl::StrCat(StateName(from), " -> ", StateName(to),
                                      message.empty() ? "" : ": ", message));
  return absl::OkStatus();
}

void Controller::PersistWorker(const Worker& worker) {
  if (absl::Status s = store_->PutWorker(worker.info); !s.ok()) {
    spdlog::error("worker {}: not persisted: {}", worker.info.worker_id(), s.ToString());
  }
}

std::string Controller::LogPath(const std::string& job_id) const {
  return (fs::path(options_.state_dir) / "logs" / "jobs" / (job_id + ".log")).string();
}

uint32_t Controller::Capacity(const std::string& device_kind) const {
  uint32_t known = 0;
  for (const auto& [id, w] : workers_) {
    if (w.info.state() != kLost && w.info.device_kind() == device_kind) ++known;
  }
  const uint32_t local = device_kind == "cpu" ? options_.local_workers : 0;
  return std::max(known, local);
}

// ---------------------------------------------------------------------------------------------
// JobService

absl::StatusOr<std::string> Controller::Submit(const std::string& yaml,
                                               const std::string& filename) {
  ASSIGN_OR_RETURN(v1::JobSpec spec, spec::ParseJobYaml(yaml, filename));
  const uint32_t world = spec::WorldSize(spec);
  std::lock_guard<std::mutex> lock(mu_);
  const uint32_t capacity = Capacity(spec.resources().device());
  if (world > capacity) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: resources.workers: the job needs %d ranks (pp*dp*tp = %d*%d*%d) but this controller "
        "has %d %s worker(s); allowed: at most %d",
        filename, world, spec.parallel().pp(), spec.parallel().dp(), spec.parallel().tp(),
        capacity, spec.resources().device(), capacity));
  }
  ASSIGN_OR_RETURN(uint64_t seq, store_->NextJobSeq());
  Job job;
  job.spec = std::move(spec);
  const std::string id = absl::StrCat(job.spec.name(), "-", seq);
  if (job.spec.checkpoint().dir().empty()) {
    job.spec.mutable_checkpoint()->set_dir(
        (fs::path(options_.state_dir) / "checkpoints" / id).string());
  }
  auto& s = job.summary;
  s.set_job_id(id);
  s.set_name(job.spec.name());
  s.set_kind(job.spec.kind());
  s.set_state(v1::JOB_PENDING);
  s.set_world_size(world);
  s.set_submitted_unix(clock_.UnixSeconds());
  s.set_updated_unix(s.submitted_unix());
  RETURN_IF_ERROR(store_->PutJob(s, job.spec));
  auto [it, inserted] = jobs_.emplace(id, std::move(job));
  Event(it->second, "submitted", absl::StrCat("from ", filename, ", ", world, " ranks"));
  TryStart(it->second);
  return id;
}

std::vector<v1::JobSummary> Controller::ListJobs() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<v1::JobSummary> out;
  for (auto& [id, job] : jobs_) out.push_back(job.summary);
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) {
    return a.submitted_unix() < b.submitted_unix();
  });
  return out;
}

absl::StatusOr<v1::JobDetail> Controller::GetJob(const std::string& job_id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("no job '", job_id, "'"));
  const Job& job = it->second;
  v1::JobDetail detail;
  *detail.mutable_summary() = job.summary;
  *detail.mutable_spec() = job.spec;
  for (const auto& a : job.attempts) *detail.add_attempts() = a;
  ASSIGN_OR_RETURN(auto events, store_->LoadEvents(job_id, 50));
  for (auto& e : events) *detail.add_events() = std::move(e);
  ASSIGN_OR_RETURN(auto comm, store_->LoadCommResults(job_id));
  for (auto& c : comm) *detail.add_comm() = std::move(c);
  ASSIGN_OR_RETURN(auto latest, store_->LatestRecord(job_id, 0));
  if (latest && latest->has_train()) *detail.mutable_telemetry() = latest->train();
  return detail;
}

absl::StatusOr<v1::JobSummary> Controller::Cancel(const std::string& job_id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("no job '", job_id, "'"));
  Job& job = it->second;
  if (IsFinal(job.summary.state())) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job ", job_id, " already ended (", StateName(job.summary.state()), ")"));
  }
  const Job backup = job;
  if (auto* attempt = job.current(); attempt && attempt->state() == "running") {
    attempt->set_state("cancelled");
    attempt->set_cause("cancelled by user");
    attempt->set_ended_unix(clock_.UnixSeconds());
  }
  job.summary.set_cause("cancelled by user");
  if (absl::Status s = Transition(job, v1::JOB_CANCELLED, "cancelled", "cancelled by user");
      !s.ok()) {
    job = backup;
    return s;
  }
  StopAttemptRanks(job, "job cancelled");
  if (auto* attempt = job.current()) CloseScope(job, attempt->attempt());
  return job.summary;
}

std::vector<v1::WorkerInfo> Controller::ListWorkers() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<v1::WorkerInfo> out;
  for (auto& [id, w] : workers_) out.push_back(w.info);
  return out;
}

absl::StatusOr<v1::GetLogsResponse> Controller::GetLogs(const v1::GetLogsRequest& req) {
  std::string path;
  bool done = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = jobs_.find(req.job_id());
    if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("no job '", req.job_id(), "'"));
    path = LogPath(req.job_id());
    done = IsFinal(it->second.summary.state());
  }
  v1::GetLogsResponse resp;
  std::ifstream in(path);
  std::string line;
  uint64_t index = 0;
  constexpr size_t kMaxLines = 5000;
  while (std::getline(in, line)) {
    if (in.eof()) break;  // a partial last line: wait until it is complete
    if (index++ < req.offset()) continue;
    // Stored as "<attempt> <rank> <text>".
    unsigned attempt = 0, rank = 0;
    int consumed = 0;
    if (sscanf(line.c_str(), "%u %u %n", &attempt, &rank, &consumed) < 2) continue;
    if (req.rank() >= 0 && static_cast<unsigned>(req.rank()) != rank) continue;
    if (req.attempt() > 0 && static_cast<unsigned>(req.attempt()) != attempt) continue;
    resp.add_lines(absl::StrCat("[attempt ", attempt, " rank ", rank, "] ", line.substr(consumed)));
    if (static_cast<size_t>(resp.lines_size()) >= kMaxLines) {
      ++index;
      break;
    }
  }
  resp.set_next_offset(std::max<uint64_t>(index, req.offset()));
  resp.set_job_done(done);
  return resp;
}

// ---------------------------------------------------------------------------------------------
// Placement and recovery

void Controller::Enqueue(Worker& worker, v1::AgentCommand command) {
  worker.commands.push_back(std::move(command));
  commands_cv_.notify_all();
}

void Controller::TryStart(Job& job) {
  std::vector<WorkerSlot> slots;
  for (const auto& [id, w] : workers_) {
    slots.push_back({id, w.info.host(), w.info.slot(), w.info.device_kind(),
                     w.info.state() == kReady && !w.has_rank && !w.session_id.empty()});
  }
  auto placement = PlaceRanks(slots, job.summary.world_size(), job.spec.resources().device(),
                              job.avoid_workers);
  if (!placement.ok()) {
    const std::string reason = std::string(placement.status().message());
    if (reason != job.waiting_reason) {
      job.waiting_reason = reason;
      Event(job, "waiting", reason);
    }
    return;
  }
  job.waiting_reason.clear();
  const uint32_t n = job.summary.attempt() + 1;
  v1::AttemptInfo attempt;
  attempt.set_attempt(n);
  attempt.set_state("running");
  attempt.set_started_unix(clock_.UnixSeconds());
  for (uint32_t r = 0; r < placement->size(); ++r) {
    const Worker& w = workers_.at((*placement)[r]);
    auto* rank = attempt.add_ranks();
    rank->set_rank(r);
    rank->set_worker_id(w.info.worker_id());
    rank->set_host(w.info.host());
    rank->set_state("assigned");
  }
  const Job backup = job;
  job.attempts.push_back(attempt);
  job.summary.set_attempt(n);
  job.summary.set_step(0);
  // PENDING -> SCHEDULED -> STARTING lands in the store as one write (the STARTING one), so a
  // controller that dies in between never finds a job parked in SCHEDULED.
  if (job.summary.state() == v1::JOB_PENDING) {
    if (!CheckTransition(v1::JOB_PENDING, v1::JOB_SCHEDULED).ok()) return;
    job.summary.set_state(v1::JOB_SCHEDULED);
  }
  if (!Transition(job, v1::JOB_STARTING, "starting",
                  absl::StrCat("attempt ", n, ": ", placement->size(), " ranks placed on ",
                               absl::StrJoin(*placement, ", ")))
           .ok()) {
    job = backup;
    return;
  }
  job.attempt_started_mono = clock_.MonotonicSeconds();
  for (uint32_t r = 0; r < placement->size(); ++r) {
    Worker& w = workers_.at((*placement)[r]);
    w.has_rank = true;
    w.attempt = n;
    w.info.set_state(kBusy);
    w.info.set_job_id(job.summary.job_id());
    w.info.set_rank(r);
    PersistWorker(w);
    Enqueue(w, StartCommand(job, r, w));
  }
}

v1::AgentCommand Controller::StartCommand(const Job& job, uint32_t rank, const Worker& worker) const {
  v1::AgentCommand cmd;
  auto* task = cmd.mutable_start();
  task->set_job_id(job.summary.job_id());
  task->set_attempt(job.summary.attempt());
  task->set_rank(rank);
  task->set_world_size(job.summary.world_size());
  *task->mutable_spec() = job.spec;
  task->set_controller_address(options_.advertise_address);
  task->set_host(worker.info.host());
  return cmd;
}

void Controller::NoteWeakFailure(Job& job, const std::string& cause, const std::string& worker) {
  if (job.settle_deadline == 0) {
    job.settle_deadline = clock_.MonotonicSeconds() + kSettleS;
    job.pending_cause = cause;
    job.pending_worker = worker;
  }
  if (AllRanks(*job.current(), "exited")) {
    job.settle_deadline = 0;
    FailAttempt(job, "exit", job.pending_cause, job.pending_worker);
  }
}

void Controller::StopAttemptRanks(Job& job, const std::string& reason) {
  auto* attempt = job.current();
  if (!attempt) return;
  for (const auto& rank : attempt->ranks()) {
    if (rank.state() == "exited") continue;
    auto it = workers_.find(rank.worker_id());
    if (it == workers_.end() || it->second.info.state() == kLost) continue;
    Enqueue(it->second, StopCommand(job.summary.job_id(), attempt->attempt(), rank.rank(),
                                    options_.stop_grace_s, reason));
  }
}

void Controller::CloseScope(Job& job, uint32_t attempt) {
  rendezvous_.Close({job.summary.job_id(), attempt});
  if (absl::Status s = store_->KvDropScope(job.summary.job_id(), attempt); !s.ok()) {
    spdlog::warn("job {}: cannot drop rendezvous keys: {}", job.summary.job_id(), s.ToString());
  }
}

void Controller::FailAttempt(Job& job, const std::string& kind, const std::string& cause,
                             const std::string& culprit_worker, Failure failure) {
  const bool counts_as_restart = failure != Failure::kInterrupted;
  auto* attempt = job.current();
  if (!attempt || attempt->state() != "running") return;
  job.settle_deadline = 0;
  const Job backup = job;
  attempt->set_state(counts_as_restart ? "failed" : "interrupted");
  attempt->set_cause(cause);
  attempt->set_failure_kind(kind);
  attempt->set_ended_unix(clock_.UnixSeconds());
  const uint32_t n = attempt->attempt();
  const uint32_t max_restarts = job.spec.recovery().max_restarts();
  absl::Status persisted;
  if (!counts_as_restart) {
    job.recover_at_mono = clock_.MonotonicSeconds();
    job.summary.set_cause(cause);
    persisted = Transition(job, v1::JOB_RECOVERING, "interrupted",
                           absl::StrFormat("attempt %d interrupted: %s; it does not count "
                                           "against recovery.max_restarts", n, cause));
  } else if (failure == Failure::kPermanent) {
    job.summary.set_cause(absl::StrCat(cause, " (not retried: the job's input is invalid)"));
    persisted = Transition(job, v1::JOB_FAILED, "failed", job.summary.cause());
  } else if (job.summary.restarts() < max_restarts) {
    job.summary.set_restarts(job.summary.restarts() + 1);
    const double delay = BackoffDelay(job.spec.recovery().backoff(), job.summary.restarts());
    job.recover_at_mono = clock_.MonotonicSeconds() + delay;
    job.summary.set_cause(cause);
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
    return;
  }
  job.avoid_workers.clear();
  if (!culprit_worker.empty()) job.avoid_workers.insert(culprit_worker);
  StopAttemptRanks(job, absl::StrCat("attempt ", n, " ", counts_as_restart ? "failed" :
                                     "interrupted", ": ", cause));
  CloseScope(job, n);
}

void Controller::FreeWorker(const std::string& worker_id, const std::string& job_id,
                            uint32_t attempt, uint32_t rank) {
  auto it = workers_.find(worker_id);
  if (it == workers_.end()) return;
  Worker& w = it->second;
  if (!w.has_rank || w.info.job_id() != job_id || w.attempt != attempt || w.info.rank() != rank) {
    return;
  }
  w.has_rank = false;
  w.attempt = 0;
  w.info.clear_job_id();
  w.info.set_rank(0);
  if (w.info.state() == kBusy) w.info.set_state(kReady);
  PersistWorker(w);
}

void Controller::MarkLost(Worker& worker, const std::string& why) {
  if (worker.info.state() == kLost) return;
  spdlog::warn("worker {} lost: {}", worker.info.worker_id(), why);
  worker.info.set_state(kLost);
  worker.session_id.clear();  // it must register again
  worker.commands.clear();
  const std::string job_id = worker.info.job_id();
  const uint32_t attempt_n = worker.attempt;
  const uint32_t rank_n = worker.info.rank();
  const bool had_rank = worker.has_rank;
  worker.has_rank = false;
  worker.attempt = 0;
  worker.info.clear_job_id();
  PersistWorker(worker);
  if (!had_rank) return;
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return;
  Job& job = it->second;
  if (attempt_n == 0 || attempt_n > job.attempts.size()) return;
  v1::AttemptInfo* attempt = &job.attempts[attempt_n - 1];
  if (rank_n < static_cast<uint32_t>(attempt->ranks_size())) {
    auto* rank = attempt->mutable_ranks(rank_n);
    rank->set_state("exited");
    rank->set_exit(absl::StrCat("lost with its worker (", why, ")"));
  }
  if (attempt == job.current() && attempt->state() == "running" &&
      !IsFinal(job.summary.state())) {
    FailAttempt(job, "lost",
                absl::StrCat("worker ", worker.info.worker_id(), " lost (", why, "); rank ",
                             rank_n, " gone"),
                worker.info.worker_id());
  } else {
    Persist(job).IgnoreError();
  }
}

void Controller::Tick() {
  std::lock_guard<std::mutex> lock(mu_);
  const double now = clock_.MonotonicSeconds();
  // Agents that stopped heart-beating. A job may ask for a shorter limit for its own workers.
  for (auto& [id, w] : workers_) {
    if (w.info.state() == kLost) continue;
    double limit = options_.worker_timeout_s;
    if (w.has_rank) {
      auto jt = jobs_.find(w.info.job_id());
      if (jt != jobs_.end() && jt->second.spec.recovery().heartbeat_timeout_s() > 0) {
        limit = std::min(limit, jt->second.spec.recovery().heartbeat_timeout_s());
      }
    }
    // Known from the store and not registered since our start: the controller was the one away,
    // so the agent gets the re-attach grace, counted from our start, whatever the job asks.
    if (w.session_id.empty()) limit = std::max(limit, options_.reattach_grace_s);
    const double silent = now - w.last_seen_mono;
    if (silent > limit) MarkLost(w, absl::StrFormat("no heartbeat for %.1f s", silent));
  }
  for (auto& [id, job] : jobs_) {
    if (job.settle_deadline > 0 && now >= job.settle_deadline) {
      job.settle_deadline = 0;
      FailAttempt(job, "exit", job.pending_cause, job.pending_worker);
    }
    switch (job.summary.state()) {
      case v1::JOB_PENDING:
        TryStart(job);
        break;
      case v1::JOB_RECOVERING:
        if (now >= job.recover_at_mono) TryStart(job);
        break;
      case v1::JOB_STARTING: {
        auto* attempt = job.current();
        const double limit = job.spec.recovery().start_timeout_s();
        if (attempt && now - job.attempt_started_mono > limit) {
          std::vector<std::string> late;
          for (const auto& r : attempt->ranks()) {
            if (r.state() == "assigned") {
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
}

// ---------------------------------------------------------------------------------------------
// AgentService

absl::StatusOr<v1::RegisterResponse> Controller::Register(const v1::RegisterRequest& req) {
  if (req.worker_id().empty()) return absl::InvalidArgumentError("worker_id is empty");
  std::lock_guard<std::mutex> lock(mu_);
  Worker& w = workers_[req.worker_id()];
  const bool known = !w.info.worker_id().empty();
  // A different agent process than the one we knew: what it ran died with the old one.
  const bool agent_restarted =
      known && (w.info.pid() != req.pid() || w.info.instance_id() != req.instance_id());
  w.info.set_worker_id(req.worker_id());
  w.info.set_host(req.host());
  w.info.set_slot(req.slot());
  w.info.set_device_kind(req.device_kind());
  w.info.set_device_memory(req.device_memory());
  w.info.set_pid(req.pid());
  w.info.set_instance_id(req.instance_id());
  w.info.set_last_seen_unix(clock_.UnixSeconds());
  w.last_seen_mono = clock_.MonotonicSeconds();
  const bool first_since_start = w.session_id.empty();
  w.session_id = absl::StrCat(instance_id_, "-", ++session_counter_);
  if (agent_restarted) w.commands.clear();

  // The rank it runs: re-attach it if its attempt still wants it; otherwise stop it, and keep the
  // worker busy (draining) until its exit report arrives, so no second rank lands beside it.
  bool runs_our_rank = false;
  for (const auto& rr : req.running()) {
    auto jt = jobs_.find(rr.job_id());
    bool wanted = false;
    if (jt != jobs_.end() && !IsFinal(jt->second.summary.state())) {
      Job& job = jt->second;
      auto* attempt = job.current();
      if (attempt && attempt->attempt() == rr.attempt() && attempt->state() == "running" &&
          rr.rank() < static_cast<uint32_t>(attempt->ranks_size()) &&
          attempt->ranks(rr.rank()).worker_id() == req.worker_id() &&
          attempt->ranks(rr.rank()).state() != "exited") {
        wanted = true;
        auto* rank = attempt->mutable_ranks(rr.rank());
        rank->set_state("running");
        rank->set_pid(rr.pid());
        // Only an agent's first registration with this controller run re-attaches: one that
        // registers again (its Register timed out on its side after we took it) brings nothing
        // new.
        if (first_since_start) {
          Event(job, "reattached",
                absl::StrCat("rank ", rr.rank(), " (pid ", rr.pid(), ") on ", req.worker_id()));
        }
        if (job.summary.state() == v1::JOB_STARTING && AllRanks(*attempt, "running")) {
          attempt->set_all_running_unix(clock_.UnixSeconds());
          Transition(job, v1::JOB_RUNNING, "running", "all ranks running (re-attached)")
              .IgnoreError();
        } else {
          Persist(job).IgnoreError();
        }
      }
    }
    if (!wanted) {
      Enqueue(w, StopCommand(rr.job_id(), rr.attempt(), rr.rank(), options_.stop_grace_s,
                             "no attempt of this job wants this rank any more"));
    }
    w.has_rank = true;
    w.attempt = rr.attempt();
    w.info.set_job_id(rr.job_id());
    w.info.set_rank(rr.rank());
    runs_our_rank = true;
  }
  // A rank we placed here that the agent no longer runs. If the agent itself restarted, the rank
  // died with it (when it is the current attempt's, that attempt fails; an older attempt's rank
  // is simply gone). Otherwise its exit report is on its way (agents re-send unacked reports);
  // a rank still "assigned" never got its start command (lost with a controller restart): send
  // it again, the agent ignores a start it already had.
  if (w.has_rank && !runs_our_rank) {
    auto jt = jobs_.find(w.info.job_id());
    Job* job = jt == jobs_.end() ? nullptr : &jt->second;
    v1::AttemptInfo* attempt =
        job && w.attempt >= 1 && w.attempt <= job->attempts.size() ? &job->attempts[w.attempt - 1]
                                                                   : nullptr;
    const uint32_t rank_n = w.info.rank();
    v1::RankInfo* rank = attempt && rank_n < static_cast<uint32_t>(attempt->ranks_size())
                             ? attempt->mutable_ranks(rank_n)
                             : nullptr;
    if (agent_restarted || rank == nullptr) {
      w.has_rank = false;
      w.attempt = 0;
      w.info.clear_job_id();
      if (rank != nullptr && rank->state() != "exited") {
        rank->set_state("exited");
        rank->set_exit("lost: its worker agent restarted");
        if (attempt == job->current() && attempt->state() == "running" &&
            !IsFinal(job->summary.state())) {
          FailAttempt(*job, "agent_restart",
                      absl::StrCat("worker ", req.worker_id(), " restarted; rank ", rank_n,
                                   " lost"),
                      req.worker_id());
        } else {
          Persist(*job).IgnoreError();
        }
      }
    } else if (rank->state() == "assigned" && attempt == job->current() &&
               attempt->state() == "running") {
      Enqueue(w, StartCommand(*job, rank_n, w));
    }
  }
  w.info.set_state(w.has_rank ? kBusy : kReady);
  PersistWorker(w);
  spdlog::info("worker {} registered (host {}, slot {}, pid {}, {} running rank(s))",
               req.worker_id(), req.host(), req.slot(), req.pid(), req.running_size());
  v1::RegisterResponse resp;
  resp.set_session_id(w.session_id);
  resp.set_heartbeat_interval_s(options_.heartbeat_interval_s);
  commands_cv_.notify_all();  // an older command stream of this worker ends
  return resp;
}

v1::HeartbeatResponse Controller::Heartbeat(const v1::HeartbeatRequest& req) {
  std::lock_guard<std::mutex> lock(mu_);
  v1::HeartbeatResponse resp;
  auto it = workers_.find(req.worker_id());
  if (it == workers_.end() || it->second.session_id.empty() ||
      it->second.session_id != req.session_id()) {
    resp.set_reregister(true);
    return resp;
  }
  it->second.last_seen_mono = clock_.MonotonicSeconds();
  it->second.info.set_last_seen_unix(clock_.UnixSeconds());
  return resp;
}

absl::StatusOr<std::vector<v1::AgentCommand>> Controller::NextCommands(
    const std::string& worker_id, const std::string& session_id, double wait_s) {
  std::unique_lock<std::mutex> lock(mu_);
  auto deadline = std::chrono::steady_clock::now() +
                  std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                      std::chrono::duration<double>(wait_s));
  while (true) {
    auto it = workers_.find(worker_id);
    if (it == workers_.end() || it->second.session_id != session_id) {
      return absl::FailedPreconditionError("stale worker session: register again");
    }
    Worker& w = it->second;
    if (!w.commands.empty()) {
      std::vector<v1::AgentCommand> out(w.commands.begin(), w.commands.end());
      w.commands.clear();
      return out;
    }
    if (commands_cv_.wait_until(lock, deadline) == std::cv_status::timeout) {
      return std::vector<v1::AgentCommand>();
    }
  }
}

void Controller::Requeue(const std::string& worker_id, std::vector<v1::AgentCommand> commands) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = workers_.find(worker_id);
  if (it == workers_.end()) return;
  for (auto c = commands.rbegin(); c != commands.rend(); ++c) {
    it->second.commands.push_front(std::move(*c));
  }
}

absl::Status Controller::ReportRank(const v1::RankReport& report) {
  std::lock_guard<std::mutex> lock(mu_);
  if (shut_down_) return absl::OkStatus();  // ranks being stopped by our own shutdown
  if (auto wt = workers_.find(report.worker_id()); wt != workers_.end()) {
    wt->second.last_seen_mono = clock_.MonotonicSeconds();
  }
  auto jt = jobs_.find(report.job_id());
  if (jt == jobs_.end()) return absl::OkStatus();  // a job we do not know: nothing to update
  Job& job = jt->second;
  if (report.attempt() == 0 || report.attempt() > job.attempts.size()) return absl::OkStatus();
  const Job backup = job;
  v1::AttemptInfo& attempt = job.attempts[report.attempt() - 1];
  if (report.rank() >= static_cast<uint32_t>(attempt.ranks_size())) return absl::OkStatus();
  v1::RankInfo& rank = *attempt.mutable_ranks(report.rank());
  const bool current = job.current() == &attempt && attempt.state() == "running" &&
                       !IsFinal(job.summary.state());
  // On a store error, undo and fail the RPC: the agent re-sends the report.
  auto undo = [&](absl::Status s) {
    job = backup;
    return s;
  };

  if (report.event() == v1::RANK_STARTED) {
    if (rank.state() == "exited") return absl::OkStatus();
    rank.set_state("running");
    rank.set_pid(report.pid());
    absl::Status s;
    if (!current) {
      s = Persist(job);
      // Started after its attempt ended (e.g. a late command): stop it.
      if (auto wt = workers_.find(report.worker_id()); s.ok() && wt != workers_.end()) {
        Enqueue(wt->second, StopCommand(report.job_id(), report.attempt(), report.rank(),
                                        options_.stop_grace_s, "its attempt is over"));
      }
    } else if (job.summary.state() == v1::JOB_STARTING && AllRanks(attempt, "running")) {
      attempt.set_all_running_unix(clock_.UnixSeconds());
      s = Transition(job, v1::JOB_RUNNING, "running",
                     absl::StrFormat("attempt %d: all %d ranks running %.2f s after placement",
                                     attempt.attempt(), attempt.ranks_size(),
                                     attempt.all_running_unix() - attempt.started_unix()));
    } else {
      s = Persist(job);
    }
    return s.ok() ? s : undo(s);
  }

  if (report.event() != v1::RANK_EXITED) return absl::OkStatus();
  if (rank.state() == "exited") {  // a re-sent report
    FreeWorker(rank.worker_id(), report.job_id(), report.attempt(), report.rank());
    return absl::OkStatus();
  }
  rank.set_state("exited");
  rank.set_exit(DescribeExit(report));
  const std::string worker_id = rank.worker_id();
  absl::Status s;
  if (!current) {
    s = Persist(job);
  } else if (report.exit_kind() == v1::EXIT_KIND_SUCCESS) {
    if (AllRanks(attempt, "exited")) {
      attempt.set_state("succeeded");
      attempt.set_ended_unix(clock_.UnixSeconds());
      job.summary.set_cause("");
      if (job.summary.state() == v1::JOB_STARTING) {
        // Every rank finished before the last start report was seen: still a full run.
        s = Transition(job, v1::JOB_RUNNING, "running", "all ranks ran");
      }
      if (s.ok()) {
        s = Transition(job, v1::JOB_SUCCEEDED, "succeeded",
                       absl::StrCat("all ", attempt.ranks_size(), " ranks exited with code 0"));
      }
      if (s.ok()) CloseScope(job, attempt.attempt());
    } else {
      s = Persist(job);
    }
  } else if (report.exit_kind() == v1::EXIT_KIND_CODE &&
             (report.exit_code() == v1::RANK_EXIT_UNKNOWN_KIND ||
              report.exit_code() == v1::RANK_EXIT_BAD_INPUT)) {
    FailAttempt(job, "bad_input",
                absl::StrCat("rank ", report.rank(), " on ", report.worker_id(), ": ",
                             DescribeExit(report)),
                "", Failure::kPermanent);
  } else if (report.exit_kind() == v1::EXIT_KIND_CODE) {
    s = Persist(job);
    if (s.ok()) {
      NoteWeakFailure(job, absl::StrCat("rank ", report.rank(), " on ", report.worker_id(), ": ",
                                        DescribeExit(report)),
                      report.worker_id());
    }
  } else {
    FailAttempt(job, FailureKind(report.exit_kind()),
                absl::StrCat("rank ", report.rank(), " on ", report.worker_id(), ": ",
                             DescribeExit(report)),
                report.worker_id());
    if (job.attempts[report.attempt() - 1].state() == "running") {
      s = absl::UnavailableError("controller could not record the failure; retry");
    }
  }
  if (!s.ok()) return undo(s);
  FreeWorker(worker_id, report.job_id(), report.attempt(), report.rank());
  return absl::OkStatus();
}

void Controller::Shutdown(bool stopping_workers) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!stopping_workers) return;
  for (auto& [id, job] : jobs_) {
    if (job.summary.state() != v1::JOB_STARTING && job.summary.state() != v1::JOB_RUNNING) {
      continue;
    }
    FailAttempt(job, "interrupted", "the controller shut down and stopped its local workers", "",
                Failure::kInterrupted);
    if (auto* attempt = job.current()) {
      for (auto& rank : *attempt->mutable_ranks()) {
        if (rank.state() != "exited") {
          rank.set_state("exited");
          rank.set_exit("stopped: the controller shut down");
        }
      }
      Persist(job).IgnoreError();
    }
  }
  for (auto& [wid, w] : workers_) {
    w.has_rank = false;
    w.attempt = 0;
    w.info.clear_job_id();
    if (w.info.state() == kBusy) w.info.set_state(kReady);
    PersistWorker(w);
  }
  shut_down_ = true;
}

absl::Status Controller::PushTelemetry(const v1::TelemetryBatch& batch) {
  std::lock_guard<std::mutex> lock(mu_);
  if (auto wt = workers_.find(batch.worker_id()); wt != workers_.end()) {
    wt->second.last_seen_mono = clock_.MonotonicSeconds();
  }
  if (batch.dropped() > 0) {
    telemetry_dropped_ += batch.dropped();
    spdlog::warn("worker {} dropped {} telemetry records (controller too slow or away)",
                 batch.worker_id(), batch.dropped());
  }
  telemetry_records_ += batch.records_size();
  std::set<std::string> touched;
  std::vector<v1::TelemetryRecord> records;
  for (const auto& rec : batch.records()) {
    auto jt = jobs_.find(rec.job_id());
    if (jt == jobs_.end()) continue;
    Job& job = jt->second;
    records.push_back(rec);
    if (rec.attempt() == 0 || rec.attempt() > job.attempts.size()) continue;
    auto& attempt = job.attempts[rec.attempt() - 1];
    if (rec.rank() >= static_cast<uint32_t>(attempt.ranks_size())) continue;
    attempt.mutable_ranks(rec.rank())->set_step(rec.step());
    if (&attempt == job.current()) {
      uint64_t min_step = UINT64_MAX;
      for (const auto& r : attempt.ranks()) min_step = std::min<uint64_t>(min_step, r.step());
      job.summary.set_step(min_step);
      job.summary.set_total_steps(std::max(job.summary.total_steps(), rec.total_steps()));
    }
    touched.insert(rec.job_id());
    if (rec.has_train()) AccumulateStep(job, rec);
  }
  return store_->Transaction([&]() -> absl::Status {
    RETURN_IF_ERROR(store_->AddTelemetry(records));
    for (const auto& rec : records) {
      if (rec.rank() != 0) continue;
      for (const auto& c : rec.comm()) RETURN_IF_ERROR(store_->PutCommResult(rec.job_id(), c));
    }
    for (const auto& id : touched) {
      Job& job = jobs_.at(id);
      RETURN_IF_ERROR(store_->PutSummary(job.summary));
      if (auto* a = job.current()) RETURN_IF_ERROR(store_->PutAttempt(id, *a));
      // Retention: raw per-rank records are for recent detail; steps keep the history.
      constexpr uint64_t kTrimEvery = 1000;
      constexpr int kKeepRecords = 5000;
      job.records_since_trim += records.size();
      if (job.records_since_trim >= kTrimEvery) {
        job.records_since_trim = 0;
        RETURN_IF_ERROR(store_->TrimTelemetry(id, kKeepRecords));
      }
    }
    return absl::OkStatus();
  });
}

void Controller::AccumulateStep(Job& job, const v1::TelemetryRecord& rec) {
  auto key = std::make_pair(rec.attempt(), rec.step());
  if (job.has_step && key <= std::make_pair(job.last_step.attempt(), job.last_step.step())) {
    return;  // already aggregated (a straggler or a re-sent batch)
  }
  Job::PendingStep& p = job.pending_steps[key];
  const v1::StepTelemetry& t = rec.train();
  v1::StepRecord& r = p.record;
  r.set_attempt(rec.attempt());
  r.set_step(rec.step());
  r.set_unix_time(std::max(r.unix_time(), rec.unix_time()));
  p.loss_sum += t.loss();
  p.aux_sum += t.aux_loss();
  ++p.loss_n;
  p.mfu_sum += t.mfu();
  p.grad_norm_sum += t.grad_norm();
  r.set_tokens(r.tokens() + static_cast<double>(t.tokens()));
  r.set_step_seconds(std::max(r.step_seconds(), t.step_seconds()));
  r.set_activation_peak_bytes(
      std::max(r.activation_peak_bytes(), static_cast<double>(t.memory().activation_peak_bytes())));
  r.set_memory_budget_bytes(static_cast<double>(t.memory().budget_bytes()));
  r.set_checkpoint_seconds(std::max(r.checkpoint_seconds(), t.checkpoint_seconds()));
  r.set_lr(t.lr());
  for (const v1::MoeLayerTelemetry& layer : t.moe_layers()) {
    constexpr uint32_t kMaxLayers = 4096, kMaxExperts = 65536;  // a bound against a bad record
    if (layer.layer() >= kMaxLayers || layer.expert_tokens_size() > static_cast<int>(kMaxExperts)) {
      continue;
    }
    if (p.expert_tokens.size() <= layer.layer()) p.expert_tokens.resize(layer.layer() + 1);
    std::vector<double>& sum = p.expert_tokens[layer.layer()];
    if (sum.size() < static_cast<size_t>(layer.expert_tokens_size())) {
      sum.resize(layer.expert_tokens_size());
    }
    for (int e = 0; e < layer.expert_tokens_size(); ++e) {
      sum[e] += static_cast<double>(layer.expert_tokens(e));
    }
  }
  for (const v1::PlannerActionBytes& a : t.planner()) p.planner[a.action()] += a.bytes();
  for (const v1::CommTelemetry& c : t.comm()) {
    v1::CommTelemetry& sum = p.comm[{c.op(), c.group()}];
    sum.set_op(c.op());
    sum.set_group(c.group());
    sum.set_bytes(sum.bytes() + c.bytes());
    sum.set_seconds(sum.seconds() + c.seconds());
    sum.set_calls(sum.calls() + c.calls());
  }
  ++p.ranks;
  if (p.ranks >= job.summary.world_size()) {
    FinishStep(job, p);
    // Older steps still pending lost a rank's record (dropped under back-pressure): drop them.
    job.pending_steps.erase(job.pending_steps.begin(), job.pending_steps.upper_bound(key));
  }
}

void Controller::FinishStep(Job& job, Job::PendingStep& p) {
  v1::StepRecord& r = p.record;
  r.set_ranks(p.ranks);
  if (p.loss_n > 0) {
    r.set_loss(p.loss_sum / p.loss_n);
    r.set_aux_loss(p.aux_sum / p.loss_n);
  }
  r.set_mfu(p.mfu_sum / p.ranks);
  r.set_grad_norm(p.grad_norm_sum / p.ranks);
  if (r.step_seconds() > 0) r.set_tokens_per_second(r.tokens() / r.step_seconds());
  for (const auto& layer : p.expert_tokens) {
    auto* et = r.add_expert_tokens();
    double sum = 0, max = 0;
    for (double t : layer) {
      et->add_tokens(t);
      sum += t;
      max = std::max(max, t);
    }
    const double mean = layer.empty() ? 0 : sum / layer.size();
    r.add_imbalance(mean > 0 ? max / mean : 0);
  }
  for (const auto& [action, bytes] : p.planner) {
    v1::PlannerActionBytes* a = r.add_planner();
    a->set_action(static_cast<v1::PlannerAction>(action));
    a->set_bytes(bytes);
  }
  for (const auto& [key, comm] : p.comm) *r.add_comm() = comm;
  if (absl::Status s = store_->PutStep(job.summary.job_id(), r); !s.ok()) {
    spdlog::warn("job {}: step {} not stored: {}", job.summary.job_id(), r.step(), s.ToString());
  }
  CountStep(job, r);
}

void Controller::CountStep(Job& job, const v1::StepRecord& r) {
  job.has_step = true;
  job.last_step = r;
  job.tokens_total += r.tokens();
  // The Prometheus series are by action and by collective (over all groups).
  for (const auto& a : r.planner()) {
    job.planner_total[v1::PlannerActionLabel(a.action())] += static_cast<double>(a.bytes());
  }
  for (const auto& c : r.comm()) {
    job.comm_total[v1::CollectiveOpLabel(c.op())] += static_cast<double>(c.bytes());
  }
  if (r.checkpoint_seconds() > 0) job.last_checkpoint_s = r.checkpoint_seconds();
}

absl::StatusOr<v1::JobSeries> Controller::GetJobSeries(const v1::GetJobSeriesRequest& req) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!jobs_.count(req.job_id())) {
    return absl::NotFoundError(absl::StrCat("no job '", req.job_id(), "'"));
  }
  // Only the new steps are read: the dashboard polls with since_step every few seconds.
  ASSIGN_OR_RETURN(auto steps, store_->LoadSteps(req.job_id(), req.since_step()));
  v1::JobSeries series;
  series.set_job_id(req.job_id());
  series.set_telemetry_dropped(telemetry_dropped_);
  const size_t n = steps.size();
  const size_t max = req.max_points() == 0 ? n : req.max_points();
  for (size_t i = 0; i < std::min(n, max); ++i) {
    // Evenly spaced, always including the newest.
    const size_t idx = n <= max ? i : (max == 1 ? n - 1 : i * (n - 1) / (max - 1));
    *series.add_steps() = steps[idx];
  }
  return series;
}

MetricsSnapshot Controller::Metrics() {
  std::lock_guard<std::mutex> lock(mu_);
  MetricsSnapshot snap;
  snap.unix_time = clock_.UnixSeconds();
  snap.telemetry_dropped_total = telemetry_dropped_;
  snap.telemetry_records_total = telemetry_records_;
  for (const auto& st : {kReady, kBusy, kLost}) snap.workers_by_state[st] = 0;
  for (const auto& [id, w] : workers_) ++snap.workers_by_state[w.info.state()];
  for (const auto& [id, job] : jobs_) {
    JobMetrics m;
    m.job_id = id;
    m.name = job.summary.name();
    m.kind = job.summary.kind();
    m.state = job.summary.state();
    m.attempt = job.summary.attempt();
    m.step = job.summary.step();
    m.total_steps = job.summary.total_steps();
    m.has_step = job.has_step;
    m.last = job.last_step;
    m.tokens_total = job.tokens_total;
    m.planner_bytes_total = job.planner_total;
    m.comm_bytes_total = job.comm_total;
    m.last_checkpoint_seconds = job.last_checkpoint_s;
    for (size_t i = 0; i < job.attempts.size(); ++i) {
      const auto& a = job.attempts[i];
      if (a.state() == "failed") ++m.restarts_by_cause[a.failure_kind().empty() ? "exit" : a.failure_kind()];
      if (i > 0 && a.all_running_unix() > 0 && job.attempts[i - 1].ended_unix() > 0) {
        m.last_recovery_seconds = a.all_running_unix() - job.attempts[i - 1].ended_unix();
      }
    }
    snap.jobs.push_back(std::move(m));
  }
  return snap;
}

absl::Status Controller::PushLogs(const v1::LogBatch& batch) {
  std::lock_guard<std::mutex> lock(mu_);
  if (auto wt = workers_.find(batch.worker_id()); wt != workers_.end()) {
    wt->second.last_seen_mono = clock_.MonotonicSeconds();
  }
  std::map<std::string, std::string> by_job;
  for (const auto& line : batch.lines()) {
    if (!jobs_.count(line.job_id())) continue;
    std::string text = line.text();
    std::replace(text.begin(), text.end(), '\n', ' ');
    absl::StrAppend(&by_job[line.job_id()], line.attempt(), " ", line.rank(), " ", text, "\n");
  }
  for (const auto& [job_id, text] : by_job) {
    std::ofstream out(LogPath(job_id), std::ios::app);
    out << text;
    if (!out) return absl::InternalError(absl::StrCat("cannot append to ", LogPath(job_id)));
  }
  return absl::OkStatus();
}

absl::Status Controller::CheckScope(const v1::KvScope& scope) {
  auto jt = jobs_.find(scope.job_id());
  if (jt == jobs_.end()) {
    return absl::FailedPreconditionError(absl::StrCat("rendezvous: no job '", scope.job_id(), "'"));
  }
  const Job& job = jt->second;
  if (IsFinal(job.summary.state()) || job.summary.attempt() != scope.attempt() ||
      job.attempts.empty() || job.attempts.back().state() != "running") {
    return absl::FailedPreconditionError(absl::StrFormat(
        "rendezvous: attempt %d of job %s is over (job is %s at attempt %d)", scope.attempt(),
        scope.job_id(), StateName(job.summary.state()), job.summary.attempt()));
  }
  return absl::OkStatus();
}

absl::Status Controller::KvSet(const v1::KvSetRequest& req) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    RETURN_IF_ERROR(CheckScope(req.scope()));
    RETURN_IF_ERROR(store_->KvPut(req.scope().job_id(), req.scope().attempt(), req.key(),
                                  req.value()));
  }
  rendezvous_.Set({req.scope().job_id(), req.scope().attempt()}, req.key(), req.value());
  return absl::OkStatus();
}

absl::StatusOr<v1::KvGetResponse> Controller::KvGet(const v1::KvGetRequest& req) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    RETURN_IF_ERROR(CheckScope(req.scope()));
  }
  std::vector<std::string> keys(req.keys().begin(), req.keys().end());
  ASSIGN_OR_RETURN(auto values, rendezvous_.Wait({req.scope().job_id(), req.scope().attempt()},
                                                 keys, std::min(req.timeout_s(), 60.0)));
  v1::KvGetResponse resp;
  for (auto& v : values) resp.add_values(std::move(v));
  return resp;
}

absl::Status Controller::RecordLocalWorker(uint32_t slot, int pid) {
  std::lock_guard<std::mutex> lock(mu_);
  return store_->PutLocalWorker(slot, pid);
}

std::vector<std::pair<uint32_t, int>> Controller::LocalWorkers() {
  std::lock_guard<std::mutex> lock(mu_);
  auto local = store_->LoadLocalWorkers();
  return local.ok() ? *local : std::vector<std::pair<uint32_t, int>>();
}

}  // namespace furnace::controller
