// The rendezvous key-value store that ranks use to find each other before Gloo connects.
//
// In production the worker implements KvStore over gRPC to the controller; InMemoryKvStore serves
// tests and single-process runs. Keys are write-once in practice (Gloo's rendezvous never rewrites
// one) but Set simply overwrites.
#pragma once

#include <condition_variable>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace furnace::comm {

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

// A KvStore in process memory (mutex + condition variable). Set never fails.
class InMemoryKvStore : public KvStore {
 public:
  absl::Status Set(const std::string& key, const std::string& value) override;
  // A timeout_s <= 0 checks once without waiting.
  absl::StatusOr<std::vector<std::string>> Get(const std::vector<std::string>& keys,
                                               double timeout_s) override;

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::string> values_;  // guarded by mu_
};

}  // namespace furnace::comm
