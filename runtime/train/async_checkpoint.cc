#include "runtime/train/async_checkpoint.h"

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "runtime/base/status.h"
#include "runtime/tensor/transfer.h"

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
  if (pinned_ != nullptr) device_->FreeHost(pinned_);
}

absl::Status AsyncCheckpointWriter::Start(const ShardState& state) {
  if (thread_.has_value()) {
    return absl::FailedPreconditionError(
        "async checkpoint: a snapshot is already in flight (Wait for it first)");
  }
  const bool discrete = device_ != nullptr && !device::HostAddressable(*device_);
  if (discrete) {
    if (stream_ == nullptr) {
      ASSIGN_OR_RETURN(stream_, device_->CreateStream());
    }
    if (produced_ == nullptr) {
      ASSIGN_OR_RETURN(produced_, device_->CreateEvent());
    }
    // The copy reads the arrays after what the caller's stream has enqueued (the update).
    RETURN_IF_ERROR(device_->RecordEvent(*produced_, tensor::StreamFor(*device_)));
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
    const absl::Status copied = CopyArrays(borrowed);
    {
      std::lock_guard<std::mutex> lock(mu_);
      copied_ = true;
    }
    copied_cv_.notify_all();
    LowerThisThreadsPriority();
    if (copied.ok()) {
      if (write_hook_) write_hook_(state_);
      CheckpointStore store(dir_, keep_);
      result_ = store.WriteShard(state_);
    } else {
      result_ = absl::Status(copied.code(), absl::StrCat("async checkpoint: copying the snapshot "
                                                         "from the device: ",
                                                         copied.message()));
    }
    thread_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    durable_.store(true);
  });
  return absl::OkStatus();
}

absl::Status AsyncCheckpointWriter::CopyArrays(const ShardState& borrowed) {
  const auto n = static_cast<size_t>(borrowed.n);
  const bool discrete = device_ != nullptr && !device::HostAddressable(*device_);
  // A size the host refused page-locked memory for is not asked again at every snapshot (a failed
  // cudaMallocHost of gigabytes takes seconds, on the path the next update waits for).
  if (discrete && pinned_floats_ < 3 * n && pinned_refused_floats_ != 3 * n) {
    if (pinned_ != nullptr) device_->FreeHost(pinned_);
    pinned_ = nullptr;
    pinned_floats_ = 0;
    absl::StatusOr<void*> pinned = device_->AllocateHost(3 * n * sizeof(float));
    if (pinned.ok()) {
      pinned_ = static_cast<float*>(*pinned);
      pinned_floats_ = 3 * n;
    } else {
      pinned_refused_floats_ = 3 * n;
    }
  }
  float* dst[3];
  if (discrete && pinned_ != nullptr && pinned_floats_ >= 3 * n) {
    dst[0] = pinned_, dst[1] = pinned_ + n, dst[2] = pinned_ + 2 * n;
    // The pageable fallback of an earlier snapshot is not needed any more.
    for (std::vector<float>* v : {&params_, &m_, &v_}) std::vector<float>().swap(*v);
  } else {
    // Host arrays; or no page-locked memory to be had: pageable, slower, still a snapshot.
    params_.resize(n);
    m_.resize(n);
    v_.resize(n);
    dst[0] = params_.data(), dst[1] = m_.data(), dst[2] = v_.data();
  }
  state_.params = dst[0];
  state_.m = dst[1];
  state_.v = dst[2];
  const float* src[3] = {borrowed.params, borrowed.m, borrowed.v};
  const size_t bytes = n * sizeof(float);
  if (!discrete) {
    for (int k = 0; k < 3; ++k) std::copy(src[k], src[k] + n, dst[k]);
    return absl::OkStatus();
  }
  RETURN_IF_ERROR(device_->WaitEvent(*stream_, *produced_));
  for (int k = 0; k < 3; ++k) {
    const absl::Status copy =
        device_->Copy(dst[k], src[k], bytes, device::CopyKind::kDeviceToHost, *stream_);
    if (!copy.ok()) {
      // The copies already enqueued still read the borrowed arrays and write the snapshot: the
      // update (released once this returns) and a later FreeHost must come after them.
      device_->SynchronizeStream(*stream_).IgnoreError();
      return copy;
    }
  }
  return device_->SynchronizeStream(*stream_);
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
