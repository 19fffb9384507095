#include "runtime/data/token_file.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "runtime/base/file_sync.h"
#include "runtime/base/status.h"
#include "runtime/data/tokenizer.h"

namespace furnace::data {
namespace {

void StoreU32(unsigned char* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<unsigned char>(v >> (8 * i));
}
void StoreU64(unsigned char* p, uint64_t v) {
  StoreU32(p, static_cast<uint32_t>(v));
  StoreU32(p + 4, static_cast<uint32_t>(v >> 32));
}

}  // namespace

absl::StatusOr<std::unique_ptr<TokenFile>> TokenFile::Open(const std::string& path,
                                                           int64_t expected_vocab) {
  ASSIGN_OR_RETURN(std::unique_ptr<DataFile> data,
                   DataFile::Open(path, "token file", FileAccess::kRandom));
  const int64_t file_bytes = data->size();
  if (file_bytes < kTokenFileHeaderBytes) {
    return absl::DataLossError(absl::StrCat("token file ", path, ": truncated: ", file_bytes,
                                            " bytes, shorter than the ", kTokenFileHeaderBytes,
                                            "-byte header"));
  }
  // The longest header there is, or the whole file when it is shorter.
  unsigned char bytes[kTokenFileHeaderBytes + 4 + kMaxTokenizerIdentityBytes];
  RETURN_IF_ERROR(data->ReadAt(0, std::min<int64_t>(file_bytes, sizeof bytes), bytes));
  std::unique_ptr<TokenFile> file(new TokenFile());
  file->path_ = path;
  file->data_ = std::move(data);

  if (std::memcmp(bytes, kTokenFileMagic, 8) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "token file ", path, ": bad magic (expected \"FURNTOK1\"): not a Furnace token file"));
  }
  const uint32_t version = LoadU32(bytes + 8);
  if (version != 1 && version != 2) {
    return absl::InvalidArgumentError(absl::StrCat("token file ", path, ": unsupported version ",
                                                   version, " (this build reads versions 1 and ",
                                                   kTokenFileVersion, ")"));
  }
  int64_t header_bytes = kTokenFileHeaderBytes;
  if (version == 2) {
    if (file_bytes < kTokenFileHeaderBytes + 4) {
      return absl::DataLossError(absl::StrCat("token file ", path, ": truncated: ", file_bytes,
                                              " bytes, shorter than the ",
                                              kTokenFileHeaderBytes + 4, "-byte version 2 header"));
    }
    const uint32_t n = LoadU32(bytes + 28);
    if (n == 0 || n > kMaxTokenizerIdentityBytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("token file ", path, ": version 2 tokenizer identity length ", n,
                       " (allowed: 1 to ", kMaxTokenizerIdentityBytes, " bytes)"));
    }
    header_bytes = kTokenFileHeaderBytes + 4 + n;
    if (file_bytes < header_bytes) {
      return absl::DataLossError(absl::StrCat("token file ", path, ": truncated: ", file_bytes,
                                              " bytes, shorter than the ", header_bytes,
                                              "-byte header"));
    }
    file->identity_.assign(reinterpret_cast<const char*>(bytes + 32), n);
  }
  file->version_ = static_cast<int>(version);
  const uint32_t width = LoadU32(bytes + 12);
  if (width != 2 && width != 4) {
    return absl::InvalidArgumentError(
        absl::StrCat("token file ", path, ": token width ", width, " bytes (allowed: 2 or 4)"));
  }
  const uint64_t count = LoadU64(bytes + 16);
  const uint32_t vocab = LoadU32(bytes + 24);
  if (vocab == 0 || (width == 2 && vocab > 65536u) || vocab > 0x7FFFFFFFu) {
    return absl::InvalidArgumentError(absl::StrCat("token file ", path, ": vocab ", vocab,
                                                   " invalid for ", width, "-byte tokens"));
  }
  const uint64_t payload = static_cast<uint64_t>(file_bytes - header_bytes);
  if (count > payload / width || payload != count * width) {
    const bool short_file = count > payload / width || payload < count * width;
    return absl::DataLossError(absl::StrCat(
        "token file ", path, ": ", short_file ? "truncated" : "has trailing bytes",
        ": header says ", count, " tokens of ", width, " bytes (", header_bytes + count * width,
        " bytes in all) but the file has ", file_bytes, " bytes"));
  }
  if (expected_vocab > 0 && vocab > expected_vocab) {
    return absl::InvalidArgumentError(absl::StrCat("token file ", path, ": vocab ", vocab,
                                                   " exceeds the model's vocab ", expected_vocab));
  }
  file->header_bytes_ = header_bytes;
  file->count_ = static_cast<int64_t>(count);
  file->vocab_ = vocab;
  file->token_bytes_ = static_cast<int>(width);
  return file;
}

