#include "runtime/base/file_error.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace furnace {
namespace {

// "<what> <path>", or "<path>" when `what` is empty.
std::string Named(const std::string& what, const std::string& path) {
  return what.empty() ? path : absl::StrCat(what, " ", path);
}

}  // namespace

absl::Status UnreadableFileError(absl::string_view failure) {
  return absl::UnavailableError(absl::StrCat(failure, " (not damage: a restart reads it again)"));
}

absl::Status UnreadableFileError(absl::string_view what, int error) {
  return UnreadableFileError(absl::StrCat(what, ": cannot read: ", std::strerror(error)));
}

absl::Status CannotOpenError(const std::string& what, const std::string& path, int error) {
  const std::string failure =
      absl::StrCat(Named(what, path), ": cannot open: ", std::strerror(error));
  if (error == ENOENT || error == ENOTDIR || error == ENAMETOOLONG || error == ELOOP) {
    return absl::NotFoundError(failure);
  }
  return UnreadableFileError(failure);
}

absl::StatusOr<int64_t> RegularFileSize(int fd, const std::string& what, const std::string& path) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    return UnreadableFileError(absl::StrCat(Named(what, path), ": fstat: ", std::strerror(errno)));
  }
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat(Named(what, path), ": not a regular file (a directory, a device or a pipe)"));
  }
  return static_cast<int64_t>(st.st_size);
}

absl::StatusOr<int> OpenRegularFile(const std::string& what, const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return CannotOpenError(what, path, errno);
  const absl::StatusOr<int64_t> size = RegularFileSize(fd, what, path);
  if (!size.ok()) {
    ::close(fd);
    return size.status();
  }
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags >= 0) ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  return fd;
}

}  // namespace furnace
