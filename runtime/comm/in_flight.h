// Which collectives this process is blocked in right now: the communicators mark each call on
// entry and clear the mark on return (a stream-ordered collective, which returns once enqueued,
// from its enqueue until its stream has passed it: comm_watchdog.h), so a watchdog on another
// thread can say WHAT a stuck rank is waiting for ("all_reduce on dp[0,1] (2 ranks) for 30 s")
// instead of only that it stopped.
//
// Why a process-wide registry: a rank runs its collectives on several communicators (one per
// group) and, for the fused exchange, on two threads at once; the watchdog wants one place to
// look. A mark costs one uncontended mutex lock on entry and one on return, nothing against a
// collective's own cost.
//
// Thread-safety: every method may be called from any thread.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>

#include "runtime/base/clock.h"

namespace furnace::comm {

class Communicator;

struct InFlightCall {
  std::string op;     // "all_reduce", "recv", "wait_sends", ...
  std::string group;  // the communicator's name, e.g. "dp[0,1]"
  int group_size = 0;
  int peer = -1;       // point to point: the peer's rank in the group; -1 otherwise
  double since_s = 0;  // entry, on the registry's clock (MonotonicSeconds)
  // False while a stream-ordered collective waits on its stream behind this rank's own device
  // work (its start mark not passed: a kernel or copy before it has not finished), so it is not
  // waiting on its peers yet; a blocking call is started on entry.
  bool started = true;
};

class InFlightCollectives {
 public:
  explicit InFlightCollectives(const Clock& clock) : clock_(clock) {}

  // Marks a call as in flight (`started`: see InFlightCall); returns the token End takes.
  uint64_t Begin(const std::string& op, const std::string& group, int group_size, int peer = -1,
                 bool started = true);
  // The call's stream has reached it (InFlightCall::started).
  void MarkStarted(uint64_t token);
  void End(uint64_t token);

  // The call in flight the longest (the one the others are most likely stuck behind), if any.
  std::optional<InFlightCall> Oldest() const;
  size_t count() const;
  const Clock& clock() const { return clock_; }

 private:
  const Clock& clock_;
  mutable std::mutex mu_;
  uint64_t next_ = 1;                       // guarded by mu_
  std::map<uint64_t, InFlightCall> calls_;  // guarded by mu_; by token (= entry order)
};

// The registry the communicators of this process mark their calls in (on the real clock).
InFlightCollectives& ProcessInFlight();

// Marks one call of `comm` in ProcessInFlight() for the lifetime of the object.
class ScopedInFlight {
 public:
  ScopedInFlight(const char* op, const Communicator& comm, int peer = -1);
  ~ScopedInFlight();
  ScopedInFlight(const ScopedInFlight&) = delete;
  ScopedInFlight& operator=(const ScopedInFlight&) = delete;

 private:
  uint64_t token_;
};

}  // namespace furnace::comm