absl::Status TokenFile::ReadStored(int64_t begin, int64_t n, int64_t* out) const {
  unsigned char bytes[kMaxStoredRead * 4];
  RETURN_IF_ERROR(data_->ReadAt(header_bytes_ + begin * token_bytes_, n * token_bytes_, bytes));
  const unsigned char* p = bytes;
  if (token_bytes_ == 2) {
    for (int64_t i = 0; i < n; ++i, p += 2) out[i] = int64_t{p[0]} | int64_t{p[1]} << 8;
  } else {
    for (int64_t i = 0; i < n; ++i, p += 4) out[i] = int64_t{LoadU32(p)};
  }
  return absl::OkStatus();
}

void TokenFile::Prefetch(int64_t position) const {
  data_->WillNeed(header_bytes_ + position * token_bytes_, token_bytes_);
}

absl::Status TokenFile::BadToken(int64_t position, int64_t value) const {
  return absl::DataLossError(absl::StrCat("token file ", path_, ": token ", position,
                                          " (byte offset ", header_bytes_ + position * token_bytes_,
                                          ") has value ", value, ", not below the vocab ", vocab_,
                                          " its header gives"));
}

absl::StatusOr<std::unique_ptr<TokenFileWriter>> TokenFileWriter::Create(
    const std::string& path, int64_t vocab, int token_bytes, const std::string& identity) {
  if (token_bytes != 2 && token_bytes != 4) {
    return absl::InvalidArgumentError(
        absl::StrCat("token file ", path, ": token width ", token_bytes, " (allowed: 2 or 4)"));
  }
  const int64_t max_vocab = token_bytes == 2 ? 65536 : 0x7FFFFFFF;
  if (vocab <= 0 || vocab > max_vocab) {
    return absl::InvalidArgumentError(absl::StrCat("token file ", path, ": vocab ", vocab,
                                                   " must be in [1, ", max_vocab, "] for ",
                                                   token_bytes, "-byte tokens"));
  }
  if (identity.size() > static_cast<size_t>(kMaxTokenizerIdentityBytes)) {
    return absl::InvalidArgumentError(absl::StrCat("token file ", path, ": tokenizer identity of ",
                                                   identity.size(), " bytes (at most ",
                                                   kMaxTokenizerIdentityBytes, ")"));
  }
  std::unique_ptr<TokenFileWriter> w(new TokenFileWriter());
  w->path_ = path;
  w->vocab_ = vocab;
  w->token_bytes_ = token_bytes;
  absl::StatusOr<std::FILE*> file = CreateTempBeside(path, &w->tmp_path_);
  if (!file.ok()) {
    return absl::Status(file.status().code(), absl::StrCat("token file ", file.status().message()));
  }
  w->file_ = *file;
  std::vector<unsigned char> header(kTokenFileHeaderBytes);
  std::memcpy(header.data(), kTokenFileMagic, 8);
  StoreU32(header.data() + 8, identity.empty() ? 1 : 2);
  StoreU32(header.data() + 12, static_cast<uint32_t>(token_bytes));
  StoreU64(header.data() + 16, 0);  // patched by Finish
  StoreU32(header.data() + 24, static_cast<uint32_t>(vocab));
  if (!identity.empty()) {
    header.resize(kTokenFileHeaderBytes + 4);
    StoreU32(header.data() + 28, static_cast<uint32_t>(identity.size()));
    header.insert(header.end(), identity.begin(), identity.end());
  }
  if (std::fwrite(header.data(), 1, header.size(), w->file_) != header.size()) {
    return absl::InternalError(absl::StrCat("token file ", w->tmp_path_, ": write: ", ErrnoText()));
  }
  return w;
}

