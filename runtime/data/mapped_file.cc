#include "runtime/data/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace furnace::data {

std::string ErrnoText() { return std::strerror(errno); }

absl::Status CannotOpenError(const std::string& what, const std::string& path, int error) {
  const std::string failure =
      absl::StrCat(what, what.empty() ? "" : " ", path, ": cannot open: ", std::strerror(error));
  if (error == ENOENT || error == ENOTDIR || error == ENAMETOOLONG || error == ELOOP) {
    return absl::NotFoundError(failure);
  }
  return UnreadableFileError(failure);
}

absl::Status CheckRegularFile(int fd, const std::string& what, const std::string& path) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    return UnreadableFileError(
        absl::StrCat(what, what.empty() ? "" : " ", path, ": fstat: ", std::strerror(errno)));
  }
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(what, what.empty() ? "" : " ", path,
                                                   ": not a regular file (a directory, a device "
                                                   "or a pipe)"));
  }
  return absl::OkStatus();
}

absl::Status UnreadableFileError(absl::string_view failure) {
  return absl::UnavailableError(
      absl::StrCat(failure, " (not the data's fault: a restart reads it again)"));
}

absl::StatusOr<std::unique_ptr<MappedFile>> MappedFile::Open(const std::string& path,
                                                             const std::string& what,
                                                             FileAccess access) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return CannotOpenError(what, path, errno);
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    std::string err = ErrnoText();
    ::close(fd);
    return UnreadableFileError(absl::StrCat(what, " ", path, ": fstat: ", err));
  }
  if (absl::Status regular = CheckRegularFile(fd, what, path); !regular.ok()) {
    ::close(fd);
    return regular;
  }
  std::unique_ptr<MappedFile> file(new MappedFile());
  if (st.st_size == 0) {
    ::close(fd);
    return file;
  }
  void* map = ::mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ, MAP_PRIVATE, fd, 0);
  const std::string map_err = map == MAP_FAILED ? ErrnoText() : "";
  ::close(fd);
  if (map == MAP_FAILED) {
    return UnreadableFileError(absl::StrCat(what, " ", path, ": mmap: ", map_err));
  }
  file->data_ = static_cast<const unsigned char*>(map);
  file->bytes_ = static_cast<size_t>(st.st_size);
  file->Advise(access);
  return file;
}

void MappedFile::Advise(FileAccess access) const {
  // Advice only: a kernel that ignores it reads ahead as it would have.
  if (data_ == nullptr) return;
  ::madvise(const_cast<unsigned char*>(data_), bytes_,
            access == FileAccess::kRandom ? MADV_RANDOM : MADV_SEQUENTIAL);
}

void MappedFile::WillNeed(int64_t offset, int64_t bytes) const {
  if (data_ == nullptr || offset < 0 || bytes <= 0 || offset >= size()) return;
  const int64_t page = ::sysconf(_SC_PAGESIZE);
  const int64_t begin = offset / page * page;
  const int64_t end = std::min(offset + bytes, size());
  ::madvise(const_cast<unsigned char*>(data_) + begin, static_cast<size_t>(end - begin),
            MADV_WILLNEED);
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) ::munmap(const_cast<unsigned char*>(data_), bytes_);
}

}  // namespace furnace::data
