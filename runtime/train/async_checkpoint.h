// Asynchronous checkpoints (checkpoint.async). At a checkpoint step Start hands this writer the
// rank's shard state; a background thread first copies its arrays into host memory owned here,
// then writes and fsyncs the shard with CheckpointStore::WriteShard, while training continues.
// On a discrete device (the arrays are the device's memory) the copy is a device-to-host copy on
// the writer's own stream, after an event Start records on the caller's (compute) stream, so it
// reads the parameters and moments the optimizer has enqueued so far and nothing later.
// The copy overlaps the next step's forward and backward, which only read the parameters: the
// trainer calls WaitCopied before the next optimizer update changes them (CheckFreq's pipelined
// snapshot), so a checkpoint holds the step only when the copy is slower than a forward and
// backward pass. The copy runs at the caller's priority; the checksum, write and fsync then run at
// a lower one (nice +10), so on cores shared with training they take what training leaves.
// When to commit (records exchanged, manifest, then LATEST) is decided by the trainer at a
// deterministic point on every rank once every rank's shard is durable, so LATEST never names a
// step whose shards are not all on disk; the commit's own file work (rank 0's manifest, LATEST
// and pruning, each fsynced) then runs here too, in the background (StartCommit).
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/checkpoint/checkpoint.h"
#include "runtime/device/device.h"

namespace furnace::train {

// Owns one snapshot at a time and the thread writing it. Not thread-safe: one caller (the
// training loop); the hook runs on the background thread.
class AsyncCheckpointWriter {
 public:
  // `device`: whose memory the arrays of the states given to Start are (nullptr or a device the
  // host can address: host arrays); it must outlive the writer.
  AsyncCheckpointWriter(std::string dir, int keep, device::Device* device = nullptr)
      : dir_(std::move(dir)), keep_(keep), device_(device) {}
  ~AsyncCheckpointWriter();  // waits for an in-flight write and commit (results dropped)
  AsyncCheckpointWriter(const AsyncCheckpointWriter&) = delete;
  AsyncCheckpointWriter& operator=(const AsyncCheckpointWriter&) = delete;

  // Starts copying `state` and then writing it. The arrays stay borrowed until WaitCopied
  // returns: the caller must not change them before (on a device: must not enqueue work that
  // changes them before WaitCopied returns). FailedPrecondition while another snapshot is in
  // flight: the caller Waits first, so two are never in flight; the device's error for the event.
  absl::Status Start(const ShardState& state);
  bool in_flight() const { return thread_.has_value(); }
  // Blocks until the in-flight snapshot's arrays are copied (at once when nothing is in flight);
  // returns the seconds it blocked.
  double WaitCopied();
  // The in-flight write has finished (Wait will not block). Thread-safe.
  bool durable() const { return durable_.load(); }
  // Blocks until the in-flight write is durable; its record or the write's error (disk full, an
  // unwritable directory). FailedPrecondition when nothing is in flight.
  absl::StatusOr<ShardRecord> Wait();

  // Runs `commit` on a background thread (the writer's last Wait must have returned; one commit
  // at a time: FailedPrecondition while one is open).
  absl::Status StartCommit(std::function<absl::Status()> commit);
  // A commit was started and WaitCommit has not been called since.
  bool commit_open() const { return commit_thread_.has_value(); }
  // The open commit has finished (WaitCommit will not block). Thread-safe.
  bool commit_finished() const { return commit_done_.load(); }
  // The open commit has finished and failed (its status is WaitCommit's). Thread-safe.
  bool commit_failed() const { return commit_done_.load() && !commit_status_.ok(); }
  // Blocks until the open commit has finished; its status. FailedPrecondition when none is open.
  absl::Status WaitCommit();

  // The snapshot last started (read it after Wait); its arrays point into this writer's
  // buffers, valid until the next Start.
  const ShardState& state() const { return state_; }
  // Seconds the last finished write took on the background thread (WriteShard, fsyncs included).
  double write_seconds() const { return write_seconds_; }

  // Tests: runs on the background thread before each write (e.g. to make it slow).
  void SetWriteHookForTest(std::function<void(const ShardState&)> hook) {
    write_hook_ = std::move(hook);
  }
  // Tests: runs on the background thread before each copy (e.g. to make it slower than a step).
  void SetCopyHookForTest(std::function<void()> hook) { copy_hook_ = std::move(hook); }

 private:
  // The background copy of the borrowed arrays into memory owned here (pinned_ on a discrete
  // device, else params_, m_, v_), which state_'s arrays then point at.
  absl::Status CopyArrays(const ShardState& borrowed);

  std::string dir_;
  int keep_;
  device::Device* device_;                   // nullptr: host arrays
  std::unique_ptr<device::Stream> stream_;   // the copy's stream (discrete devices)
  std::unique_ptr<device::Event> produced_;  // recorded by Start on the caller's stream
  ShardState state_;
  std::vector<float> params_, m_, v_;  // (n) each: the snapshot's arrays (host arrays)
  // Discrete devices: page-locked (3n: params, m, v), kept across snapshots. A device-to-host copy
  // into pageable memory goes through the driver's staging at a fraction of the bus's speed, and
  // the next optimizer update waits for it (WaitCopied).
  float* pinned_ = nullptr;
  size_t pinned_floats_ = 0;
  size_t pinned_refused_floats_ = 0;  // a size AllocateHost refused: the pageable arrays serve it
  std::optional<std::thread> thread_;
  std::mutex mu_;
  std::condition_variable copied_cv_;
  bool copied_ = true;  // guarded by mu_: the borrowed arrays are no longer read
  std::atomic<bool> durable_{false};
  absl::StatusOr<ShardRecord> result_;  // written by the thread, read after join
  double write_seconds_ = 0;
  double thread_seconds_ = 0;  // written by the thread, read after join
  std::function<void(const ShardState&)> write_hook_;
  std::function<void()> copy_hook_;
  std::optional<std::thread> commit_thread_;
  std::atomic<bool> commit_done_{false};
  absl::Status commit_status_;  // written by the commit thread, read after join
};

}  // namespace furnace::train
