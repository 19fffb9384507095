#include "runtime/base/kv_store.h"

#include <chrono>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace furnace {
namespace {

absl::Status Closed() { return absl::FailedPreconditionError("kv store: closed"); }

}  // namespace

absl::Status InMemoryKvStore::Set(const std::string& key, const std::string& value) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return Closed();
    values_[key] = value;
  }
  cv_.notify_all();
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::string>> InMemoryKvStore::Get(const std::vector<std::string>& keys,
                                                              double timeout_s) {
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                            std::chrono::duration<double>(timeout_s > 0 ? timeout_s : 0.0));
  auto all_present = [&] {
    for (const std::string& key : keys) {
      if (values_.find(key) == values_.end()) return false;
    }
    return true;
  };
  std::unique_lock<std::mutex> lock(mu_);
  const bool ready = cv_.wait_until(lock, deadline, [&] { return closed_ || all_present(); });
  if (closed_) return Closed();
  if (!ready) {
    std::vector<std::string> missing;
    for (const std::string& key : keys) {
      if (values_.find(key) == values_.end()) missing.push_back(key);
    }
    return absl::DeadlineExceededError(
        absl::StrFormat("kv store: keys still missing after %.3f s: [%s]", timeout_s,
                        absl::StrJoin(missing, ", ")));
  }
  std::vector<std::string> out;
  out.reserve(keys.size());
  for (const std::string& key : keys) out.push_back(values_.at(key));
  return out;
}

void InMemoryKvStore::Close() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = true;
    values_.clear();
  }
  cv_.notify_all();
}

}  // namespace furnace