TokenFileWriter::~TokenFileWriter() {
  if (file_ != nullptr) {
    std::fclose(file_);
    RemoveTemp(tmp_path_);
  }
}

absl::Status TokenFileWriter::Append(const int32_t* tokens, int64_t n) {
  if (file_ == nullptr) return absl::FailedPreconditionError("token file writer is finished");
  for (int64_t i = 0; i < n; ++i) {
    if (tokens[i] < 0 || tokens[i] >= vocab_) {
      return absl::InvalidArgumentError(absl::StrCat("token file ", path_, ": token ", count_ + i,
                                                     " has value ", tokens[i], ", outside [0, ",
                                                     vocab_, ")"));
    }
  }
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t t = static_cast<uint32_t>(tokens[i]);
    for (int b = 0; b < token_bytes_; ++b)
      buffer_.push_back(static_cast<unsigned char>(t >> (8 * b)));
  }
  count_ += n;
  if (buffer_.size() >= (1u << 20)) return Flush();
  return absl::OkStatus();
}

absl::Status TokenFileWriter::Flush() {
  if (!buffer_.empty() && std::fwrite(buffer_.data(), 1, buffer_.size(), file_) != buffer_.size()) {
    return absl::InternalError(absl::StrCat("token file ", tmp_path_, ": write: ", ErrnoText()));
  }
  buffer_.clear();
  return absl::OkStatus();
}

absl::Status TokenFileWriter::Finish() {
  if (file_ == nullptr) return absl::FailedPreconditionError("token file writer is finished");
  RETURN_IF_ERROR(Flush());
  unsigned char count_bytes[8];
  StoreU64(count_bytes, static_cast<uint64_t>(count_));
  if (std::fseek(file_, 16, SEEK_SET) != 0 || std::fwrite(count_bytes, 1, 8, file_) != 8 ||
      std::fflush(file_) != 0 || ::fsync(::fileno(file_)) != 0) {
    return absl::InternalError(absl::StrCat("token file ", tmp_path_, ": write: ", ErrnoText()));
  }
  const int closed = std::fclose(file_);
  file_ = nullptr;
  if (closed != 0) {  // a network file system may report a failed write only here
    const std::string error = ErrnoText();
    RemoveTemp(tmp_path_);
    return absl::InternalError(absl::StrCat("token file ", tmp_path_, ": close: ", error));
  }
  if (absl::Status renamed = RenameDurably(tmp_path_, path_); !renamed.ok()) {
    return absl::Status(renamed.code(), absl::StrCat("token file ", renamed.message()));
  }
  return absl::OkStatus();
}

absl::Status CheckTokenizerIdentity(const TokenFile& file, const std::string& job_tokenizer) {
  if (file.identity().empty()) return absl::OkStatus();
  ASSIGN_OR_RETURN(const std::string job_identity, TokenizerIdentity(job_tokenizer));
  if (file.identity() == job_identity) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "token file ", file.path(), " was made by tokenizer ", file.identity(),
      " but data.tokenizer is ", job_tokenizer,
      job_tokenizer == job_identity ? "" : absl::StrCat(" (", job_identity, ")"),
      ": its ids would stand for other text; prepare the data again with `furnace data prepare "
      "--tokenizer ",
      job_tokenizer, "`, or set data.tokenizer to the tokenizer that made the file"));
}

absl::Status WriteTokenFile(const std::string& path, const std::vector<int32_t>& tokens,
                            int64_t vocab, const std::string& identity) {
  ASSIGN_OR_RETURN(auto writer,
                   TokenFileWriter::Create(path, vocab, vocab <= 65536 ? 2 : 4, identity));
  RETURN_IF_ERROR(writer->Append(tokens.data(), static_cast<int64_t>(tokens.size())));
  return writer->Finish();
}

}  // namespace furnace::data
