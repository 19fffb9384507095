#include "controller/store/group_commit.h"

namespace furnace::controller {

absl::Status GroupCommit::Run(const std::function<absl::Status()>& write) {
  Pending mine{&write, absl::OkStatus(), false};
  std::unique_lock<std::mutex> lock(mu_);
  waiting_.push_back(&mine);
  while (!mine.done) {
    if (committing_) {
      cv_.wait(lock);
      continue;
    }
    // Write everything waiting (this call among them) in one transaction.
    committing_ = true;
    std::vector<Pending*> batch;
    batch.swap(waiting_);
    lock.unlock();
    const absl::Status status = store_.Transaction([&]() -> absl::Status {
      for (Pending* p : batch) {
        if (absl::Status s = (*p->write)(); !s.ok()) return s;
      }
      return absl::OkStatus();
    });
    lock.lock();
    for (Pending* p : batch) {
      p->status = status;
      p->done = true;
    }
    committing_ = false;
    cv_.notify_all();
  }
  return mine.status;
}

}  // namespace furnace::controller
