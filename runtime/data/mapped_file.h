// A whole file memory-mapped read-only, and little-endian loads from it: what the token-file and
// indexed-dataset readers share.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace furnace::data {

// How a mapping will be read: the kernel's read-ahead follows it.
enum class FileAccess {
  kSequential,  // read through once, in order (an index)
  // Read in small pieces at random places (training windows): no read-ahead, so a window of a
  // few KB reads a few KB from the disk, not the device's read-ahead (MBs) around each fault, and
  // a dataset larger than memory is not read many times over.
  kRandom,
};

// Owns the mapping (unmapped on destruction). Immutable: safe to read from any thread.
class MappedFile {
 public:
  // `what` names the kind of file in errors ("token file", "indexed dataset index"). NotFound
  // when it is not there; InvalidArgument when it is no regular file; Unavailable when it is but
  // cannot be opened or mapped now (runtime/base/file_error.h). An empty file maps to size 0 and
  // data nullptr.
  static absl::StatusOr<std::unique_ptr<MappedFile>> Open(const std::string& path,
                                                          const std::string& what,
                                                          FileAccess access);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const unsigned char* data() const { return data_; }
  int64_t size() const { return static_cast<int64_t>(bytes_); }
  // How the mapping is read from now on (an index read through once, then looked up at random).
  void Advise(FileAccess access) const;
  // Starts reading the pages of [offset, offset + bytes) in the background (MADV_WILLNEED), so
  // reads of many scattered places wait for the disk once, together, not one after another.
  void WillNeed(int64_t offset, int64_t bytes) const;

 private:
  MappedFile() = default;
  const unsigned char* data_ = nullptr;
  size_t bytes_ = 0;
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
