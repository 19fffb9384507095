// RateLimiter: a token bucket per caller identity for job submission (`furnace-controller
// --submit-rate R --submit-burst B`): each caller may submit B jobs at once, then R per second.
// A caller over its limit gets ResourceExhausted saying the limit and when to retry, so one
// script in a loop cannot fill the job store or starve other users.
//
// Memory: one bucket per identity seen recently; a bucket that has refilled completely carries no
// information and is dropped when the map grows past kMaxIdle entries, so a flood of distinct
// (anonymous peer) identities cannot grow it without bound.
//
// Thread-safe (one mutex); time comes from the Clock given (FakeClock in tests).
#pragma once

#include <cstddef>
#include <map>
#include <mutex>
#include <string>

#include "absl/status/status.h"
#include "runtime/base/clock.h"

namespace furnace::controller {

class RateLimiter {
 public:
  // rate: tokens per second (> 0); burst: bucket size (>= 1). rate <= 0 disables the limit.
  RateLimiter(double rate, double burst, const Clock& clock);

  // Takes one token from `identity`'s bucket: OK, or ResourceExhausted
  //   "submission rate limit for <identity>: <burst> at once, then <rate> per second
  //    (--submit-burst, --submit-rate); retry in <s> s"
  absl::Status Admit(const std::string& identity);

  static constexpr size_t kMaxIdle = 4096;

 private:
  struct Bucket {
    double tokens = 0;
    double updated = 0;  // monotonic seconds
  };
  void DropFullBuckets(double now);

  const double rate_;
  const double burst_;
  const Clock& clock_;
  std::mutex mu_;
  std::map<std::string, Bucket> buckets_;  // guarded by mu_
};

}  // namespace furnace::controller
