// Rendezvous: the in-memory side of the controller's key-value store for rank processes, a thin
// layer over one InMemoryKvStore (runtime/base/kv_store.h) per scope (job, attempt). Get blocks
// until every asked key of its scope exists. Closing a scope (its attempt is over) ends its waits
// and refuses it from then on, so a rank of a failed attempt can never read keys of the next one.
//
// What it owns: the scopes' stores. Durability and the job-level fencing check (refusing a scope
// whose attempt is not the job's running one) are the Controller's: it persists a key before Set
// makes it visible and checks the scope before calling Get.
// Thread-safety: every method may be called from any thread; Get waits without holding any lock
// but its scope's own.
// Errors: Get returns DeadlineExceeded naming the keys still missing after timeout_s, and
// FailedPrecondition for a closed scope.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/base/kv_store.h"

namespace furnace::controller {

class Rendezvous {
 public:
  using Scope = std::pair<std::string, uint32_t>;  // (job id, attempt)

  // Ignored for a closed scope.
  void Set(const Scope& scope, const std::string& key, const std::string& value);
  // Values in key order.
  absl::StatusOr<std::vector<std::string>> Get(const Scope& scope,
                                               const std::vector<std::string>& keys,
                                               double timeout_s);
  // Drops the scope's keys and wakes its waiters; the scope is refused from then on.
  void Close(const Scope& scope);

 private:
  // The scope's store, created on first use; null when the scope is closed.
  std::shared_ptr<InMemoryKvStore> Open(const Scope& scope);

  std::mutex mu_;
  std::map<Scope, std::shared_ptr<InMemoryKvStore>> scopes_;  // guarded by mu_
  std::set<Scope> closed_;                                     // guarded by mu_
};

}  // namespace furnace::controller
