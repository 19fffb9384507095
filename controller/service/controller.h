// Controller: the job-level coordinator, as the gRPC adapters (grpc_services.cc) and the daemon
// (main.cc) see it. A thin facade over its parts, each with one job:
//   JobLifecycle (job_lifecycle.h)  jobs, attempts, placement, failure detection and recovery
//   WorkerRegistry (worker_registry.h)  workers, sessions, heartbeats, command queues
//   TelemetryAggregator (telemetry_aggregator.h)  per-rank records -> steps, totals
//   LogStore (log_store.h)  the rank logs
//   Rendezvous (rendezvous.h)  the ranks' key-value store, scoped by (job, attempt)
// It owns them, the JobStore and the state mutex, and decides what runs under that mutex.
//
// Durability: every state transition is written to the JobStore (one transaction) before it takes
// effect, i.e. before any command reaches a worker. Records that are not transitions (rank steps,
// one more rank started or ended, worker records) are written behind, within about a second
// (JobLifecycle::PersistLater, WorkerRegistry::Flush). A controller started on the same state dir
// reloads every job with its attempts and events; agents that are still running re-register with
// the ranks they run, and those ranks are re-attached.
//
// Threading: the gRPC adapters call the public methods from their threads; a ticker thread calls
// Tick(). One state mutex guards the jobs and the workers' records (they change together). No
// file or bulk database I/O happens under it: log appends and reads, telemetry inserts, rendezvous
// key writes, and the reads of GetJob, GetJobSeries and LocalWorkers run outside it (the JobStore
// and LogStore serialise themselves); the transition writes stay under it (see job_lifecycle.h).
// Heartbeats do not need it (TryHeartbeat). Nothing that waits holds a thread: KvGet and KvSet
// answer through a callback (from the rendezvous or the group commit's thread), telemetry is
// written behind, and a command stream leaves a wake-up (TakeCommands); none of them holds the
// state mutex while it waits.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "controller/service/job_lifecycle.h"
#include "controller/service/log_store.h"
#include "controller/service/metrics_snapshot.h"
#include "controller/service/rate_limiter.h"
#include "controller/service/rendezvous.h"
#include "controller/service/telemetry_aggregator.h"
#include "controller/service/worker_registry.h"
#include "controller/store/group_commit.h"
#include "controller/store/job_store.h"
#include "controller/store/state_dir_lock.h"
#include "furnace/v1/agent.pb.h"
#include "furnace/v1/controller.pb.h"
#include "runtime/base/clock.h"

namespace furnace::controller {

// The most steps one page of GetJobSeries holds (GetJobSeriesRequest.page_size).
inline constexpr uint32_t kMaxSeriesPageSize = 100000;

class Controller {
 public:
  static absl::StatusOr<std::unique_ptr<Controller>> Create(const ControllerOptions& options,
                                                            const Clock& clock = RealClock());

