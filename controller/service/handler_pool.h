// HandlerPool: a fixed number of threads that run the bodies of RPCs which may wait for the
// controller's state mutex (or a transition's write under it), so that gRPC's own callback
// threads, which also deliver every heartbeat and command stream, never block on them. At
// thousands of agents a job start queues thousands of such calls: they wait here as closures,
// not as threads (bench/controlplane/REPORT.md).
//
// Load shedding: the queue is bounded (max_queued). A call that arrives when it is full is refused
// at once (TryPost false: the adapter answers UNAVAILABLE, and agents retry what they send), so
// a controller that falls behind keeps its memory bounded instead of holding every call that
// arrives (each queued call keeps its request and gRPC's arena, ~10 KiB): at 12,288 agents on an
// overloaded machine the unbounded queue took the controller to 2.6 GB (bench/controlplane).
//
// What it owns: its threads and the closures not yet run.
// Thread-safety: TryPost may be called from any thread, also from a closure. Closures run in the
// order posted (several at once, one per thread). Destruction runs what is queued, then joins.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace furnace::controller {

class HandlerPool {
 public:
  HandlerPool(size_t threads, size_t max_queued);
  ~HandlerPool();
  HandlerPool(const HandlerPool&) = delete;
  HandlerPool& operator=(const HandlerPool&) = delete;

  // Queues `fn`; false (and `fn` dropped) when max_queued closures already wait.
  bool TryPost(std::function<void()> fn);
  // Closures posted and not yet started; closures refused so far.
  size_t queued() const;
  uint64_t refused() const;

 private:
  void Loop();

  mutable std::mutex mu_;
  std::condition_variable cv_;
  const size_t max_queued_;
  std::deque<std::function<void()>> queue_;  // guarded by mu_
  uint64_t refused_ = 0;                     // guarded by mu_
  bool stopping_ = false;                    // guarded by mu_
  std::vector<std::thread> threads_;
};

}  // namespace furnace::controller
