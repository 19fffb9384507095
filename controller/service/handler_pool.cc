#include "controller/service/handler_pool.h"

namespace furnace::controller {

HandlerPool::HandlerPool(size_t threads, size_t max_queued) : max_queued_(max_queued) {
  for (size_t i = 0; i < (threads == 0 ? 1 : threads); ++i) {
    threads_.emplace_back([this] { Loop(); });
  }
}

HandlerPool::~HandlerPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  for (auto& t : threads_) t.join();
}

bool HandlerPool::TryPost(std::function<void()> fn) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (queue_.size() >= max_queued_) {
      ++refused_;
      return false;
    }
    queue_.push_back(std::move(fn));
  }
  cv_.notify_one();
  return true;
}

size_t HandlerPool::queued() const {
  std::lock_guard<std::mutex> lock(mu_);
  return queue_.size();
}

uint64_t HandlerPool::refused() const {
  std::lock_guard<std::mutex> lock(mu_);
  return refused_;
}

void HandlerPool::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) return;
    std::function<void()> fn = std::move(queue_.front());
    queue_.pop_front();
    lock.unlock();
    fn();
    lock.lock();
  }
}

}  // namespace furnace::controller
