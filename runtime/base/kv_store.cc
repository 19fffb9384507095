#include "runtime/base/kv_store.h"

#include <algorithm>
#include <chrono>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace furnace {
namespace {

absl::Status Closed() { return absl::FailedPreconditionError("kv store: closed"); }

}  // namespace

absl::Status InMemoryKvStore::Set(const std::string& key, const std::string& value) {
  std::lock_guard<std::mutex> lock(mu_);
  if (closed_) return Closed();
  values_[key] = value;
  auto [first, last] = waiting_.equal_range(key);
  for (auto it = first; it != last; ++it) it->second->cv.notify_one();
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::string>> InMemoryKvStore::Get(const std::vector<std::string>& keys,
                                                              double timeout_s) {
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                            std::chrono::duration<double>(timeout_s > 0 ? timeout_s : 0.0));
  std::unique_lock<std::mutex> lock(mu_);
  size_t seen = 0;  // keys[0, seen) exist
  Waiter waiter;
  while (true) {
    if (closed_) return Closed();
    while (seen < keys.size() && values_.count(keys[seen])) ++seen;
    if (seen == keys.size()) break;
    if (std::chrono::steady_clock::now() >= deadline) {
      std::vector<std::string> missing;
      for (size_t i = seen; i < keys.size(); ++i) {
        if (values_.find(keys[i]) == values_.end()) missing.push_back(keys[i]);
      }
      // A thousand-rank rendezvous can miss thousands of keys: the first few name the problem.
      constexpr size_t kNamed = 16;
      std::string named =
          absl::StrJoin(missing.begin(), missing.begin() + std::min(missing.size(), kNamed), ", ");
      if (missing.size() > kNamed) {
        named += absl::StrFormat(", ... (%d more)", missing.size() - kNamed);
      }
      return absl::DeadlineExceededError(
          absl::StrFormat("kv store: keys still missing after %.3f s: [%s]", timeout_s, named));
    }
    auto slot = waiting_.emplace(keys[seen], &waiter);
    waiter.cv.wait_until(lock, deadline);
    waiting_.erase(slot);
  }
  std::vector<std::string> out;
  out.reserve(keys.size());
  for (const std::string& key : keys) out.push_back(values_.at(key));
  return out;
}

void InMemoryKvStore::Close() {
  std::lock_guard<std::mutex> lock(mu_);
  closed_ = true;
  values_.clear();
  for (auto& [key, waiter] : waiting_) waiter->cv.notify_one();
}

}  // namespace furnace
