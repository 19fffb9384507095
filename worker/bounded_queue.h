// A bounded FIFO that drops its oldest items when full and counts what it dropped. The agent
// buffers telemetry and log lines in these between the rank supervisors (producers, which must
// never block) and a flusher thread (the consumer, which may be stalled by a slow controller).
//
// Thread-safety: every method may be called from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <mutex>
#include <vector>

namespace furnace::worker {

template <typename T>
class BoundedQueue {
 public:
  explicit BoundedQueue(size_t capacity) : capacity_(capacity) {}

  void Push(T item) {
    std::lock_guard<std::mutex> lock(mu_);
    items_.push_back(std::move(item));
    TrimLocked();
  }

  // Removes and returns up to `max_items` of the oldest items.
  std::vector<T> Take(size_t max_items) {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<T> out;
    while (!items_.empty() && out.size() < max_items) {
      out.push_back(std::move(items_.front()));
      items_.pop_front();
    }
    return out;
  }

  // Puts back, at the front and in order, items a failed send returned; the oldest of them are
  // dropped if newer items filled the queue meanwhile.
  void PutBack(std::vector<T> items) {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = items.rbegin(); it != items.rend(); ++it) items_.push_front(std::move(*it));
    TrimLocked();
  }

  // Returns the count of items dropped since the last call, and resets it.
  uint64_t TakeDropped() {
    std::lock_guard<std::mutex> lock(mu_);
    const uint64_t dropped = dropped_;
    dropped_ = 0;
    return dropped;
  }
  // Adds back a count TakeDropped returned that could not be delivered.
  void AddDropped(uint64_t count) {
    std::lock_guard<std::mutex> lock(mu_);
    dropped_ += count;
  }

  size_t size() const {
    std::lock_guard<std::mutex> lock(mu_);
    return items_.size();
  }

 private:
  void TrimLocked() {
    while (items_.size() > capacity_) {
      items_.pop_front();
      ++dropped_;
    }
  }

  const size_t capacity_;
  mutable std::mutex mu_;
  std::deque<T> items_;   // guarded by mu_
  uint64_t dropped_ = 0;  // guarded by mu_
};

}  // namespace furnace::worker
