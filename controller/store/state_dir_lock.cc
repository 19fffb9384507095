#include "controller/store/state_dir_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace furnace::controller {

absl::StatusOr<StateDirLock> StateDirLock::Acquire(const std::string& state_dir) {
  const std::string path = (std::filesystem::path(state_dir) / "controller.lock").string();
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) {
    return absl::UnavailableError(absl::StrCat("cannot open ", path, ": ", std::strerror(errno)));
  }
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int error = errno;
    char text[32] = {};
    const ssize_t n = ::pread(fd, text, sizeof(text) - 1, 0);
    ::close(fd);
    if (error != EWOULDBLOCK) {
      return absl::UnavailableError(absl::StrCat("cannot lock ", path, ": ", std::strerror(error)));
    }
    int pid = 0;
    const bool known =
        n > 0 && absl::SimpleAtoi(absl::StripAsciiWhitespace(absl::string_view(text, n)), &pid);
    return absl::FailedPreconditionError(
        absl::StrCat("state dir ", state_dir, " is in use by another controller",
                     known ? absl::StrCat(" (pid ", pid, ")") : std::string(),
                     ": stop it first, or give this one another --state-dir"));
  }
  // The pid is for the message only: the lock holds without it.
  const std::string pid = absl::StrCat(::getpid(), "\n");
  [[maybe_unused]] const bool recorded =
      ::ftruncate(fd, 0) == 0 &&
      ::pwrite(fd, pid.data(), pid.size(), 0) == static_cast<ssize_t>(pid.size());
  return StateDirLock(fd);
}

StateDirLock& StateDirLock::operator=(StateDirLock&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = other.fd_;
    other.fd_ = -1;
  }
  return *this;
}

StateDirLock::~StateDirLock() {
  if (fd_ >= 0) ::close(fd_);
}

}  // namespace furnace::controller
