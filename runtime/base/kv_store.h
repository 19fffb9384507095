// The key-value store that ranks use to find each other before Gloo or NCCL connect, and the one
// in-memory implementation of it, shared by both sides of the rendezvous: the controller keeps one
// InMemoryKvStore per (job, attempt) scope (controller/service/rendezvous.h), and tests and
// single-process runs give one to the ranks directly. In production a rank's KvStore talks to the
// controller over gRPC (worker/grpc_kv_store.h).
//
// Keys are write-once in practice (Gloo's rendezvous never rewrites one) but Set simply
// overwrites.
#pragma once

#include <condition_variable>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace furnace {

// Thread-safe: every method may be called from any thread at the same time.
class KvStore {
 public:
  virtual ~KvStore() = default;
  virtual absl::Status Set(const std::string& key, const std::string& value) = 0;
  // Waits until every key exists (at most timeout_s), returns values in key order;
  // DeadlineExceeded naming the missing keys on timeout.
  virtual absl::StatusOr<std::vector<std::string>> Get(const std::vector<std::string>& keys,
                                                       double timeout_s) = 0;
};

// A KvStore in process memory (mutex + condition variable). Set fails only after Close.
class InMemoryKvStore : public KvStore {
 public:
  // FailedPrecondition once the store is closed.
  absl::Status Set(const std::string& key, const std::string& value) override;
  // A timeout_s <= 0 checks once without waiting. FailedPrecondition once the store is closed
  // (also for a Get already waiting when Close is called).
  absl::StatusOr<std::vector<std::string>> Get(const std::vector<std::string>& keys,
                                               double timeout_s) override;
  // Drops every key and ends every wait; the store refuses all calls from then on.
  void Close();

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::string> values_;  // guarded by mu_
  bool closed_ = false;                         // guarded by mu_
};

}  // namespace furnace
