// A bounded FIFO that drops its oldest items when full and counts what it dropped. The agent
// buffers telemetry and log lines in these between the rank supervisors (producers, which must
// never block) and a flusher thread (the consumer, which may be stalled by a slow controller).
// Full is either bound: `capacity` items or `max_bytes` bytes (each item's size as `size_of`
// says; a protobuf message's wire size by default), so a rank printing 64 KiB lines or a record
// of many experts cannot grow the agent 10,000 times that while the controller is away.
//
// Thread-safety: every method may be called from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <limits>
#include <mutex>
#include <utility>
#include <vector>

namespace furnace::worker {

template <typename T>
class BoundedQueue {
 public:
  using SizeOf = std::function<size_t(const T&)>;
  explicit BoundedQueue(
      size_t capacity, size_t max_bytes = std::numeric_limits<size_t>::max(),
      SizeOf size_of = [](const T& item) { return item.ByteSizeLong(); })
      : capacity_(capacity), max_bytes_(max_bytes), size_of_(std::move(size_of)) {}

  void Push(T item) {
    std::lock_guard<std::mutex> lock(mu_);
    const size_t bytes = size_of_(item);
    items_.emplace_back(std::move(item), bytes);
    bytes_ += bytes;
    TrimLocked();
  }

  // Removes and returns the oldest items: up to `max_items` of them, and no more than `max_bytes`
  // together unless the first alone is larger (it goes alone, so nothing is stuck).
  std::vector<T> Take(size_t max_items, size_t max_bytes = std::numeric_limits<size_t>::max()) {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<T> out;
    size_t taken = 0;
    while (!items_.empty() && out.size() < max_items) {
      const size_t bytes = items_.front().second;
      if (!out.empty() && taken + bytes > max_bytes) break;
      taken += bytes;
      bytes_ -= bytes;
      out.push_back(std::move(items_.front().first));
      items_.pop_front();
    }
    return out;
  }

  // Puts back, at the front and in order, items a failed send returned; the oldest of them are
  // dropped if newer items filled the queue meanwhile.
  void PutBack(std::vector<T> items) {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = items.rbegin(); it != items.rend(); ++it) {
      const size_t bytes = size_of_(*it);
      items_.emplace_front(std::move(*it), bytes);
      bytes_ += bytes;
    }
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
  size_t bytes() const {
    std::lock_guard<std::mutex> lock(mu_);
    return bytes_;
  }

 private:
  // Drops the oldest until both bounds hold (the newest item stays, however large).
  void TrimLocked() {
    while (items_.size() > capacity_ || (bytes_ > max_bytes_ && items_.size() > 1)) {
      bytes_ -= items_.front().second;
      items_.pop_front();
      ++dropped_;
    }
  }

  const size_t capacity_;
  const size_t max_bytes_;
  const SizeOf size_of_;
  mutable std::mutex mu_;
  std::deque<std::pair<T, size_t>> items_;  // guarded by mu_: each item and its size
  size_t bytes_ = 0;                        // guarded by mu_: the items' sizes summed
  uint64_t dropped_ = 0;                    // guarded by mu_
};

}  // namespace furnace::worker
