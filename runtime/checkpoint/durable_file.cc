#include "runtime/checkpoint/durable_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "runtime/base/status.h"
#include "runtime/checkpoint/crc32.h"

namespace furnace::train {
namespace {

absl::Status IoError(const std::string& what, const std::string& path) {
  return absl::InternalError(absl::StrCat(what, " ", path, ": ", std::strerror(errno)));
}

}  // namespace

DurableWriter::~DurableWriter() {
  if (file_ != nullptr) {
    std::fclose(file_);
    RemoveTemp(tmp_path_);
  }
}

absl::Status DurableWriter::Open() {
  ASSIGN_OR_RETURN(file_, CreateTempBeside(path_, &tmp_path_));
  return absl::OkStatus();
}

absl::Status DurableWriter::Append(const void* data, size_t n) {
  if (file_ == nullptr) return absl::FailedPreconditionError("DurableWriter is not open");
  if (n > 0 && std::fwrite(data, 1, n, file_) != n) return IoError("write to", tmp_path_);
  crc_ = Crc32(crc_, data, n);
  bytes_ += n;
  return absl::OkStatus();
}

absl::Status DurableWriter::Commit() {
  if (file_ == nullptr) return absl::FailedPreconditionError("DurableWriter is not open");
  // Each step named as what failed: a full disk usually shows at the flush (fwrite buffers).
  if (std::fflush(file_) != 0) return IoError("write (flush) to", tmp_path_);
  if (::fsync(::fileno(file_)) != 0) return IoError("fsync", tmp_path_);
  const int closed = std::fclose(file_);
  file_ = nullptr;
  if (closed != 0) {  // a network file system may report a failed write only here
    const absl::Status failed = IoError("close", tmp_path_);
    RemoveTemp(tmp_path_);
    return failed;
  }
  return RenameDurably(tmp_path_, path_);
}

absl::Status WriteFileDurably(const std::string& path, absl::string_view contents) {
  return WriteFileAtomically(path, contents);
}

absl::Status ReadFileToString(const std::string& path, std::string* out) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) {
    if (errno == ENOENT) return absl::NotFoundError(absl::StrCat(path, ": no such file"));
    return IoError("cannot open", path);
  }
  out->clear();
  char buf[1 << 16];
  size_t got;
  while ((got = std::fread(buf, 1, sizeof(buf), f)) > 0) out->append(buf, got);
  const bool failed = std::ferror(f) != 0;
  std::fclose(f);
  if (failed) return IoError("read", path);
  return absl::OkStatus();
}

}  // namespace furnace::train
