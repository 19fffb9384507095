// A prepared SQLite statement with RAII finalisation and typed binds, and transactions.
// Internal to the store.
#pragma once

#include <sqlite3.h>

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "runtime/base/status.h"

namespace furnace::controller {

class Statement {
 public:
  Statement(sqlite3* db, const std::string& sql) : db_(db) {
    rc_ = sqlite3_prepare_v2(db, sql.c_str(), -1, &stmt_, nullptr);
  }
  ~Statement() { sqlite3_finalize(stmt_); }
  Statement(const Statement&) = delete;
  Statement& operator=(const Statement&) = delete;

  absl::Status prepared() const {
    if (rc_ == SQLITE_OK) return absl::OkStatus();
    return absl::InternalError(absl::StrCat("sqlite prepare: ", sqlite3_errmsg(db_)));
  }
  Statement& Bind(int i, const std::string& v) {
    sqlite3_bind_blob(stmt_, i, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT);
    return *this;
  }
  Statement& BindText(int i, const std::string& v) {
    sqlite3_bind_text(stmt_, i, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT);
    return *this;
  }
  Statement& Bind(int i, int64_t v) {
    sqlite3_bind_int64(stmt_, i, v);
    return *this;
  }
  Statement& Bind(int i, double v) {
    sqlite3_bind_double(stmt_, i, v);
    return *this;
  }
  // Steps once: true when a row is available, false when done.
  absl::StatusOr<bool> Step() {
    if (rc_ != SQLITE_OK) return prepared();
    const int rc = sqlite3_step(stmt_);
    if (rc == SQLITE_ROW) return true;
    if (rc == SQLITE_DONE) return false;
    return absl::InternalError(absl::StrCat("sqlite step: ", sqlite3_errmsg(db_)));
  }
  absl::Status Run() {
    auto row = Step();
    return row.ok() ? absl::OkStatus() : row.status();
  }
  std::string Blob(int col) const {
    const void* p = sqlite3_column_blob(stmt_, col);
    const int n = sqlite3_column_bytes(stmt_, col);
    return p ? std::string(static_cast<const char*>(p), n) : std::string();
  }
  int64_t Int(int col) const { return sqlite3_column_int64(stmt_, col); }
  // Ready to run again with new bindings.
  Statement& Reset() {
    sqlite3_reset(stmt_);
    sqlite3_clear_bindings(stmt_);
    return *this;
  }

 private:
  sqlite3* db_;
  sqlite3_stmt* stmt_ = nullptr;
  int rc_;
};

// Runs `sql` (statements without results) on `db`.
inline absl::Status ExecSql(sqlite3* db, const std::string& sql) {
  char* err = nullptr;
  if (sqlite3_exec(db, sql.c_str(), nullptr, nullptr, &err) != SQLITE_OK) {
    std::string msg = err ? err : "unknown error";
    sqlite3_free(err);
    return absl::InternalError(absl::StrCat("job store: ", msg));
  }
  return absl::OkStatus();
}

// Runs `body` as one IMMEDIATE transaction on `db`: committed when it returns OK, rolled back when
// it fails. A COMMIT that fails (SQLITE_FULL, SQLITE_IOERR, SQLITE_BUSY, a deferred constraint)
// may leave the transaction open (sqlite.org/lang_transaction.html, "Response To Errors Within A
// Transaction"), and the connection's later statements would run inside it, reported done and
// never committed, while every later BEGIN failed: it is rolled back, and the COMMIT's error
// returned.
inline absl::Status RunTransaction(sqlite3* db, const std::function<absl::Status()>& body) {
  RETURN_IF_ERROR(ExecSql(db, "BEGIN IMMEDIATE"));
  absl::Status status = body();
  if (status.ok()) status = ExecSql(db, "COMMIT");
  // sqlite3_get_autocommit is 0 while a transaction is open.
  if (!status.ok() && sqlite3_get_autocommit(db) == 0) ExecSql(db, "ROLLBACK").IgnoreError();
  return status;
}

}  // namespace furnace::controller
