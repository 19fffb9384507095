// A data file opened read-only and read with pread, and little-endian loads from a buffer: what
// the token-file and indexed-dataset readers share.
//
// Read, not memory-mapped: a mapped page that cannot be read (the file cut short or rewritten in
// place since it was opened, an EIO from a network file system) is a SIGBUS that kills the rank
// with no word of which file; a read is an error the step reports, naming the file and the place.
// The page cache serves a read as it served a mapping, and a training window is a few KB, so the
// copy costs microseconds (bench/data/REPORT.md).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace furnace::data {

// How a file will be read: the kernel's read-ahead follows it.
enum class FileAccess {
  kSequential,  // read through once, in order (an index)
  // Read in small pieces at random places (training windows): no read-ahead, so a window of a
  // few KB reads a few KB from the disk, not the device's read-ahead (MBs) around each one, and
  // a dataset larger than memory is not read many times over.
  kRandom,
};

// Owns an open descriptor (closed on destruction). Immutable: safe to read from any thread.
class DataFile {
 public:
  // `what` names the kind of file in errors ("token file", "indexed dataset index"). NotFound
  // when it is not there; InvalidArgument when it is no regular file; Unavailable when it is but
  // cannot be opened now (runtime/base/file_error.h).
  static absl::StatusOr<std::unique_ptr<DataFile>> Open(const std::string& path,
                                                        const std::string& what, FileAccess access);
  ~DataFile();
  DataFile(const DataFile&) = delete;
  DataFile& operator=(const DataFile&) = delete;

  const std::string& path() const { return path_; }
  int64_t size() const { return size_; }  // bytes, when it was opened
  // out[0..bytes) = the file's bytes [offset, offset + bytes), a range inside [0, size()).
  // Unavailable naming the file and the byte offset when they cannot be read: an I/O error, or
  // the file now ends before them (cut short or rewritten since it was opened: a restart opens
  // it again and judges what it finds). InvalidArgument for a range outside [0, size()).
  absl::Status ReadAt(int64_t offset, int64_t bytes, unsigned char* out) const;
  // How the file is read from now on (an index read through once, then looked up at random).
  void Advise(FileAccess access) const;
  // Starts reading [offset, offset + bytes) into the page cache in the background, so reads of
  // many scattered places wait for the disk once, together, not one after another.
  void WillNeed(int64_t offset, int64_t bytes) const;

 private:
  DataFile() = default;
  std::string path_;
  std::string what_;
  int fd_ = -1;
  int64_t size_ = 0;
};

inline uint32_t LoadU32(const unsigned char* p) {
  return uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 | uint32_t{p[3]} << 24;
}
inline uint64_t LoadU64(const unsigned char* p) {
  return LoadU32(p) | uint64_t{LoadU32(p + 4)} << 32;
}

// strerror(errno) as a string.
std::string ErrnoText();

}  // namespace furnace::data
