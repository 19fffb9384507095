#include "runtime/comm/gloo_store.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "gloo/common/error.h"

namespace furnace::comm {
namespace {

constexpr double kMaxSliceSeconds = 1.0;

}  // namespace

GlooStore::GlooStore(KvStore& store, std::chrono::milliseconds default_timeout,
                     std::function<void()> on_wait_tick, const Clock& clock)
    : store_(store),
      default_timeout_(default_timeout),
      on_wait_tick_(std::move(on_wait_tick)),
      clock_(clock) {}

void GlooStore::set(const std::string& key, const std::vector<char>& data) {
  absl::Status status = store_.Set(key, std::string(data.begin(), data.end()));
  if (!status.ok()) {
    throw gloo::IoException(absl::StrCat("rendezvous store set '", key, "': ", status.ToString()));
  }
}

std::vector<char> GlooStore::get(const std::string& key) {
  std::vector<std::string> values = WaitAndGet({key}, default_timeout_);
  return std::vector<char>(values[0].begin(), values[0].end());
}

void GlooStore::wait(const std::vector<std::string>& keys) { WaitAndGet(keys, default_timeout_); }

void GlooStore::wait(const std::vector<std::string>& keys,
                     const std::chrono::milliseconds& timeout) {
  WaitAndGet(keys, timeout);
}

std::vector<std::string> GlooStore::WaitAndGet(const std::vector<std::string>& keys,
                                               std::chrono::milliseconds timeout) {
  const double timeout_s = std::chrono::duration<double>(timeout).count();
  const double deadline = clock_.MonotonicSeconds() + timeout_s;
  while (true) {
    const double left = deadline - clock_.MonotonicSeconds();
    absl::StatusOr<std::vector<std::string>> values =
        store_.Get(keys, std::clamp(left, 0.0, kMaxSliceSeconds));
    if (values.ok()) return *std::move(values);
    if (!absl::IsDeadlineExceeded(values.status())) {
      throw gloo::IoException(absl::StrCat("rendezvous store get: ", values.status().ToString()));
    }
    if (on_wait_tick_) on_wait_tick_();
    if (clock_.MonotonicSeconds() >= deadline) {
      throw gloo::IoException(
          absl::StrFormat("rendezvous timed out after %.3f s (last store answer: %s)", timeout_s,
                          values.status().message()));
    }
  }
}

}  // namespace furnace::comm
