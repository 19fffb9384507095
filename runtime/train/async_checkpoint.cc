#include "runtime/train/async_checkpoint.h"

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <chrono>

namespace furnace::train {

namespace {

// The calling thread's nice value (Linux: per thread). Raising it needs no privilege; the
// training threads keep theirs.
void LowerThisThreadsPriority() {
  setpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)), 10);
}

}  // namespace

AsyncCheckpointWriter::~AsyncCheckpointWriter() {
  if (thread_.has_value()) thread_->join();
  if (commit_thread_.has_value()) commit_thread_->join();
}

absl::Status AsyncCheckpointWriter::Start(const ShardState& state) {
  if (thread_.has_value()) {
    return absl::FailedPreconditionError(
        "async checkpoint: a snapshot is already in flight (Wait for it first)");
  }
  state_ = state;
  {
    std::lock_guard<std::mutex> lock(mu_);
    copied_ = false;
  }
  durable_.store(false);
  result_ = absl::UnknownError("async checkpoint: not written");
  thread_.emplace([this, borrowed = state] {
    const auto t0 = std::chrono::steady_clock::now();
    if (copy_hook_) copy_hook_();
    const auto n = static_cast<size_t>(borrowed.n);
    params_.assign(borrowed.params, borrowed.params + n);
    m_.assign(borrowed.m, borrowed.m + n);
    v_.assign(borrowed.v, borrowed.v + n);
    state_.params = params_.data();
    state_.m = m_.data();
    state_.v = v_.data();
    {
      std::lock_guard<std::mutex> lock(mu_);
      copied_ = true;
    }
    copied_cv_.notify_all();
    LowerThisThreadsPriority();
    if (write_hook_) write_hook_(state_);
    CheckpointStore store(dir_, keep_);
    result_ = store.WriteShard(state_);
    thread_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    durable_.store(true);
  });
  return absl::OkStatus();
}

double AsyncCheckpointWriter::WaitCopied() {
  const auto t0 = std::chrono::steady_clock::now();
  std::unique_lock<std::mutex> lock(mu_);
  copied_cv_.wait(lock, [this] { return copied_; });
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

absl::StatusOr<ShardRecord> AsyncCheckpointWriter::Wait() {
  if (!thread_.has_value()) {
    return absl::FailedPreconditionError("async checkpoint: nothing in flight");
  }
  thread_->join();
  thread_.reset();
  write_seconds_ = thread_seconds_;
  return std::move(result_);
}

absl::Status AsyncCheckpointWriter::StartCommit(std::function<absl::Status()> commit) {
  if (commit_thread_.has_value()) {
    return absl::FailedPreconditionError(
        "async checkpoint: a commit is already open (WaitCommit for it first)");
  }
  commit_done_.store(false);
  commit_status_ = absl::UnknownError("async checkpoint: not committed");
  commit_thread_.emplace([this, commit = std::move(commit)] {
    LowerThisThreadsPriority();
    commit_status_ = commit();
    commit_done_.store(true);
  });
  return absl::OkStatus();
}

absl::Status AsyncCheckpointWriter::WaitCommit() {
  if (!commit_thread_.has_value()) {
    return absl::FailedPreconditionError("async checkpoint: no commit is open");
  }
  commit_thread_->join();
  commit_thread_.reset();
  return commit_status_;
}

}  // namespace furnace::train
