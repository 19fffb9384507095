#include "controller/service/rate_limiter.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace furnace::controller {

RateLimiter::RateLimiter(double rate, double burst, const Clock& clock)
    : rate_(rate), burst_(std::max(1.0, burst)), clock_(clock) {}

absl::Status RateLimiter::Admit(const std::string& identity) {
  if (rate_ <= 0) return absl::OkStatus();
  std::lock_guard<std::mutex> lock(mu_);
  const double now = clock_.MonotonicSeconds();
  auto it = buckets_.find(identity);
  if (it == buckets_.end()) {
    if (buckets_.size() >= kMaxIdle) DropFullBuckets(now);
    it = buckets_.emplace(identity, Bucket{burst_, now}).first;
  }
  Bucket& b = it->second;
  b.tokens = std::min(burst_, b.tokens + (now - b.updated) * rate_);
  b.updated = now;
  if (b.tokens >= 1.0) {
    b.tokens -= 1.0;
    return absl::OkStatus();
  }
  const double retry_s = (1.0 - b.tokens) / rate_;
  return absl::ResourceExhaustedError(absl::StrFormat(
      "submission rate limit for %s: %g at once, then %g per second (--submit-burst, "
      "--submit-rate); retry in %.1f s",
      identity, burst_, rate_, std::ceil(retry_s * 10) / 10));
}

void RateLimiter::DropFullBuckets(double now) {
  for (auto it = buckets_.begin(); it != buckets_.end();) {
    if (it->second.tokens + (now - it->second.updated) * rate_ >= burst_) {
      it = buckets_.erase(it);
    } else {
      ++it;
    }
  }
}

}  // namespace furnace::controller
