// Controller: the job-level coordinator. It owns the jobs and the workers, places ranks (gang, all
// or nothing), detects failures (a rank's exit, an agent's silence, ranks that never start) and
// recovers (stop the attempt's ranks, open the next attempt with a new rendezvous scope, place
// again after a backoff, up to recovery.max_restarts; then FAILED with the cause in words).
//
// Durability: every state transition is written to the JobStore (one transaction) before it takes
// effect, i.e. before any command reaches a worker. A controller started on the same state dir
// reloads every job with its attempts and events; agents that are still running re-register with
// the ranks they run, and those ranks are re-attached.
//
// Threading: the gRPC adapters call the public methods from their threads; a ticker thread calls
// Tick(). One mutex guards all state (the state is small; clarity beats lock granularity here).
// Only NextCommands and KvGet block, and neither holds the mutex while it waits.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "controller/service/metrics_snapshot.h"
#include "controller/service/rendezvous.h"
#include "controller/store/job_store.h"
#include "furnace/v1/agent.pb.h"
#include "furnace/v1/controller.pb.h"
#include "runtime/base/clock.h"

namespace furnace::controller {

struct ControllerOptions {
  std::string state_dir;
  std::string advertise_address;     // what ranks dial for rendezvous
  double heartbeat_interval_s = 1.0;  // told to agents
  double worker_timeout_s = 10.0;     // an agent silent this long is lost
  // After a controller (re)start, agents known from the store get this long to register again
  // before their silence counts: the controller's own absence is not the workers' fault, and
  // their ranks kept running. A job's shorter recovery.heartbeat_timeout_s applies only after.
  double reattach_grace_s = 30.0;
  uint32_t local_workers = 0;         // capacity the embedded launcher will provide
  double stop_grace_s = 5.0;          // SIGTERM -> SIGKILL grace for ranks we stop
};

class Controller {
 public:
  static absl::StatusOr<std::unique_ptr<Controller>> Create(const ControllerOptions& options,
                                                            const Clock& clock = RealClock());

  // --- JobService -------------------------------------------------------------------------
  // Validates the YAML (errors name file, line, field, value and what is allowed); a refused job
  // leaves no trace.
  absl::StatusOr<std::string> Submit(const std::string& yaml, const std::string& filename);
  std::vector<furnace::v1::JobSummary> ListJobs();
  absl::StatusOr<furnace::v1::JobDetail> GetJob(const std::string& job_id);
  absl::StatusOr<furnace::v1::JobSummary> Cancel(const std::string& job_id);
  std::vector<furnace::v1::WorkerInfo> ListWorkers();
  absl::StatusOr<furnace::v1::GetLogsResponse> GetLogs(const furnace::v1::GetLogsRequest& req);
  // The job's aggregated training steps, ascending; thinned evenly to max_points when set.
  absl::StatusOr<furnace::v1::JobSeries> GetJobSeries(const furnace::v1::GetJobSeriesRequest& req);
  // Everything monitoring shows, at this instant.
  MetricsSnapshot Metrics();

  // --- AgentService -----------------------------------------------------------------------
  absl::StatusOr<furnace::v1::RegisterResponse> Register(const furnace::v1::RegisterRequest& req);
  furnace::v1::HeartbeatResponse Heartbeat(const furnace::v1::HeartbeatRequest& req);
  // Waits up to wait_s for commands for this worker session. FailedPrecondition when the session
  // is not the worker's current one (the agent must register again).
  absl::StatusOr<std::vector<furnace::v1::AgentCommand>> NextCommands(
      const std::string& worker_id, const std::string& session_id, double wait_s);
  // Puts back commands that could not be delivered (front of the queue, same order).
  void Requeue(const std::string& worker_id, std::vector<furnace::v1::AgentCommand> commands);
  absl::Status ReportRank(const furnace::v1::RankReport& report);
  absl::Status PushTelemetry(const furnace::v1::TelemetryBatch& batch);
  absl::Status PushLogs(const furnace::v1::LogBatch& batch);
  absl::Status KvSet(const furnace::v1::KvSetRequest& req);
  absl::StatusOr<furnace::v1::KvGetResponse> KvGet(const furnace::v1::KvGetRequest& req);

  // --- Embedded launcher bookkeeping --------------------------------------------------------
  absl::Status RecordLocalWorker(uint32_t slot, int pid);
  std::vector<std::pair<uint32_t, int>> LocalWorkers();

  // Failure detection, placement, recovery. Called every ~100 ms by the daemon.
  void Tick();

  // Graceful shutdown. With stopping_workers (the embedded launcher is about to stop its
  // workers), the running attempts are recorded as interrupted, not failed, so the job resumes
  // after the restart without spending its restart budget; reports arriving afterwards (the
  // ranks being stopped) are ignored. Without it, state is left as is and the running agents
  // re-attach to the restarted controller.
  void Shutdown(bool stopping_workers);

