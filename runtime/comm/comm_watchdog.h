// The watchdog of one rank's stream-ordered collectives (stream_communicator.h): it makes a hung
// NCCL collective a recoverable failure, as a Gloo timeout already is.
//
// Why: an NCCL collective is enqueued and the call returns; when a peer dies or stalls, the kernel
// waits on the GPU forever and no call of the rank ever returns an error. So every collective the
// rank's StreamCommunicators enqueue is followed here, from its enqueue to a mark the stream
// passes after it (stream_marks.h), on a thread of the watchdog's own:
//   * Timeout: when the oldest outstanding collective has not completed timeout_s after it was
//     enqueued (the job's collective timeout, the one its Gloo groups use: rank_groups.cc), every
//     registered communicator is failed with DeadlineExceeded "<op> on <group> (<n> ranks) not
//     complete on its stream after <t> s (collective timeout <T> s): every communicator of this
//     rank is aborted" and its transport aborted (ncclCommAbort, which also ends the kernels still
//     waiting). The oldest is the one the others wait behind, so it is the one named.
//   * Asynchronous errors: every async_error_interval_s each transport's AsyncError() is asked
//     (NCCL: ncclCommGetAsyncError, where a dead peer shows up as a remote or system error);
//     the first error fails every communicator the same way, with that error's code and words.
// After that every call of every communicator of the rank fails fast with the error (sticky), so
// the trainer's step fails, the rank exits with the error, and the controller's recovery restarts
// the attempt as it does for a Gloo failure.
//
// While a collective is outstanding it is marked in ProcessInFlight() (in_flight.h: op, group,
// peer, since its enqueue), so the rank watchdog (worker/rank_watchdog.h) names it in a "hung in"
// report. When a collective's end mark has passed, its stream time (from the mark before it) is
// added to the communicator's stream_counters().
//
// Ownership: the rank's StreamCommunicators share the watchdog (shared_ptr); it borrows them
// between their Register and Unregister (their constructor and destructor). Its thread runs
// from Create to the destructor. Thread-safety: every method may be called from any thread.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "runtime/base/clock.h"
#include "runtime/comm/communicator.h"
#include "runtime/comm/stream_marks.h"

namespace furnace::comm {

class StreamCommunicator;

struct CommWatchdogOptions {
  // A collective not complete on its stream this long after its enqueue aborts the rank's
  // communicators.
  double timeout_s = 300;
  double poll_interval_s = 0.001;       // how often the outstanding collectives are looked at
  double async_error_interval_s = 0.1;  // how often each transport's AsyncError() is asked
  const Clock* clock = nullptr;         // what the timeout is measured on; nullptr: RealClock()
};

class CommWatchdog {
 public:
  // InvalidArgument unless every interval is positive.
  static absl::StatusOr<std::shared_ptr<CommWatchdog>> Create(CommWatchdogOptions options = {});
  ~CommWatchdog();
  CommWatchdog(const CommWatchdog&) = delete;
  CommWatchdog& operator=(const CommWatchdog&) = delete;

  const CommWatchdogOptions& options() const { return options_; }
  // The error that made the watchdog abort the communicators; OK until then.
  absl::Status error() const;
  // Collectives enqueued whose end has not been seen yet.
  size_t outstanding() const;
  // Fails every registered communicator with `status` and aborts its transport (the first error
  // stays; later calls are no-ops). What a timeout or an asynchronous error does; the rank may
  // call it too.
  void AbortAll(absl::Status status);

 private:
  friend class StreamCommunicator;
  struct Pending {
    StreamCommunicator* comm;
    CollectiveOp op;
    std::string name;  // "all_reduce", ...
    int peer;          // send and recv: the peer's rank in the group; -1 otherwise
    int64_t bytes;
    std::shared_ptr<StreamMark> start, end;
    double since_s;  // enqueue, on options_.clock
    uint64_t in_flight_token;
    bool started = false;  // the stream has passed `start` (InFlightCall::started)
    bool counted = true;   // added to the stream counters when it completes
  };

  explicit CommWatchdog(CommWatchdogOptions options);
  void Register(StreamCommunicator* comm);
  // Forgets `comm` and its outstanding collectives.
  void Unregister(StreamCommunicator* comm);
  // Follows one enqueued collective of `comm` (`peer` for send and recv, else -1). `counted`
  // false: its completion is not added to the communicator's stream counters (PostSends, whose
  // sends were counted when they were made).
  void Track(StreamCommunicator* comm, CollectiveOp op, const char* name, int peer, int64_t bytes,
             std::shared_ptr<StreamMark> start, std::shared_ptr<StreamMark> end,
             bool counted = true);

  void Main();
  // One look at the outstanding collectives; returns the status to abort with, if any.
  absl::Status CheckPendingLocked();
  absl::Status CheckTransportsLocked();
  void AbortAllLocked(absl::Status status);
  // Drops every outstanding collective (and its in-flight mark).
  void ClearPendingLocked();

  const CommWatchdogOptions options_;
  const Clock& clock_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::set<StreamCommunicator*> comms_;  // guarded by mu_
  std::deque<Pending> pending_;          // guarded by mu_; in enqueue order
  absl::Status error_;                   // guarded by mu_
  double next_async_check_s_ = 0;        // guarded by mu_
  bool stop_ = false;                    // guarded by mu_
  std::thread thread_;
};

}  // namespace furnace::comm
