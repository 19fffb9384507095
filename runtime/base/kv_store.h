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

// A KvStore in process memory. Set fails only after Close.
// Scale: the controller holds one per attempt, where every rank of a job of thousands waits for
// every rank's key. A waiter therefore sleeps on the first key it still misses and only a Set of
// that key wakes it (not every Set), and it never re-checks the keys it has already seen (keys are
// only dropped by Close): a rendezvous of N ranks costs O(N) wake-ups and O(N^2) lookups in all,
// not O(N^2) wake-ups each re-scanning the keys.
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
  struct Waiter {
    std::condition_variable cv;
  };
  std::mutex mu_;
  std::map<std::string, std::string> values_;    // guarded by mu_
  std::multimap<std::string, Waiter*> waiting_;  // by the key each waits for; guarded by mu_
  bool closed_ = false;                          // guarded by mu_
};

}  // namespace furnace
