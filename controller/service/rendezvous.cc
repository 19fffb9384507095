#include "controller/service/rendezvous.h"

#include <chrono>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace furnace::controller {

void Rendezvous::Set(const Scope& scope, const std::string& key, const std::string& value) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_.count(scope)) return;  // its attempt is over
    scopes_[scope][key] = value;
  }
  cv_.notify_all();
}

absl::StatusOr<std::vector<std::string>> Rendezvous::Wait(const Scope& scope,
                                                          const std::vector<std::string>& keys,
                                                          double timeout_s) {
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                            std::chrono::duration<double>(timeout_s));
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    if (closed_.count(scope)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "rendezvous scope of job ", scope.first, " attempt ", scope.second, " is closed"));
    }
    std::vector<std::string> values, missing;
    const auto& kv = scopes_[scope];
    for (const std::string& key : keys) {
      auto it = kv.find(key);
      if (it == kv.end()) {
        missing.push_back(key);
      } else {
        values.push_back(it->second);
      }
    }
    if (missing.empty()) return values;
    if (cv_.wait_until(lock, deadline) == std::cv_status::timeout &&
        std::chrono::steady_clock::now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("rendezvous: keys still missing after ", timeout_s,
                       " s: ", absl::StrJoin(missing, ", ")));
    }
  }
}

void Rendezvous::DropScope(const Scope& scope) {
  std::lock_guard<std::mutex> lock(mu_);
  scopes_.erase(scope);
}

void Rendezvous::Close(const Scope& scope) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    scopes_.erase(scope);
    closed_[scope] = true;
  }
  cv_.notify_all();
}

}  // namespace furnace::controller
