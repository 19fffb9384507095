#include "controller/store/group_commit.h"

#include <future>

namespace furnace::controller {

GroupCommit::GroupCommit(JobStore& store) : store_(store), thread_([this] { Loop(); }) {}

GroupCommit::~GroupCommit() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void GroupCommit::Submit(Write write, Done done) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back({std::move(write), std::move(done)});
  }
  cv_.notify_one();
}

absl::Status GroupCommit::Run(Write write) {
  std::promise<absl::Status> result;
  std::future<absl::Status> status = result.get_future();
  Submit(std::move(write), [&result](absl::Status s) { result.set_value(std::move(s)); });
  return status.get();
}

size_t GroupCommit::queued() const {
  std::lock_guard<std::mutex> lock(mu_);
  return queue_.size();
}

uint64_t GroupCommit::commits() const {
  std::lock_guard<std::mutex> lock(mu_);
  return commits_;
}

void GroupCommit::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping, and everything queued is written
    std::vector<Pending> batch;
    batch.swap(queue_);
    lock.unlock();
    const absl::Status status = store_.Transaction([&]() -> absl::Status {
      for (Pending& p : batch) {
        if (absl::Status s = p.write(); !s.ok()) return s;
      }
      return absl::OkStatus();
    });
    for (Pending& p : batch) p.done(status);
    lock.lock();
    ++commits_;
  }
}

}  // namespace furnace::controller