  // --- JobService -------------------------------------------------------------------------
  // Validates the YAML (errors name file, line, field, value and what is allowed); a refused job
  // leaves no trace.
  // Paths the job names are resolved under options.data_root / checkpoint_root (when set) and
  // stored resolved; one that escapes is refused naming the field and the root.
  // `defaults` (when given): what the controller filled in that the file left out
  // (SubmitJobResponse.defaults).
  absl::StatusOr<std::string> Submit(const std::string& yaml, const std::string& filename,
                                     std::vector<std::string>* defaults = nullptr);
  // Submit and Cancel as `identity` calls them through the JobService: submission is rate limited
  // per identity (ResourceExhausted saying when to retry), and each call, accepted or refused, is
  // written to the audit log. SubmitAs keeps only the printable base name of `filename` (at most
  // kMaxJobFileNameBytes; "<job>" when none: runtime/base/log_text.h), which the job's records,
  // the log and the refusals then name.
  static constexpr size_t kMaxJobFileNameBytes = 255;
  absl::StatusOr<std::string> SubmitAs(const std::string& identity, const std::string& yaml,
                                       const std::string& filename,
                                       std::vector<std::string>* defaults = nullptr);
  // SubmitAs's dry run (JobService.CheckJob): the same parsing, path confinement, rate limit
  // and checks (JobLifecycle::CheckSubmit), storing nothing and auditing nothing (nothing
  // changed). The answer has no job id; its spec is the job as Submit would store it.
  absl::StatusOr<furnace::v1::SubmitJobResponse> CheckSubmitAs(const std::string& identity,
                                                               const std::string& yaml,
                                                               const std::string& filename);
  absl::StatusOr<furnace::v1::JobSummary> CancelAs(const std::string& identity,
                                                   const std::string& job_id);
  // A state-changing call the transport's authentication refused before it reached the job API
  // (AuthRefusals: no token, an unknown token, a read token's submit or cancel), written to the
  // audit log as refused, with no job, at the time it was refused.
  void AuditRefused(double unix_time, const std::string& identity, const std::string& action,
                    const absl::Status& outcome);
  // The audit log, newest req.limit() (default 100, at most 10000) entries, oldest first.
  absl::StatusOr<furnace::v1::ListAuditEventsResponse> ListAuditEvents(
      const furnace::v1::ListAuditEventsRequest& req);
  std::vector<furnace::v1::JobSummary> ListJobs();
  // ListJobs for a page that polls it: every job that has not ended and the newest `ended` of
  // those that have (by submission); the rest are counted in `omitted`.
  furnace::v1::ListJobsResponse RecentJobs(size_t ended);
  absl::StatusOr<furnace::v1::JobDetail> GetJob(const std::string& job_id);
  absl::StatusOr<furnace::v1::JobSummary> Cancel(const std::string& job_id);
  std::vector<furnace::v1::WorkerInfo> ListWorkers();
  // A page of the job's rank output. NotFound: no such job, or a rank or attempt it does not have
  // (an attempt not started yet), the message saying which it has.
  absl::StatusOr<furnace::v1::GetLogsResponse> GetLogs(const furnace::v1::GetLogsRequest& req);
  // The job's aggregated training steps, ascending; thinned evenly to max_points when set; a page
  // of them after a cursor with page_size (at most kMaxSeriesPageSize; InvalidArgument beside
  // since_step or max_points). Neither, and more than kMaxSeriesPageSize steps: ResourceExhausted.
  absl::StatusOr<furnace::v1::JobSeries> GetJobSeries(const furnace::v1::GetJobSeriesRequest& req);
  // Everything monitoring shows, at this instant.
  MetricsSnapshot Metrics();

