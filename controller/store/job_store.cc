#include "controller/store/job_store.h"

#include <sqlite3.h>

#include "absl/strings/str_cat.h"
#include "controller/store/sqlite_statement.h"
#include "runtime/base/status.h"

namespace furnace::controller {
namespace {

constexpr const char* kSchema = R"sql(
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL);
INSERT OR IGNORE INTO meta VALUES ('job_seq', 0);
CREATE TABLE IF NOT EXISTS jobs (
  id TEXT PRIMARY KEY, seq INTEGER NOT NULL, state INTEGER NOT NULL,
  summary BLOB NOT NULL, spec BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS attempts (
  job_id TEXT NOT NULL, attempt INTEGER NOT NULL, info BLOB NOT NULL,
  PRIMARY KEY (job_id, attempt));
CREATE TABLE IF NOT EXISTS events (
  id INTEGER PRIMARY KEY AUTOINCREMENT, job_id TEXT NOT NULL, event BLOB NOT NULL);
CREATE INDEX IF NOT EXISTS events_by_job ON events (job_id, id);
CREATE TABLE IF NOT EXISTS workers (id TEXT PRIMARY KEY, info BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS local_workers (slot INTEGER PRIMARY KEY, pid INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS kv (
  job_id TEXT NOT NULL, attempt INTEGER NOT NULL, key TEXT NOT NULL, value BLOB NOT NULL,
  PRIMARY KEY (job_id, attempt, key));
CREATE TABLE IF NOT EXISTS telemetry (
  id INTEGER PRIMARY KEY AUTOINCREMENT, job_id TEXT NOT NULL, attempt INTEGER NOT NULL,
  rank INTEGER NOT NULL, step INTEGER NOT NULL, record BLOB NOT NULL);
CREATE INDEX IF NOT EXISTS telemetry_by_job ON telemetry (job_id, rank, id);
CREATE TABLE IF NOT EXISTS job_steps (
  job_id TEXT NOT NULL, attempt INTEGER NOT NULL, step INTEGER NOT NULL, record BLOB NOT NULL,
  PRIMARY KEY (job_id, attempt, step));
CREATE TABLE IF NOT EXISTS audit (
  id INTEGER PRIMARY KEY AUTOINCREMENT, job_id TEXT NOT NULL, event BLOB NOT NULL);
CREATE INDEX IF NOT EXISTS audit_by_job ON audit (job_id, id);
CREATE TABLE IF NOT EXISTS comm_results (
  job_id TEXT NOT NULL, collective TEXT NOT NULL, bytes INTEGER NOT NULL, result BLOB NOT NULL,
  PRIMARY KEY (job_id, collective, bytes));
)sql";

template <typename Message>
absl::StatusOr<Message> Parse(const std::string& bytes, const char* what) {
  Message m;
  if (!m.ParseFromString(bytes)) {
    return absl::DataLossError(absl::StrCat("job store: unreadable ", what, " record"));
  }
  return m;
}

}  // namespace

absl::StatusOr<std::unique_ptr<JobStore>> JobStore::Open(const std::string& path) {
  sqlite3* db = nullptr;
  if (sqlite3_open(path.c_str(), &db) != SQLITE_OK) {
    std::string msg = db ? sqlite3_errmsg(db) : "out of memory";
    sqlite3_close(db);
    return absl::InternalError(absl::StrCat("cannot open job store ", path, ": ", msg));
  }
  sqlite3_busy_timeout(db, 5000);
  std::unique_ptr<JobStore> store(new JobStore(db));
  RETURN_IF_ERROR(store->Exec("PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL;"));
  RETURN_IF_ERROR(store->Exec(kSchema));
  // The pragma leaves another mode in place where WAL cannot be had (a file system without shared
  // memory): there a reader's lock would make the writer's commits wait, so reads share the
  // writer's connection.
  bool wal = false;
  {
    Statement mode(db, "PRAGMA journal_mode");
    ASSIGN_OR_RETURN(const bool row, mode.Step());
    wal = row && mode.Blob(0) == "wal";
  }
  if (wal && path != ":memory:" && !path.empty()) {
    sqlite3* reader = nullptr;
    const int rc = sqlite3_open_v2(path.c_str(), &reader, SQLITE_OPEN_READONLY, nullptr);
    if (rc != SQLITE_OK) {
      std::string msg = reader ? sqlite3_errmsg(reader) : "out of memory";
      sqlite3_close(reader);
      return absl::InternalError(absl::StrCat("cannot open job store ", path, " to read: ", msg));
    }
    sqlite3_busy_timeout(reader, 5000);
    store->read_db_ = reader;
  }
  return store;
}

JobStore::~JobStore() {
  sqlite3_close(read_db_);
  sqlite3_close(db_);
}

absl::Status JobStore::Read(const std::function<absl::Status(sqlite3*)>& reads) {
  if (read_db_ == nullptr) {
    std::lock_guard<std::recursive_mutex> lock(mu_);
    return reads(db_);
  }
  std::lock_guard<std::mutex> lock(read_mu_);
  RETURN_IF_ERROR(ExecSql(read_db_, "BEGIN"));  // one snapshot for all of them
  const absl::Status status = reads(read_db_);
  // Ends the read: a snapshot left open would hold back the WAL's checkpoints, and the next BEGIN
  // would fail.
  if (!ExecSql(read_db_, "COMMIT").ok() && sqlite3_get_autocommit(read_db_) == 0) {
    ExecSql(read_db_, "ROLLBACK").IgnoreError();
  }
  return status;
}

absl::Status JobStore::Exec(const std::string& sql) { return ExecSql(db_, sql); }

absl::Status JobStore::Transaction(const std::function<absl::Status()>& body) {
  std::lock_guard<std::recursive_mutex> lock(mu_);
  return RunTransaction(db_, body);
}

absl::StatusOr<uint64_t> JobStore::NextJobSeq() {
  std::lock_guard<std::recursive_mutex> lock(mu_);
  RETURN_IF_ERROR(Exec("UPDATE meta SET value = value + 1 WHERE key = 'job_seq'"));
  Statement q(db_, "SELECT value FROM meta WHERE key = 'job_seq'");
  ASSIGN_OR_RETURN(bool row, q.Step());
  if (!row) return absl::InternalError("job store: job sequence missing");
  return static_cast<uint64_t>(q.Int(0));
}

absl::Status JobStore::PutJob(const v1::JobSummary& summary, const v1::JobSpec& spec) {
  std::lock_guard<std::recursive_mutex> lock(mu_);
  Statement q(db_,
              "INSERT INTO jobs (id, seq, state, summary, spec) VALUES (?1, ?2, ?3, ?4, ?5) "
              "ON CONFLICT(id) DO UPDATE SET state = ?3, summary = ?4, spec = ?5");
  return q.BindText(1, summary.job_id())
      .Bind(2, static_cast<int64_t>(summary.submitted_unix() * 1e6))
      .Bind(3, static_cast<int64_t>(summary.state()))
      .Bind(4, summary.SerializeAsString())
      .Bind(5, spec.SerializeAsString())
      .Run();
}

absl::Status JobStore::PutSummary(const v1::JobSummary& summary) {
  std::lock_guard<std::recursive_mutex> lock(mu_);
  Statement q(db_, "UPDATE jobs SET state = ?2, summary = ?3 WHERE id = ?1");
  RETURN_IF_ERROR(q.BindText(1, summary.job_id())
                      .Bind(2, static_cast<int64_t>(summary.state()))
                      .Bind(3, summary.SerializeAsString())
                      .Run());
  if (sqlite3_changes(db_) == 0) {
    return absl::NotFoundError(absl::StrCat("job store: no job ", summary.job_id()));
  }
  return absl::OkStatus();
}

absl::Status JobStore::PutAttempt(const std::string& job_id, const v1::AttemptInfo& attempt) {
  std::lock_guard<std::recursive_mutex> lock(mu_);
  Statement q(db_, "INSERT OR REPLACE INTO attempts (job_id, attempt, info) VALUES (?1, ?2, ?3)");
  return q.BindText(1, job_id)
      .Bind(2, static_cast<int64_t>(attempt.attempt()))
      .Bind(3, attempt.SerializeAsString())
      .Run();
}

absl::StatusOr<std::vector<StoredJob>> JobStore::LoadJobs() {
  std::lock_guard<std::recursive_mutex> lock(mu_);
  std::vector<StoredJob> jobs;
  Statement q(db_, "SELECT summary, spec FROM jobs ORDER BY seq");
  while (true) {
    ASSIGN_OR_RETURN(bool row, q.Step());
    if (!row) break;
    StoredJob job;
    ASSIGN_OR_RETURN(job.summary, Parse<v1::JobSummary>(q.Blob(0), "job"));
    ASSIGN_OR_RETURN(job.spec, Parse<v1::JobSpec>(q.Blob(1), "job spec"));
    jobs.push_back(std::move(job));
  }
  for (StoredJob& job : jobs) {
    Statement a(db_, "SELECT info FROM attempts WHERE job_id = ?1 ORDER BY attempt");
    a.BindText(1, job.summary.job_id());
    while (true) {
      ASSIGN_OR_RETURN(bool row, a.Step());
      if (!row) break;
      ASSIGN_OR_RETURN(auto attempt, Parse<v1::AttemptInfo>(a.Blob(0), "attempt"));
      job.attempts.push_back(std::move(attempt));
    }
  }
  return jobs;
}

absl::Status JobStore::AddEvent(const std::string& job_id, const v1::JobEvent& event) {
  std::lock_guard<std::recursive_mutex> lock(mu_);
  Statement q(db_, "INSERT INTO events (job_id, event) VALUES (?1, ?2)");
  return q.BindText(1, job_id).Bind(2, event.SerializeAsString()).Run();
}

absl::StatusOr<std::vector<v1::JobEvent>> JobStore::LoadEvents(const std::string& job_id,
                                                               int limit) {
  std::lock_guard<std::recursive_mutex> lock(mu_);
  Statement q(db_,
              "SELECT event FROM (SELECT id, event FROM events WHERE job_id = ?1 "
              "ORDER BY id DESC LIMIT ?2) ORDER BY id");
  q.BindText(1, job_id).Bind(2, static_cast<int64_t>(limit));
  std::vector<v1::JobEvent> events;
  while (true) {
    ASSIGN_OR_RETURN(bool row, q.Step());
    if (!row) break;
    ASSIGN_OR_RETURN(auto event, Parse<v1::JobEvent>(q.Blob(0), "event"));
    events.push_back(std::move(event));
  }
  return events;
}

absl::Status JobStore::AddAudit(const v1::AuditEvent& event) {
  std::lock_guard<std::recursive_mutex> lock(mu_);
  Statement q(db_, "INSERT INTO audit (job_id, event) VALUES (?1, ?2)");
  return q.BindText(1, event.job_id()).Bind(2, event.SerializeAsString()).Run();
}

absl::Status JobStore::TrimAudit(uint64_t keep) {
  std::lock_guard<std::recursive_mutex> lock(mu_);
  Statement q(db_, "DELETE FROM audit WHERE id <= (SELECT MAX(id) FROM audit) - ?1");
  return q.Bind(1, static_cast<int64_t>(keep)).Run();
}

absl::StatusOr<std::vector<v1::AuditEvent>> JobStore::LoadAudit(const std::string& job_id,
                                                                int limit) {
  std::lock_guard<std::recursive_mutex> lock(mu_);
  Statement q(db_, job_id.empty()
                       ? "SELECT id, event FROM (SELECT id, event FROM audit "
                         "ORDER BY id DESC LIMIT ?2) ORDER BY id"
                       : "SELECT id, event FROM (SELECT id, event FROM audit WHERE job_id = ?1 "
                         "ORDER BY id DESC LIMIT ?2) ORDER BY id");
  if (!job_id.empty()) q.BindText(1, job_id);
  q.Bind(2, static_cast<int64_t>(limit));
  std::vector<v1::AuditEvent> events;
  while (true) {
    ASSIGN_OR_RETURN(bool row, q.Step());
    if (!row) break;
    ASSIGN_OR_RETURN(auto event, Parse<v1::AuditEvent>(q.Blob(1), "audit"));
    event.set_id(static_cast<uint64_t>(q.Int(0)));
    events.push_back(std::move(event));
  }
  return events;
}

absl::Status JobStore::PutWorker(const v1::WorkerInfo& worker) {
  std::lock_guard<std::recursive_mutex> lock(mu_);
  Statement q(db_, "INSERT OR REPLACE INTO workers (id, info) VALUES (?1, ?2)");
  return q.BindText(1, worker.worker_id()).Bind(2, worker.SerializeAsString()).Run();
}

absl::Status JobStore::DeleteWorker(const std::string& worker_id) {
  std::lock_guard<std::recursive_mutex> lock(mu_);
  Statement q(db_, "DELETE FROM workers WHERE id = ?1");
  return q.BindText(1, worker_id).Run();
}

absl::Status JobStore::DeleteJobs(const std::vector<std::string>& job_ids) {
  std::lock_guard<std::recursive_mutex> lock(mu_);
  return Transaction([&]() -> absl::Status {
    for (const std::string& id : job_ids) {
      for (const char* sql :
           {"DELETE FROM jobs WHERE id = ?1", "DELETE FROM attempts WHERE job_id = ?1",
            "DELETE FROM events WHERE job_id = ?1", "DELETE FROM kv WHERE job_id = ?1",
            "DELETE FROM telemetry WHERE job_id = ?1", "DELETE FROM job_steps WHERE job_id = ?1",
            "DELETE FROM comm_results WHERE job_id = ?1"}) {
        Statement q(db_, sql);
        RETURN_IF_ERROR(q.BindText(1, id).Run());
      }
    }
    return absl::OkStatus();
  });
}

absl::StatusOr<std::vector<v1::WorkerInfo>> JobStore::LoadWorkers() {
  std::lock_guard<std::recursive_mutex> lock(mu_);
  Statement q(db_, "SELECT info FROM workers ORDER BY id");
  std::vector<v1::WorkerInfo> workers;
  while (true) {
    ASSIGN_OR_RETURN(bool row, q.Step());
    if (!row) break;
    ASSIGN_OR_RETURN(auto worker, Parse<v1::WorkerInfo>(q.Blob(0), "worker"));
    workers.push_back(std::move(worker));
  }
  return workers;
}

absl::Status JobStore::PutLocalWorker(uint32_t slot, int pid) {
  std::lock_guard<std::recursive_mutex> lock(mu_);
  Statement q(db_, "INSERT OR REPLACE INTO local_workers (slot, pid) VALUES (?1, ?2)");
  return q.Bind(1, static_cast<int64_t>(slot)).Bind(2, static_cast<int64_t>(pid)).Run();
}

absl::StatusOr<std::vector<std::pair<uint32_t, int>>> JobStore::LoadLocalWorkers() {
  std::lock_guard<std::recursive_mutex> lock(mu_);
  Statement q(db_, "SELECT slot, pid FROM local_workers ORDER BY slot");
  std::vector<std::pair<uint32_t, int>> out;
  while (true) {
    ASSIGN_OR_RETURN(bool row, q.Step());
    if (!row) break;
    out.emplace_back(static_cast<uint32_t>(q.Int(0)), static_cast<int>(q.Int(1)));
  }
  return out;
}

absl::Status JobStore::KvPut(const std::string& job_id, uint32_t attempt, const std::string& key,
                             const std::string& value) {
  std::lock_guard<std::recursive_mutex> lock(mu_);
  Statement q(db_,
              "INSERT OR REPLACE INTO kv (job_id, attempt, key, value) VALUES (?1, ?2, ?3, ?4)");
  return q.BindText(1, job_id)
      .Bind(2, static_cast<int64_t>(attempt))
      .BindText(3, key)
      .Bind(4, value)
      .Run();
}

absl::StatusOr<std::vector<std::pair<std::string, std::string>>> JobStore::KvLoad(
    const std::string& job_id, uint32_t attempt) {
  std::lock_guard<std::recursive_mutex> lock(mu_);
  Statement q(db_, "SELECT key, value FROM kv WHERE job_id = ?1 AND attempt = ?2");
  q.BindText(1, job_id).Bind(2, static_cast<int64_t>(attempt));
  std::vector<std::pair<std::string, std::string>> out;
  while (true) {
    ASSIGN_OR_RETURN(bool row, q.Step());
    if (!row) break;
    out.emplace_back(q.Blob(0), q.Blob(1));
  }
  return out;
}

absl::Status JobStore::KvDropScope(const std::string& job_id, uint32_t attempt) {
  std::lock_guard<std::recursive_mutex> lock(mu_);
  Statement q(db_, "DELETE FROM kv WHERE job_id = ?1 AND attempt = ?2");
  return q.BindText(1, job_id).Bind(2, static_cast<int64_t>(attempt)).Run();
}

absl::Status JobStore::AddTelemetry(const std::vector<v1::TelemetryRecord>& records) {
  std::lock_guard<std::recursive_mutex> lock(mu_);
  for (const v1::TelemetryRecord& r : records) {
    Statement ins(db_,
                  "INSERT INTO telemetry (job_id, attempt, rank, step, record) "
                  "VALUES (?1, ?2, ?3, ?4, ?5)");
    RETURN_IF_ERROR(ins.BindText(1, r.job_id())
                        .Bind(2, static_cast<int64_t>(r.attempt()))
                        .Bind(3, static_cast<int64_t>(r.rank()))
                        .Bind(4, static_cast<int64_t>(r.step()))
                        .Bind(5, r.SerializeAsString())
                        .Run());
  }
  return absl::OkStatus();
}

absl::Status JobStore::PutCommResult(const std::string& job_id, const v1::CommResult& result) {
  std::lock_guard<std::recursive_mutex> lock(mu_);
  Statement q(db_,
              "INSERT OR REPLACE INTO comm_results (job_id, collective, bytes, result) "
              "VALUES (?1, ?2, ?3, ?4)");
  return q.BindText(1, job_id)
      .BindText(2, result.collective())
      .Bind(3, static_cast<int64_t>(result.bytes()))
      .Bind(4, result.SerializeAsString())
      .Run();
}

absl::StatusOr<std::vector<v1::CommResult>> JobStore::LoadCommResults(const std::string& job_id) {
  std::lock_guard<std::recursive_mutex> lock(mu_);
  Statement q(db_, "SELECT result FROM comm_results WHERE job_id = ?1 ORDER BY collective, bytes");
  q.BindText(1, job_id);
  std::vector<v1::CommResult> out;
  while (true) {
    ASSIGN_OR_RETURN(bool row, q.Step());
    if (!row) break;
    ASSIGN_OR_RETURN(auto result, Parse<v1::CommResult>(q.Blob(0), "comm result"));
    out.push_back(std::move(result));
  }
  return out;
}

absl::StatusOr<std::optional<v1::TelemetryRecord>> JobStore::LatestRecord(const std::string& job_id,
                                                                          uint32_t rank) {
  std::lock_guard<std::recursive_mutex> lock(mu_);
  // The newest record that carries a step's telemetry (the very last ones, "done" or a failure
  // message, usually carry none); a few dozen rows back at most.
  Statement q(db_,
              "SELECT record FROM telemetry WHERE job_id = ?1 AND rank = ?2 "
              "ORDER BY id DESC LIMIT 64");
  q.BindText(1, job_id).Bind(2, static_cast<int64_t>(rank));
  std::optional<v1::TelemetryRecord> newest;
  while (true) {
    ASSIGN_OR_RETURN(bool row, q.Step());
    if (!row) break;
    ASSIGN_OR_RETURN(auto record, Parse<v1::TelemetryRecord>(q.Blob(0), "telemetry"));
    if (!newest) newest = record;
    if (record.has_train()) return std::optional<v1::TelemetryRecord>(std::move(record));
  }
  return newest;
}

absl::Status JobStore::PutStep(const std::string& job_id, const v1::StepRecord& step) {
  std::lock_guard<std::recursive_mutex> lock(mu_);
  Statement q(db_,
              "INSERT OR REPLACE INTO job_steps (job_id, attempt, step, record) "
              "VALUES (?1, ?2, ?3, ?4)");
  return q.BindText(1, job_id)
      .Bind(2, static_cast<int64_t>(step.attempt()))
      .Bind(3, static_cast<int64_t>(step.step()))
      .Bind(4, step.SerializeAsString())
      .Run();
}

absl::StatusOr<std::vector<v1::StepRecord>> JobStore::LoadSteps(const std::string& job_id,
                                                                uint64_t since_step,
                                                                uint32_t max_points,
                                                                uint32_t max_steps,
                                                                const StepCursor* after) {
  std::vector<v1::StepRecord> out;
  // ?2 and ?3: since_step, or the cursor's attempt and step.
  const std::string where = after != nullptr
                                ? "job_id = ?1 AND (attempt > ?2 OR (attempt = ?2 AND step > ?3))"
                                : "job_id = ?1 AND step > ?2 AND ?3 = 0";
  const int64_t bind2 =
      after != nullptr ? static_cast<int64_t>(after->attempt) : static_cast<int64_t>(since_step);
  const int64_t bind3 = after != nullptr ? static_cast<int64_t>(after->step) : 0;
  RETURN_IF_ERROR(Read([&](sqlite3* db) -> absl::Status {
    if (max_points > 0) {
      Statement keys(db, absl::StrCat("SELECT attempt, step FROM job_steps WHERE ", where,
                                      " ORDER BY attempt, step")
                             .c_str());
      keys.BindText(1, job_id).Bind(2, bind2).Bind(3, bind3);
      std::vector<std::pair<int64_t, int64_t>> all;
      while (true) {
        ASSIGN_OR_RETURN(bool row, keys.Step());
        if (!row) break;
        all.emplace_back(keys.Int(0), keys.Int(1));
      }
      const size_t n = all.size(), max = max_points;
      if (n > max) {
        Statement one(
            db, "SELECT record FROM job_steps WHERE job_id = ?1 AND attempt = ?2 AND step = ?3");
        out.reserve(max);
        for (size_t i = 0; i < max; ++i) {
          // Evenly spaced, the newest always included.
          const size_t idx = max == 1 ? n - 1 : i * (n - 1) / (max - 1);
          one.Reset().BindText(1, job_id).Bind(2, all[idx].first).Bind(3, all[idx].second);
          ASSIGN_OR_RETURN(bool row, one.Step());
          if (!row) continue;  // not possible in one snapshot; a missing row is no point
          ASSIGN_OR_RETURN(auto step, Parse<v1::StepRecord>(one.Blob(0), "step"));
          out.push_back(std::move(step));
        }
        return absl::OkStatus();
      }
    }
    Statement q(db, absl::StrCat("SELECT record FROM job_steps WHERE ", where,
                                 " ORDER BY attempt, step LIMIT ?4")
                        .c_str());
    // One row past max_steps says there are too many (SQLite reads LIMIT -1 as none).
    q.BindText(1, job_id).Bind(2, bind2).Bind(3, bind3).Bind(
        4, max_steps > 0 ? static_cast<int64_t>(max_steps) + 1 : int64_t{-1});
    while (true) {
      ASSIGN_OR_RETURN(bool row, q.Step());
      if (!row) return absl::OkStatus();
      if (max_steps > 0 && out.size() == max_steps) {
        out.clear();
        return absl::ResourceExhaustedError(absl::StrCat(
            "job '", job_id, "' has more than ", max_steps, " steps after ",
            after != nullptr ? absl::StrCat("attempt ", after->attempt, " step ", after->step)
                             : absl::StrCat("step ", since_step)));
      }
      ASSIGN_OR_RETURN(auto step, Parse<v1::StepRecord>(q.Blob(0), "step"));
      out.push_back(std::move(step));
    }
  }));
  return out;
}

absl::StatusOr<std::vector<v1::StepRecord>> JobStore::LoadStepPage(const std::string& job_id,
                                                                   uint32_t after_attempt,
                                                                   uint64_t after_step,
                                                                   uint32_t limit, bool* more) {
  std::vector<v1::StepRecord> out;
  *more = false;
  RETURN_IF_ERROR(Read([&](sqlite3* db) -> absl::Status {
    // One row past the page says whether more follow. The primary key's order: a range scan.
    Statement q(db,
                "SELECT record FROM job_steps WHERE job_id = ?1 AND (attempt > ?2 OR "
                "(attempt = ?2 AND step > ?3)) ORDER BY attempt, step LIMIT ?4");
    q.BindText(1, job_id)
        .Bind(2, static_cast<int64_t>(after_attempt))
        .Bind(3, static_cast<int64_t>(after_step))
        .Bind(4, int64_t{limit} + 1);
    while (true) {
      ASSIGN_OR_RETURN(bool row, q.Step());
      if (!row) return absl::OkStatus();
      if (out.size() == limit) {
        *more = true;
        return absl::OkStatus();
      }
      ASSIGN_OR_RETURN(auto step, Parse<v1::StepRecord>(q.Blob(0), "step"));
      out.push_back(std::move(step));
    }
  }));
  return out;
}

absl::Status JobStore::ForEachStep(const std::string& job_id,
                                   const std::function<void(const v1::StepRecord&)>& fn) {
  return Read([&](sqlite3* db) -> absl::Status {
    Statement q(db, "SELECT record FROM job_steps WHERE job_id = ?1 ORDER BY attempt, step");
    q.BindText(1, job_id);
    while (true) {
      ASSIGN_OR_RETURN(bool row, q.Step());
      if (!row) return absl::OkStatus();
      ASSIGN_OR_RETURN(auto step, Parse<v1::StepRecord>(q.Blob(0), "step"));
      fn(step);
    }
  });
}

absl::Status JobStore::TrimTelemetry(const std::string& job_id, int keep) {
  std::lock_guard<std::recursive_mutex> lock(mu_);
  Statement q(db_,
              "DELETE FROM telemetry WHERE job_id = ?1 AND id < (SELECT id FROM telemetry "
              "WHERE job_id = ?1 ORDER BY id DESC LIMIT 1 OFFSET ?2)");
  return q.BindText(1, job_id).Bind(2, static_cast<int64_t>(keep)).Run();
}

}  // namespace furnace::controller
