// Asynchronous checkpoint writes (checkpoint.async). At a checkpoint step a rank copies its shard
// state into host memory owned here (Start: the only part that holds the step) and a background
// thread writes and fsyncs the shard with CheckpointStore::WriteShard while training continues.
// Committing (records exchanged, manifest, then LATEST) is not done here: the trainer does it at a
// deterministic point on every rank after Wait has said this rank's shard is durable, so LATEST
// never names a step whose shards are not all on disk.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/checkpoint/checkpoint.h"

namespace furnace::train {

// Owns one snapshot at a time and the thread writing it. Not thread-safe: one caller (the
// training loop); the hook runs on the background thread.
class AsyncCheckpointWriter {
 public:
  AsyncCheckpointWriter(std::string dir, int keep) : dir_(std::move(dir)), keep_(keep) {}
  ~AsyncCheckpointWriter();  // waits for an in-flight write (its result is dropped)
  AsyncCheckpointWriter(const AsyncCheckpointWriter&) = delete;
  AsyncCheckpointWriter& operator=(const AsyncCheckpointWriter&) = delete;

  // Copies `state` (its arrays included) and starts writing it. FailedPrecondition while another
  // snapshot is in flight: the caller Waits first, so two are never in flight.
  absl::Status Start(const ShardState& state);
  bool in_flight() const { return thread_.has_value(); }
  // Blocks until the in-flight write is durable; its record or the write's error (disk full, an
  // unwritable directory). FailedPrecondition when nothing is in flight.
  absl::StatusOr<ShardRecord> Wait();

  // The snapshot last started; its arrays point into this writer's buffers, valid until the
  // next Start.
  const ShardState& state() const { return state_; }
  // Seconds the last finished write took on the background thread (WriteShard, fsyncs included).
  double write_seconds() const { return write_seconds_; }

  // Tests: runs on the background thread before each write (e.g. to make it slow).
  void SetWriteHookForTest(std::function<void(const ShardState&)> hook) {
    write_hook_ = std::move(hook);
  }

 private:
  std::string dir_;
  int keep_;
  ShardState state_;
  std::vector<float> params_, m_, v_;  // (n) each: the snapshot's arrays
  std::optional<std::thread> thread_;
  absl::StatusOr<ShardRecord> result_;  // written by the thread, read after join
  double write_seconds_ = 0;
  double thread_seconds_ = 0;  // written by the thread, read after join
  std::function<void(const ShardState&)> write_hook_;
};

}  // namespace furnace::train
