// JobStore: the controller's durable state in one SQLite file (WAL, synchronous=FULL, so a
// committed write survives a crash of the controller or the machine).
//
// What it owns: the database connection. Records are the protobuf messages of the JobService
// (JobSummary, JobSpec, AttemptInfo, JobEvent, WorkerInfo) stored as blobs next to the columns
// used for lookups, so what `furnace status` shows after a controller restart is exactly what was
// written before it.
//
// Thread-safety: every method may be called from any thread. One (recursive) mutex serialises the
// calls on the connection, so a Transaction's body runs alone and may call the other methods; the
// controller therefore reads and writes bulk data (telemetry, steps, events) without holding its
// own state lock. The long reads (a job's step series: LoadSteps, ForEachStep) go through a
// second, read-only connection, which reads a snapshot while the first one commits (WAL), so a
// dashboard or `furnace report` reading a long history never holds up job transitions or the
// telemetry's commits.
// Errors: Internal with SQLite's message; NotFound for missing rows where stated.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "furnace/v1/agent.pb.h"
#include "furnace/v1/controller.pb.h"
#include "furnace/v1/telemetry.pb.h"

struct sqlite3;

namespace furnace::controller {

struct StoredJob {
  furnace::v1::JobSummary summary;
  furnace::v1::JobSpec spec;
  std::vector<furnace::v1::AttemptInfo> attempts;  // ascending attempt number
};

// A place in a job's step series: (attempt, step), ordered by attempt, then step.
struct StepCursor {
  uint32_t attempt = 0;
  uint64_t step = 0;
};

class JobStore {
 public:
  // Opens (creating if needed) the database at `path`; ":memory:" for tests.
  static absl::StatusOr<std::unique_ptr<JobStore>> Open(const std::string& path);
  ~JobStore();
  JobStore(const JobStore&) = delete;
  JobStore& operator=(const JobStore&) = delete;

  // Runs `body` in one transaction: all its writes land, or none.
  absl::Status Transaction(const std::function<absl::Status()>& body);

  // Jobs.
  absl::StatusOr<uint64_t> NextJobSeq();
  absl::Status PutJob(const furnace::v1::JobSummary& summary, const furnace::v1::JobSpec& spec);
  absl::Status PutSummary(const furnace::v1::JobSummary& summary);
  absl::Status PutAttempt(const std::string& job_id, const furnace::v1::AttemptInfo& attempt);
  absl::StatusOr<std::vector<StoredJob>> LoadJobs();

  absl::Status AddEvent(const std::string& job_id, const furnace::v1::JobEvent& event);
  // The newest `limit` events of a job, oldest first.
  absl::StatusOr<std::vector<furnace::v1::JobEvent>> LoadEvents(const std::string& job_id,
                                                                int limit);

  // The audit log: every state-changing JobService call, accepted or refused (who, when, what,
  // the job, the outcome). Ids increase in recording order; TrimAudit keeps the newest.
  absl::Status AddAudit(const furnace::v1::AuditEvent& event);
  // Deletes all but the newest `keep` entries.
  absl::Status TrimAudit(uint64_t keep);
  // The newest `limit` entries (of `job_id`; empty: of every job), oldest first, with their ids.
  absl::StatusOr<std::vector<furnace::v1::AuditEvent>> LoadAudit(const std::string& job_id,
                                                                 int limit);

  // Workers.
  absl::Status PutWorker(const furnace::v1::WorkerInfo& worker);
  absl::Status DeleteWorker(const std::string& worker_id);  // OK when there is no such row

  // Deletes everything stored of these jobs (the job, its attempts, events, rendezvous keys,
  // telemetry, steps and commcheck results; the audit log keeps its entries) in one transaction.
  absl::Status DeleteJobs(const std::vector<std::string>& job_ids);
  absl::StatusOr<std::vector<furnace::v1::WorkerInfo>> LoadWorkers();

  // Local workers spawned by the embedded launcher: slot -> pid.
  absl::Status PutLocalWorker(uint32_t slot, int pid);
  absl::StatusOr<std::vector<std::pair<uint32_t, int>>> LoadLocalWorkers();

  // Rendezvous key-value pairs, scoped by (job, attempt).
  absl::Status KvPut(const std::string& job_id, uint32_t attempt, const std::string& key,
                     const std::string& value);
  absl::StatusOr<std::vector<std::pair<std::string, std::string>>> KvLoad(const std::string& job_id,
                                                                          uint32_t attempt);
  absl::Status KvDropScope(const std::string& job_id, uint32_t attempt);

  // Telemetry: raw records, and the latest commcheck result per (collective, bytes).
  absl::Status AddTelemetry(const std::vector<furnace::v1::TelemetryRecord>& records);
  absl::Status PutCommResult(const std::string& job_id, const furnace::v1::CommResult& result);
  absl::StatusOr<std::vector<furnace::v1::CommResult>> LoadCommResults(const std::string& job_id);
  // Job-level step aggregates (what dashboards and `furnace report` plot), kept for the whole job.
  absl::Status PutStep(const std::string& job_id, const furnace::v1::StepRecord& step);
  // Steps with step > since_step (of any attempt), ascending by (attempt, step). With max_points
  // > 0 and more steps than that, max_points of them evenly spaced, the first and the newest
  // included: only their records are read (the keys come from the primary key's index), so a
  // dashboard asking for 2000 points of a job of a million steps reads 2000 records.
  // More than max_steps (when > 0) to return, unthinned (max_points 0, or at least as many points
  // as steps), is ResourceExhausted: a reply of every step of a long job passes what a client
  // accepts in one message.
  // With `after`, the steps after that cursor in (attempt, step) order instead (since_step
  // ignored): a later attempt's steps even where they redo earlier step numbers, an earlier
  // attempt's not.
  absl::StatusOr<std::vector<furnace::v1::StepRecord>> LoadSteps(const std::string& job_id,
                                                                 uint64_t since_step = 0,
                                                                 uint32_t max_points = 0,
                                                                 uint32_t max_steps = 0,
                                                                 const StepCursor* after = nullptr);
  // At most `limit` steps after (after_attempt, after_step), ascending by (attempt, step); *more
  // says whether steps follow the last one.
  absl::StatusOr<std::vector<furnace::v1::StepRecord>> LoadStepPage(const std::string& job_id,
                                                                    uint32_t after_attempt,
                                                                    uint64_t after_step,
                                                                    uint32_t limit, bool* more);
  // Calls fn on every step of a job in (attempt, step) order, one record in memory at a time.
  absl::Status ForEachStep(const std::string& job_id,
                           const std::function<void(const furnace::v1::StepRecord&)>& fn);
  // Retention of raw per-rank records: keeps the newest `keep` of a job.
  absl::Status TrimTelemetry(const std::string& job_id, int keep);

  // The newest record of a rank that carries step telemetry (else the newest record; empty when
  // none).
  absl::StatusOr<std::optional<furnace::v1::TelemetryRecord>> LatestRecord(
      const std::string& job_id, uint32_t rank);

 private:
  explicit JobStore(sqlite3* db) : db_(db) {}
  absl::Status Exec(const std::string& sql);
  // Runs `reads` on the read-only connection, in one read transaction (a snapshot); on the
  // writer's connection, under its mutex, for an in-memory store (a second connection would open
  // another, empty database).
  absl::Status Read(const std::function<absl::Status(sqlite3*)>& reads);

  std::recursive_mutex mu_;  // guards every use of db_
  sqlite3* db_;
  std::mutex read_mu_;  // guards every use of read_db_
  sqlite3* read_db_ = nullptr;
};

}  // namespace furnace::controller
