#include "controller/service/deadline_timer.h"

namespace furnace::controller {

DeadlineTimer::DeadlineTimer() : thread_([this] { Loop(); }) {}

DeadlineTimer::~DeadlineTimer() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void DeadlineTimer::After(double seconds, std::function<void()> fn) {
  const Time at = std::chrono::steady_clock::now() +
                  std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                      std::chrono::duration<double>(seconds > 0 ? seconds : 0.0));
  bool first = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = due_.emplace(at, std::move(fn));
    first = it == due_.begin();
  }
  if (first) cv_.notify_all();  // the loop sleeps until the earliest deadline
}

size_t DeadlineTimer::pending() const {
  std::lock_guard<std::mutex> lock(mu_);
  return due_.size();
}

void DeadlineTimer::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_) {
    if (due_.empty()) {
      cv_.wait(lock);
      continue;
    }
    auto first = due_.begin();
    if (first->first > std::chrono::steady_clock::now()) {
      cv_.wait_until(lock, first->first);
      continue;
    }
    std::function<void()> fn = std::move(first->second);
    due_.erase(first);
    lock.unlock();
    fn();
    lock.lock();
  }
}

}  // namespace furnace::controller
