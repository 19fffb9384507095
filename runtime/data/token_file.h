// Token files (MODEL.md "Data"): a little-endian header followed by the tokens.
//
//   offset 0  char[8]  magic "FURNTOK1"
//          8  uint32   version (1 or 2)
//         12  uint32   token_bytes (2 or 4)
//         16  uint64   count
//         24  uint32   vocab (every token is < vocab)
//   version 1 (identity unknown):
//         28  count tokens, each token_bytes wide, little-endian, unsigned
//   version 2 (the tokenizer that wrote the tokens is known):
//         28  uint32   n, the length of the tokenizer identity (1..256)
//         32  char[n]  tokenizer identity, e.g. "byte" or "sentencepiece:<sha256>" (tokenizer.h)
//     32 + n  count tokens, as in version 1
//
// Version 2 lets a job refuse a token file made with another vocabulary (data.tokenizer). A
// writer given no identity writes version 1, so files made before identities existed and files
// made without one read the same.
//
// TokenFile opens a file read-only and validates its header and size on Open; its tokens are read
// (data_file.h) and checked as they are needed (token_stream.h), so a file of hundreds of GB
// opens at once. A token at
// or above the header's vocab is damage (DataLoss): the file contradicts its own header.
// TokenFileWriter writes one through a temporary file renamed into place on
// Finish, so a reader never sees a half-written file under the final name.
#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/data/data_file.h"
#include "runtime/data/token_stream.h"

namespace furnace::data {

inline constexpr char kTokenFileMagic[8] = {'F', 'U', 'R', 'N', 'T', 'O', 'K', '1'};
inline constexpr uint32_t kTokenFileVersion = 2;      // the newest this build reads and writes
inline constexpr int64_t kTokenFileHeaderBytes = 28;  // version 1; version 2 adds 4 + identity
inline constexpr int64_t kMaxTokenizerIdentityBytes = 256;

// An open, validated token file. Immutable after Open: safe to read from any thread. Owns the
// open file (closed on destruction).
class TokenFile : public TokenStream {
 public:
  // Opens and validates `path`: magic, version (1 or 2), token width, identity length, file size
  // against count. When expected_vocab > 0 (the model's vocab), the file's vocab must not exceed
  // it (a model may pad its vocab, e.g. 50304 for GPT-2's 50257). Errors name the file.
  static absl::StatusOr<std::unique_ptr<TokenFile>> Open(const std::string& path,
                                                         int64_t expected_vocab = 0);
  ~TokenFile() override = default;
  TokenFile(const TokenFile&) = delete;
  TokenFile& operator=(const TokenFile&) = delete;

  const std::string& path() const override { return path_; }
  int64_t size() const override { return count_; }  // number of tokens
  int64_t vocab() const override { return vocab_; }
  int token_bytes() const { return token_bytes_; }
  int version() const { return version_; }
  // The identity of the tokenizer that wrote the file; empty for version 1 (unknown).
  const std::string& identity() const { return identity_; }

 protected:
  absl::Status ReadStored(int64_t begin, int64_t n, int64_t* out) const override;
  absl::Status BadToken(int64_t position, int64_t value) const override;
  void Prefetch(int64_t position) const override;

 private:
  TokenFile() = default;
  std::string path_;
  std::string identity_;
  int version_ = 0;
  std::unique_ptr<DataFile> data_;
  int64_t header_bytes_ = 0;
  int64_t count_ = 0;
  int64_t vocab_ = 0;
  int token_bytes_ = 0;
};

// Writes a token file. Single-threaded. Tokens go to a temporary file of its own beside `path`
// (runtime/base/file_sync.h); Finish writes the count into the header, fsyncs and renames to
// `path`, and fsyncs its directory. Destroying an unfinished writer removes the temp file.
class TokenFileWriter {
 public:
  // token_bytes 2 needs vocab <= 65536; 4 allows up to 2^31. A non-empty `identity` (at most
  // kMaxTokenizerIdentityBytes) is recorded in a version 2 header; empty writes version 1.
  static absl::StatusOr<std::unique_ptr<TokenFileWriter>> Create(const std::string& path,
                                                                 int64_t vocab, int token_bytes,
                                                                 const std::string& identity = "");
  ~TokenFileWriter();
  // Every token must be in [0, vocab): an out-of-range token is refused and nothing is written.
  absl::Status Append(const int32_t* tokens, int64_t n);
  absl::Status Finish();
  int64_t count() const { return count_; }

 private:
  TokenFileWriter() = default;
  absl::Status Flush();
  std::string path_, tmp_path_;
  std::FILE* file_ = nullptr;
  int64_t vocab_ = 0;
  int token_bytes_ = 0;
  int64_t count_ = 0;
  std::vector<unsigned char> buffer_;
};

// Whether `file` may be read by a job whose data.tokenizer is `job_tokenizer` ("byte" or a
// SentencePiece model path, hashed here: TokenizerIdentity). OK when the identities are equal,
// and for a version 1 file (its identity unknown: the caller may warn). FAILED_PRECONDITION
// naming the file and both tokenizers when they differ; NOT_FOUND when the model cannot be read.
absl::Status CheckTokenizerIdentity(const TokenFile& file, const std::string& job_tokenizer);

// Convenience: writes `tokens` with the narrowest width that holds `vocab` (version 2 with a
// non-empty identity, else version 1).
absl::Status WriteTokenFile(const std::string& path, const std::vector<int32_t>& tokens,
                            int64_t vocab, const std::string& identity = "");

}  // namespace furnace::data
