#include "runtime/base/file_sync.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <vector>

#include "absl/strings/str_cat.h"

namespace furnace {

absl::Status SyncDirectory(const std::string& dir) {
  const std::string d = dir.empty() ? "." : dir;
  const int fd = ::open(d.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0)
    return absl::InternalError(absl::StrCat("open directory ", d, ": ", std::strerror(errno)));
  const int rc = ::fsync(fd);
  const int error = errno;
  ::close(fd);
  if (rc != 0)
    return absl::InternalError(absl::StrCat("fsync directory ", d, ": ", std::strerror(error)));
  return absl::OkStatus();
}

absl::StatusOr<std::FILE*> CreateTempBeside(const std::string& path, std::string* tmp_path) {
  std::string name = path + ".tmp.XXXXXX";
  std::vector<char> buf(name.begin(), name.end());
  buf.push_back('\0');
  const int fd = ::mkstemp(buf.data());
  if (fd < 0) {
    return absl::InternalError(
        absl::StrCat("cannot create a temporary file beside ", path, ": ", std::strerror(errno)));
  }
  name.assign(buf.data());
  ::fchmod(fd, 0644);  // mkstemp's 0600 would hide the file from the daemons that read it
  std::FILE* file = ::fdopen(fd, "wb");
  if (file == nullptr) {
    const int error = errno;
    ::close(fd);
    ::unlink(name.c_str());
    return absl::InternalError(absl::StrCat("cannot open ", name, ": ", std::strerror(error)));
  }
  *tmp_path = std::move(name);
  return file;
}

absl::Status RenameDurably(const std::string& tmp_path, const std::string& path) {
  if (std::rename(tmp_path.c_str(), path.c_str()) != 0) {
    const int error = errno;
    std::remove(tmp_path.c_str());
    return absl::InternalError(
        absl::StrCat("rename ", tmp_path, " to ", path, ": ", std::strerror(error)));
  }
  return SyncDirectory(std::filesystem::path(path).parent_path().string());
}

}  // namespace furnace