  // --- AgentService -----------------------------------------------------------------------
  absl::StatusOr<furnace::v1::RegisterResponse> Register(const furnace::v1::RegisterRequest& req);
  // A heartbeat with the controller's view of the worker's ranks (reconcile set), which needs the
  // state mutex: waits for it.
  furnace::v1::HeartbeatResponse Heartbeat(const furnace::v1::HeartbeatRequest& req);
  // A heartbeat that never waits for the state mutex: the beat is recorded at once (liveness is
  // lock-free), and the rank view comes with the answer when the mutex is free. When it is busy
  // (a job's start or end holds it for thousands of reports) the answer has none, reconcile unset,
  // and the agent reconciles at a later beat: a storm of transitions delays reconciliation, never
  // liveness (bench/controlplane/REPORT.md). What gRPC's heartbeat handler calls.
  furnace::v1::HeartbeatResponse TryHeartbeat(const furnace::v1::HeartbeatRequest& req);
  // Waits up to wait_s for commands for this worker session. FailedPrecondition when the session
  // is not the worker's current one (the agent must register again).
  absl::StatusOr<std::vector<furnace::v1::AgentCommand>> NextCommands(const std::string& worker_id,
                                                                      const std::string& session_id,
                                                                      double wait_s);
  // The same without waiting: none, and `wake` is called when there may be some (see
  // WorkerRegistry::TakeCommands). For the callback command stream (grpc_services.cc).
  absl::StatusOr<std::vector<furnace::v1::AgentCommand>> TakeCommands(const std::string& worker_id,
                                                                      const std::string& session_id,
                                                                      WorkerRegistry::Wake wake);
  // Puts back commands that could not be delivered (front of the queue, same order).
  void Requeue(const std::string& worker_id, const std::string& session_id,
               std::vector<furnace::v1::AgentCommand> commands);
  // The agent server's: `done` gets the answer, at once or, for a rank's successful exit that
  // leaves others running, once the exit is written (JobLifecycle::ReportRank).
  void ReportRank(const furnace::v1::RankReport& report, std::function<void(absl::Status)> done);
  // The same, answered at once (tests, tools): a written-behind exit answers OK now (its answer
  // once written is OK too); its worker is still freed only when the write lands.
  absl::Status ReportRank(const furnace::v1::RankReport& report);
  // Takes a batch in (progress, step aggregates, totals) and calls `done` at once, on this thread:
  // the raw records and completed steps are written behind (group commit), as the rank steps are,
  // so an agent's telemetry never waits for the disk. A failed write is logged; what it loses is
  // the sample of raw records (and a point of the dashboards' series) of at most one commit, as
  // an agent under back-pressure drops records (TelemetryBatch.dropped). The blocking form
  // returns once they are written, with the write's status (tests). `ack` (when given) says how
  // far the steps of the jobs the batch names are stored (TelemetryAggregator::Settled): the
  // agent holds its step records until then, and pushes them again to a controller it registers
  // with anew, so a controller killed while it merged a step loses none of it.
  using Done = std::function<void(absl::Status)>;
  void PushTelemetry(const furnace::v1::TelemetryBatch& batch, Done done,
                     furnace::v1::TelemetryAck* ack = nullptr);
  absl::Status PushTelemetry(const furnace::v1::TelemetryBatch& batch,
                             furnace::v1::TelemetryAck* ack = nullptr);
  absl::Status PushLogs(const furnace::v1::LogBatch& batch);
  // Persists the key (group commit), then makes it visible; `done` as for PushTelemetry.
  // `caller`: the worker the call comes from (CallerWorker; empty: it names none), refused unless
  // it holds a rank of the scope's attempt (Rendezvous::CheckCaller).
  void KvSet(const furnace::v1::KvSetRequest& req, Done done, const std::string& caller = "");
  absl::Status KvSet(const furnace::v1::KvSetRequest& req);
  // A rendezvous wait (rendezvous.h): the keys' values, or with req.indexed_count() an indexed
  // wait's arrivals. `done` is called once, from the thread that completes the wait.
  using KvGetDone = std::function<void(absl::StatusOr<furnace::v1::KvGetResponse>)>;
  void KvGet(const furnace::v1::KvGetRequest& req, KvGetDone done, const std::string& caller = "");

  // --- Embedded launcher bookkeeping --------------------------------------------------------
  absl::Status RecordLocalWorker(uint32_t slot, int pid);
  std::vector<std::pair<uint32_t, int>> LocalWorkers();

  // Failure detection, placement, recovery. Called every ~100 ms by the daemon.
  void Tick();

  // Graceful shutdown. With stopping_workers (the embedded launcher is about to stop its
  // workers: those RecordLocalWorker recorded), the attempts with a rank on one of them are
  // recorded as interrupted, not failed, so the job resumes after the restart without spending
  // its restart budget; reports arriving afterwards (the ranks being stopped) are ignored. Jobs
  // whose ranks all run on other agents, and every job without it, are left as they are: their
  // agents keep them running and re-attach to the restarted controller.
  // Every rendezvous wait in progress ends with Unavailable (ranks retry against the controller
  // that comes next), as does every later one.
  void Shutdown(bool stopping_workers);
  // The last write, once the agent server has stopped taking calls: what came in after
  // Shutdown's flush and was written behind (a rank's progress, a start report of an attempt
  // that is over, a worker's heartbeat) is written too; nothing flushes after it.
  void FlushRecords();

  // Jobs ended over --forget-ended-jobs ago are deleted (store, memory, log), at most
  // kForgetPerPass every kForgetIntervalS (Tick).
  static constexpr double kForgetIntervalS = 60.0;
  static constexpr size_t kForgetPerPass = 500;

