// The state directory's owner: one controller at a time. A second controller on the same
// directory (a leftover one, or two started by mistake) would apply its own view of the jobs to
// the same database and workers; it is refused at start instead, naming the one that holds it.
//
// An exclusive flock on <state_dir>/controller.lock, held for the object's life (the kernel drops
// it when the process ends, however it ends, so a crashed controller never leaves it held). The
// file records the holder's pid for the message.
#pragma once

#include <string>

#include "absl/status/statusor.h"

namespace furnace::controller {

class StateDirLock {
 public:
  // FailedPrecondition naming the holder's pid when another process holds it; Unavailable when
  // the lock file cannot be opened.
  static absl::StatusOr<StateDirLock> Acquire(const std::string& state_dir);

  StateDirLock(StateDirLock&& other) noexcept : fd_(other.fd_) { other.fd_ = -1; }
  StateDirLock& operator=(StateDirLock&& other) noexcept;
  StateDirLock(const StateDirLock&) = delete;
  StateDirLock& operator=(const StateDirLock&) = delete;
  ~StateDirLock();

 private:
  explicit StateDirLock(int fd) : fd_(fd) {}
  int fd_ = -1;
};

}  // namespace furnace::controller
