// Rendezvous: the in-memory side of the controller's key-value store for rank processes. Keys live
// in scopes (job, attempt); Wait blocks until every asked key of a scope exists. Durability and
// fencing (refusing a scope whose attempt is over) are the Controller's job: it persists a key
// before Set makes it visible and checks the scope before calling Wait.
//
// Thread-safety: all methods may be called from any thread.
#pragma once

#include <condition_variable>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace furnace::controller {

class Rendezvous {
 public:
  using Scope = std::pair<std::string, uint32_t>;  // (job id, attempt)

  void Set(const Scope& scope, const std::string& key, const std::string& value);
  // Values in key order, or DeadlineExceeded naming the keys still missing after timeout_s.
  absl::StatusOr<std::vector<std::string>> Wait(const Scope& scope,
                                                const std::vector<std::string>& keys,
                                                double timeout_s);
  void DropScope(const Scope& scope);
  // Wakes every waiter of the scope (used when the scope is closed, so waits end early).
  void Close(const Scope& scope);

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<Scope, std::map<std::string, std::string>> scopes_;
  std::map<Scope, bool> closed_;
};

}  // namespace furnace::controller