  // Runs the writes still queued behind (events, an ended attempt's keys dropped) while the
  // JobLifecycle they belong to is still there; the members are destroyed after.
  ~Controller();

 private:
  // SubmitAs's and CheckSubmitAs's: the printable base name of the caller's file name ("<job>"
  // when none), which is all the controller keeps of it.
  static std::string SubmittedFileName(const std::string& filename);
  // Submit's and CheckSubmitAs's: the file parsed, its paths resolved under the roots.
  absl::StatusOr<furnace::v1::JobSpec> ParseSubmitted(const std::string& yaml,
                                                      const std::string& filename) const;
  Controller(const ControllerOptions& options, const Clock& clock, StateDirLock lock,
             std::unique_ptr<JobStore> store);
  absl::Status Load();
  // The ranks this worker holds in our records, for the agent to reconcile (HeartbeatResponse).
  // Caller holds mu_.
  // Heartbeat (wait: for the state mutex) and TryHeartbeat (not).
  furnace::v1::HeartbeatResponse Beat(const furnace::v1::HeartbeatRequest& req, bool wait);
  void FillRankView(const Worker& w, furnace::v1::HeartbeatResponse& resp);
  // The telemetry flush interval agents are told (ControllerOptions::telemetry_flush_s).
  double TelemetryFlushS() const;
  // PushTelemetry's work; `written` gets the status of its raw records' write.
  void AcceptTelemetry(const furnace::v1::TelemetryBatch& batch, furnace::v1::TelemetryAck* ack,
                       Done written);
  // Writes one audit entry; a store failure is logged, not returned (the call it records has
  // already happened).
  void Audit(const std::string& identity, const std::string& action, const std::string& job_id,
             const absl::Status& outcome, const std::string& detail,
             std::optional<double> unix_time = std::nullopt);

  const ControllerOptions options_;
  const Clock& clock_;
  // Held until after the store is closed (members go in reverse order).
  const StateDirLock state_lock_;
  const std::unique_ptr<JobStore> store_;
  Rendezvous rendezvous_;
  // The rendezvous keys' writes, and the records JobLifecycle writes behind (events, an ended
  // attempt's keys dropped), in one order (thread-safe). After rendezvous_: destroyed first, its
  // last commits still make their keys visible.
  GroupCommit kv_commit_{*store_};
  RateLimiter submit_limiter_;
  LogStore logs_;
  WorkerRegistry workers_;         // records guarded by mu_; queues by itself
  TelemetryAggregator telemetry_;  // guarded by mu_
  std::mutex mu_;                  // the state mutex
  JobLifecycle jobs_;              // guarded by mu_
  static constexpr double kJobFlushIntervalS = 1.0;
  // How long after an attempt ended its ranks' last telemetry batches may still come (agents push
  // every telemetry_flush_s): its steps still waiting for ranks are stored after this (Tick).
  // Counted from this controller's start as well (started_unix_, once Load is done): the agents
  // push the step records they hold again once they have registered with it, and until then a
  // job's steps may wait for more ranks than usual
  // (TelemetryAggregator::kMaxPendingStepsAfterStart).
  static constexpr double kEndedSettleS = 10.0;
  double started_unix_ = 0;  // set by Create after Load (before any call)
  // The job's attempts that have ended (those numbered below the first: 1 when none has) and when
  // the newest of them ended, as the settle window counts it: not before this controller started
  // (guarded by mu_).
  std::pair<uint32_t, double> EndedAttempts(const Job& job) const;
  static constexpr uint64_t kAuditTrimEvery = 100;
  std::atomic<uint64_t> audits_since_trim_{0};
  double last_job_flush_mono_ = 0;  // guarded by mu_
  // Deletes the jobs ended over options_.forget_ended_s ago (Tick; `lock` holds mu_, released
  // during the store's deletes).
  void ForgetEndedJobs(std::unique_lock<std::mutex>& lock);
  double last_forget_mono_ = -1e300;  // guarded by mu_
};

}  // namespace furnace::controller
