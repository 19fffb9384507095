// The telemetry pipe between a rank process and its agent: a byte stream of length-delimited
// furnace.v1.TelemetryRecord messages (a base-128 varint length, then that many bytes), the same
// framing protobuf's writeDelimitedTo uses.
//
// The rank writes with TelemetryWriter (fd 3 by convention); the agent's supervisor thread reads
// whatever chunks the pipe hands it and feeds them to a TelemetryDecoder, which reassembles records
// across partial reads.
//
// Thread-safety: none of these classes is thread-safe; each has one owner thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "furnace/v1/telemetry.pb.h"

namespace furnace::worker {

// The file descriptor a rank process inherits its telemetry pipe on.
inline constexpr int kTelemetryFd = 3;

// A record larger than this is a framing error (the stream is garbage, not telemetry).
inline constexpr uint64_t kMaxTelemetryRecordBytes = 16u << 20;

// Appends the framed record to `out`.
void AppendFramedRecord(const furnace::v1::TelemetryRecord& record, std::string* out);
std::string FrameRecord(const furnace::v1::TelemetryRecord& record);

// Reassembles records from arbitrary chunks of the stream.
class TelemetryDecoder {
 public:
  void Feed(std::string_view bytes);
  // Returns true and fills `record` when a whole record is buffered, false when more bytes are
  // needed. DataLoss when the stream is corrupt (bad varint, oversize length, unparsable bytes);
  // after that the decoder stays failed.
  absl::StatusOr<bool> Next(furnace::v1::TelemetryRecord* record);
  // Bytes buffered that do not yet form a whole record.
  size_t pending_bytes() const { return buffer_.size() - consumed_; }

 private:
  std::string buffer_;
  size_t consumed_ = 0;
  absl::Status error_;
};

// Writes framed records to a file descriptor (blocking writes; EINTR retried). If the descriptor
// is not open (a rank run by hand), records are silently discarded.
class TelemetryWriter {
 public:
  explicit TelemetryWriter(int fd = kTelemetryFd);
  // Unavailable when the pipe is closed (the agent went away) or a write fails.
  absl::Status Write(const furnace::v1::TelemetryRecord& record);
  bool connected() const { return fd_ >= 0; }

 private:
  int fd_;
};

}  // namespace furnace::worker
