#include "worker/telemetry_pipe.h"

#include <errno.h>
#include <fcntl.h>
#include <unistd.h>

#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"
#include "runtime/base/utf8.h"

namespace furnace::worker {
namespace {

void AppendVarint(uint64_t value, std::string* out) {
  while (value >= 0x80) {
    out->push_back(static_cast<char>((value & 0x7f) | 0x80));
    value >>= 7;
  }
  out->push_back(static_cast<char>(value));
}

// Makes every string field of `m` (nested and repeated ones too) valid UTF-8, each invalid byte a
// '?'; true when it changed one. Protobuf refuses to parse a string field that is not valid
// UTF-8: one such byte in a rank's message (a file name in an error, say) made the agent's decoder
// give up on every later record of the rank, and then call it hung.
bool MakeStringsUtf8(google::protobuf::Message& m) {
  using google::protobuf::FieldDescriptor;
  constexpr size_t kWhole = std::numeric_limits<size_t>::max();
  const google::protobuf::Descriptor* d = m.GetDescriptor();
  const google::protobuf::Reflection* r = m.GetReflection();
  bool changed = false;
  for (int i = 0; i < d->field_count(); ++i) {
    const FieldDescriptor* f = d->field(i);
    if (f->type() == FieldDescriptor::TYPE_STRING) {
      const int n = f->is_repeated() ? r->FieldSize(m, f) : 1;
      for (int j = 0; j < n; ++j) {
        const std::string s = f->is_repeated() ? r->GetRepeatedString(m, f, j) : r->GetString(m, f);
        if (!FirstInvalidUtf8(s)) continue;
        if (f->is_repeated()) {
          r->SetRepeatedString(&m, f, j, SanitizeUtf8(s, kWhole));
        } else {
          r->SetString(&m, f, SanitizeUtf8(s, kWhole));
        }
        changed = true;
      }
    } else if (f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
      if (f->is_repeated()) {
        for (int j = 0; j < r->FieldSize(m, f); ++j) {
          changed |= MakeStringsUtf8(*r->MutableRepeatedMessage(&m, f, j));
        }
      } else if (r->HasField(m, f)) {
        changed |= MakeStringsUtf8(*r->MutableMessage(&m, f));
      }
    }
  }
  return changed;
}

// True when a string field of `m` (nested and repeated ones too) is not valid UTF-8: the check
// that keeps the common record from being copied.
bool HasInvalidUtf8(const google::protobuf::Message& m) {
  using google::protobuf::FieldDescriptor;
  const google::protobuf::Descriptor* d = m.GetDescriptor();
  const google::protobuf::Reflection* r = m.GetReflection();
  for (int i = 0; i < d->field_count(); ++i) {
    const FieldDescriptor* f = d->field(i);
    const int n = f->is_repeated() ? r->FieldSize(m, f) : 1;
    if (f->type() == FieldDescriptor::TYPE_STRING) {
      for (int j = 0; j < n; ++j) {
        const std::string s = f->is_repeated() ? r->GetRepeatedString(m, f, j) : r->GetString(m, f);
        if (FirstInvalidUtf8(s)) return true;
      }
    } else if (f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
      for (int j = 0; j < n; ++j) {
        if (!f->is_repeated() && !r->HasField(m, f)) break;
        if (HasInvalidUtf8(f->is_repeated() ? r->GetRepeatedMessage(m, f, j)
                                            : r->GetMessage(m, f))) {
          return true;
        }
      }
    }
  }
  return false;
}

}  // namespace

void AppendFramedRecord(const furnace::v1::TelemetryRecord& record, std::string* out) {
  std::string body;
  if (HasInvalidUtf8(record)) {
    furnace::v1::TelemetryRecord valid = record;
    MakeStringsUtf8(valid);
    body = valid.SerializeAsString();
  } else {
    body = record.SerializeAsString();
  }
  AppendVarint(body.size(), out);
  out->append(body);
}

std::string FrameRecord(const furnace::v1::TelemetryRecord& record) {
  std::string out;
  AppendFramedRecord(record, &out);
  return out;
}

void TelemetryDecoder::Feed(std::string_view bytes) {
  if (!error_.ok()) return;
  // Compact once the consumed prefix dominates, so the buffer does not grow without bound.
  if (consumed_ > 0 && consumed_ >= buffer_.size() / 2) {
    buffer_.erase(0, consumed_);
    consumed_ = 0;
  }
  buffer_.append(bytes.data(), bytes.size());
}

absl::StatusOr<bool> TelemetryDecoder::Next(furnace::v1::TelemetryRecord* record) {
  if (!error_.ok()) return error_;
  uint64_t length = 0;
  size_t pos = consumed_;
  int shift = 0;
  while (true) {
    if (pos >= buffer_.size()) return false;  // the varint itself is incomplete
    const auto byte = static_cast<uint8_t>(buffer_[pos++]);
    length |= static_cast<uint64_t>(byte & 0x7f) << shift;
    if ((byte & 0x80) == 0) break;
    shift += 7;
    if (shift > 35) {
      error_ = absl::DataLossError("telemetry pipe: malformed length varint");
      return error_;
    }
  }
  if (length > kMaxTelemetryRecordBytes) {
    error_ = absl::DataLossError(
        absl::StrCat("telemetry pipe: record of ", length, " bytes exceeds the limit"));
    return error_;
  }
  if (buffer_.size() - pos < length) return false;
  if (!record->ParseFromArray(buffer_.data() + pos, static_cast<int>(length))) {
    error_ = absl::DataLossError("telemetry pipe: record does not parse as TelemetryRecord");
    return error_;
  }
  consumed_ = pos + length;
  if (consumed_ == buffer_.size()) {
    buffer_.clear();
    consumed_ = 0;
  }
  return true;
}

TelemetryWriter::TelemetryWriter(int fd) : fd_(fcntl(fd, F_GETFD) == -1 ? -1 : fd) {}

absl::Status TelemetryWriter::Write(const furnace::v1::TelemetryRecord& record) {
  if (fd_ < 0) return absl::OkStatus();
  const std::string framed = FrameRecord(record);
  size_t written = 0;
  while (written < framed.size()) {
    const ssize_t n = ::write(fd_, framed.data() + written, framed.size() - written);
    if (n < 0) {
      if (errno == EINTR) continue;
      return absl::UnavailableError(
          absl::StrCat("telemetry pipe write failed: ", std::strerror(errno)));
    }
    written += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

}  // namespace furnace::worker
