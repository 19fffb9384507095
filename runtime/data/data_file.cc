#include "runtime/data/data_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "runtime/base/file_error.h"

namespace furnace::data {

std::string ErrnoText() { return std::strerror(errno); }

absl::StatusOr<std::unique_ptr<DataFile>> DataFile::Open(const std::string& path,
                                                         const std::string& what,
                                                         FileAccess access) {
  const absl::StatusOr<int> fd = OpenRegularFile(what, path);
  if (!fd.ok()) return fd.status();
  std::unique_ptr<DataFile> file(new DataFile());
  file->fd_ = *fd;  // closed by the destructor from here on
  file->path_ = path;
  file->what_ = what;
  const absl::StatusOr<int64_t> size = RegularFileSize(*fd, what, path);
  if (!size.ok()) return size.status();
  file->size_ = *size;
  file->Advise(access);
  return file;
}

absl::Status DataFile::ReadAt(int64_t offset, int64_t bytes, unsigned char* out) const {
  if (offset < 0 || bytes < 0 || offset > size_ || bytes > size_ - offset) {
    return absl::InvalidArgumentError(absl::StrCat(what_, " ", path_, ": read of ", bytes,
                                                   " bytes at byte offset ", offset,
                                                   " is outside its ", size_, " bytes"));
  }
  int64_t done = 0;
  while (done < bytes) {
    const ssize_t got = ::pread(fd_, out + done, static_cast<size_t>(bytes - done),
                                static_cast<off_t>(offset + done));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) {
      return UnreadableFileError(
          absl::StrCat(what_, " ", path_, ": read at byte offset ", offset + done), errno);
    }
    if (got == 0) {
      struct stat st {};
      const std::string now = ::fstat(fd_, &st) == 0 ? absl::StrCat(st.st_size) : "fewer";
      return UnreadableFileError(
          absl::StrCat(what_, " ", path_, ": cannot read ", bytes, " bytes at byte offset ", offset,
                       ": the file has ", now, " bytes now and had ", size_,
                       " when opened, so it was cut short or rewritten in place since"));
    }
    done += got;
  }
  return absl::OkStatus();
}

void DataFile::Advise(FileAccess access) const {
  // Advice only: a kernel that ignores it reads ahead as it would have.
  ::posix_fadvise(fd_, 0, 0,
                  access == FileAccess::kRandom ? POSIX_FADV_RANDOM : POSIX_FADV_SEQUENTIAL);
}

void DataFile::WillNeed(int64_t offset, int64_t bytes) const {
  if (offset < 0 || bytes <= 0 || offset >= size_) return;
  ::posix_fadvise(fd_, static_cast<off_t>(offset), static_cast<off_t>(bytes), POSIX_FADV_WILLNEED);
}

DataFile::~DataFile() {
  if (fd_ >= 0) ::close(fd_);
}

}  // namespace furnace::data