 private:
  struct Job {
    furnace::v1::JobSummary summary;
    furnace::v1::JobSpec spec;
    std::vector<furnace::v1::AttemptInfo> attempts;  // index = attempt - 1
    double attempt_started_mono = 0;
    double recover_at_mono = 0;
    std::set<std::string> avoid_workers;  // workers implicated in the last failure
    std::string waiting_reason;           // last "cannot place" message logged
    // A rank that exits with an error code is often a victim (its peer died and the collective
    // failed), so such a failure waits kSettleS for a root cause (a signal, a hang, an OOM, a
    // lost worker) before the attempt fails with the best cause seen.
    double settle_deadline = 0;           // 0: no failure pending
    std::string pending_cause, pending_worker;
    // Training steps: per-rank records of a step are combined into one StepRecord once every
    // rank of the attempt has reported it.
    struct PendingStep {
      furnace::v1::StepRecord record;
      uint32_t ranks = 0;
      double loss_sum = 0, aux_sum = 0, mfu_sum = 0, grad_norm_sum = 0;
      uint32_t loss_n = 0;
      std::vector<std::vector<double>> expert_tokens;  // [layer][expert], summed
      std::map<int, uint64_t> planner;                 // v1::PlannerAction -> bytes, summed
      // (v1::CollectiveOp, v1::ParallelGroup) -> bytes, seconds and calls summed over ranks.
      std::map<std::pair<int, int>, furnace::v1::CommTelemetry> comm;
    };
    std::map<std::pair<uint32_t, uint64_t>, PendingStep> pending_steps;
    bool has_step = false;
    furnace::v1::StepRecord last_step;
    double tokens_total = 0;
    // Counters by Prometheus label (v1::PlannerActionLabel, v1::CollectiveOpLabel).
    std::map<std::string, double> planner_total, comm_total;
    double last_checkpoint_s = -1;
    uint64_t records_since_trim = 0;
    furnace::v1::AttemptInfo* current() {
      return attempts.empty() ? nullptr : &attempts.back();
    }
  };
  struct Worker {
    furnace::v1::WorkerInfo info;
    std::string session_id;  // empty until it registers with this controller run (or when lost)
    double last_seen_mono = 0;
    bool has_rank = false;
    uint32_t attempt = 0;
    std::deque<furnace::v1::AgentCommand> commands;
  };

  Controller(const ControllerOptions& options, const Clock& clock, std::unique_ptr<JobStore> store);
  absl::Status Load();

  // All below require mu_.
  absl::Status Transition(Job& job, furnace::v1::JobState to, const std::string& event_kind,
                          const std::string& message);
  absl::Status Persist(Job& job);
  void Event(Job& job, const std::string& kind, const std::string& message);
  void TryStart(Job& job);
  // Ends the current attempt: persisted first, then its ranks are told to stop. A retryable
  // failure counts against recovery.max_restarts; a permanent one (the job's input is invalid:
  // retrying cannot help) ends the job FAILED at once; an interruption (the controller itself
  // stopping the workers) restarts without counting.
  enum class Failure { kRetryable, kPermanent, kInterrupted };
  // `kind` labels the cause (AttemptInfo.failure_kind): signal, hang, oom, exit, lost, ...
  void FailAttempt(Job& job, const std::string& kind, const std::string& cause,
                   const std::string& culprit_worker, Failure failure = Failure::kRetryable);
  void StopAttemptRanks(Job& job, const std::string& reason);
  // Records an error exit of a rank of the current attempt; fails the attempt at once when every
  // rank has ended, otherwise after the settle window (Tick).
  void NoteWeakFailure(Job& job, const std::string& cause, const std::string& worker);
  furnace::v1::AgentCommand StartCommand(const Job& job, uint32_t rank, const Worker& worker) const;
  void MarkLost(Worker& worker, const std::string& why);
  void FreeWorker(const std::string& worker_id, const std::string& job_id, uint32_t attempt,
                  uint32_t rank);
  void Enqueue(Worker& worker, furnace::v1::AgentCommand command);
  void CloseScope(Job& job, uint32_t attempt);
  absl::Status CheckScope(const furnace::v1::KvScope& scope);
  uint32_t Capacity(const std::string& device_kind) const;
  std::string LogPath(const std::string& job_id) const;
  void PersistWorker(const Worker& worker);
  void AccumulateStep(Job& job, const furnace::v1::TelemetryRecord& record);
  void FinishStep(Job& job, Job::PendingStep& pending);
  void CountStep(Job& job, const furnace::v1::StepRecord& step);

  const ControllerOptions options_;
  const Clock& clock_;
  std::unique_ptr<JobStore> store_;
  Rendezvous rendezvous_;

  std::mutex mu_;
  std::condition_variable commands_cv_;
  std::map<std::string, Job> jobs_;
  std::map<std::string, Worker> workers_;
  std::string instance_id_;  // distinguishes sessions across controller restarts
  bool shut_down_ = false;   // Shutdown(true) ran: rank reports are no longer acted on
  uint64_t telemetry_dropped_ = 0;   // records agents reported dropping
  uint64_t telemetry_records_ = 0;   // records received
  uint64_t session_counter_ = 0;
};

}  // namespace furnace::controller
