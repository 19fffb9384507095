#include "runtime/train/async_checkpoint.h"

#include <chrono>

namespace furnace::train {

AsyncCheckpointWriter::~AsyncCheckpointWriter() {
  if (thread_.has_value()) thread_->join();
}

absl::Status AsyncCheckpointWriter::Start(const ShardState& state) {
  if (thread_.has_value()) {
    return absl::FailedPreconditionError(
        "async checkpoint: a snapshot is already in flight (Wait for it first)");
  }
  const auto n = static_cast<size_t>(state.n);
  params_.assign(state.params, state.params + n);
  m_.assign(state.m, state.m + n);
  v_.assign(state.v, state.v + n);
  state_ = state;
  state_.params = params_.data();
  state_.m = m_.data();
  state_.v = v_.data();
  result_ = absl::UnknownError("async checkpoint: not written");
  thread_.emplace([this] {
    const auto t0 = std::chrono::steady_clock::now();
    if (write_hook_) write_hook_(state_);
    CheckpointStore store(dir_, keep_);
    result_ = store.WriteShard(state_);
    thread_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  });
  return absl::OkStatus();
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

}  // namespace furnace::train
