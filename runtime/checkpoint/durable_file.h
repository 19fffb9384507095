// Durable, atomic file writes for checkpoints, exports and reports: a file is written under a
// temporary file of its own beside `path` (runtime/base/file_sync.h), fsynced, renamed over `path`,
// and its directory fsynced, so after a crash `path` holds either the old content or the complete
// new one, never a torn mix, and two writers of one path never share a temporary file.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "runtime/base/file_sync.h"  // SyncDirectory

namespace furnace::train {

// Streams bytes to a temporary file beside `path` while computing their CRC-32. Commit makes them
// durable under `path`; destroying an uncommitted writer removes the temp file. Single-threaded.
class DurableWriter {
 public:
  explicit DurableWriter(std::string path) : path_(std::move(path)) {}
  ~DurableWriter();
  DurableWriter(const DurableWriter&) = delete;
  DurableWriter& operator=(const DurableWriter&) = delete;

  absl::Status Open();
  absl::Status Append(const void* data, size_t n);
  absl::Status Commit();  // fsync, rename, fsync the directory
  uint64_t bytes() const { return bytes_; }
  uint32_t crc32() const { return crc_; }

 private:
  std::string path_;
  std::string tmp_path_;  // once open
  std::FILE* file_ = nullptr;
  uint64_t bytes_ = 0;
  uint32_t crc_ = 0;
};

// Writes `contents` to `path` durably and atomically.
absl::Status WriteFileDurably(const std::string& path, absl::string_view contents);
// The whole file, or NotFound / an I/O error naming the path.
absl::Status ReadFileToString(const std::string& path, std::string* out);

}  // namespace furnace::train
