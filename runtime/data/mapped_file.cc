#include "runtime/data/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "runtime/base/file_error.h"

namespace furnace::data {

std::string ErrnoText() { return std::strerror(errno); }

absl::StatusOr<std::unique_ptr<MappedFile>> MappedFile::Open(const std::string& path,
                                                             const std::string& what,
                                                             FileAccess access) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return CannotOpenError(what, path, errno);
  const absl::StatusOr<int64_t> size = RegularFileSize(fd, what, path);
  if (!size.ok()) {
    ::close(fd);
    return size.status();
  }
  std::unique_ptr<MappedFile> file(new MappedFile());
  if (*size == 0) {
    ::close(fd);
    return file;
  }
  void* map = ::mmap(nullptr, static_cast<size_t>(*size), PROT_READ, MAP_PRIVATE, fd, 0);
  const std::string map_err = map == MAP_FAILED ? ErrnoText() : "";
  ::close(fd);
  if (map == MAP_FAILED) {
    return UnreadableFileError(absl::StrCat(what, " ", path, ": mmap: ", map_err));
  }
  file->data_ = static_cast<const unsigned char*>(map);
  file->bytes_ = static_cast<size_t>(*size);
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
