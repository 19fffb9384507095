// DeadlineTimer: runs callbacks at given times on one thread of its own, so that thousands of
// waits with a timeout (the rendezvous' KvGet, controller/service/rendezvous.h) hold no thread
// each while they wait.
//
// What it owns: its thread and the callbacks not yet run. Times are on the steady clock (a wait's
// timeout is real time, as a gRPC deadline is).
// Thread-safety: After may be called from any thread, also from a callback. Callbacks run one at a
// time on the timer's thread, in deadline order, never under the timer's lock; a slow one delays
// the next.
// Errors: none. A callback due after the timer is destroyed is dropped, never run: an owner that
// must answer every wait does so before (Rendezvous::Shutdown).
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>
#include <thread>

namespace furnace::controller {

class DeadlineTimer {
 public:
  DeadlineTimer();
  ~DeadlineTimer();
  DeadlineTimer(const DeadlineTimer&) = delete;
  DeadlineTimer& operator=(const DeadlineTimer&) = delete;

  // Runs `fn` once, `seconds` from now (at once, on the timer's thread, when <= 0).
  void After(double seconds, std::function<void()> fn);
  // Callbacks not yet run.
  size_t pending() const;

 private:
  using Time = std::chrono::steady_clock::time_point;
  void Loop();

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::multimap<Time, std::function<void()>> due_;  // guarded by mu_
  bool stopping_ = false;                           // guarded by mu_
  std::thread thread_;                              // last: starts after the rest exists
};

}  // namespace furnace::controller
