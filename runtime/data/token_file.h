// Token files (MODEL.md "Data"): a 28-byte little-endian header followed by the tokens.
//
//   offset 0  char[8]  magic "FURNTOK1"
//          8  uint32   version (1)
//         12  uint32   token_bytes (2 or 4)
//         16  uint64   count
//         24  uint32   vocab (every token is < vocab)
//         28  count tokens, each token_bytes wide, little-endian, unsigned
//
// TokenFile memory-maps a file read-only and validates all of it on Open, so a sampler can index
// it without checks. TokenFileWriter writes one through a temporary file renamed into place on
// Finish, so a reader never sees a half-written file under the final name.
#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/data/mapped_file.h"
#include "runtime/data/token_stream.h"

namespace furnace::data {

inline constexpr char kTokenFileMagic[8] = {'F', 'U', 'R', 'N', 'T', 'O', 'K', '1'};
inline constexpr uint32_t kTokenFileVersion = 1;
inline constexpr int64_t kTokenFileHeaderBytes = 28;

// An open, validated token file. Immutable after Open: safe to read from any thread. Owns the
// mapping (unmapped on destruction).
class TokenFile : public TokenStream {
 public:
  // Maps and validates `path`: magic, version, token width, file size against count, every token
  // below the header's vocab. When expected_vocab > 0 (the model's vocab), the file's vocab must
  // not exceed it (a model may pad its vocab, e.g. 50304 for GPT-2's 50257). Errors name the file
  // and, for a bad token, its index, byte offset and value.
  static absl::StatusOr<std::unique_ptr<TokenFile>> Open(const std::string& path,
                                                         int64_t expected_vocab = 0);
  ~TokenFile() override = default;
  TokenFile(const TokenFile&) = delete;
  TokenFile& operator=(const TokenFile&) = delete;

  const std::string& path() const override { return path_; }
  int64_t size() const override { return count_; }  // number of tokens
  int64_t vocab() const override { return vocab_; }
  int token_bytes() const { return token_bytes_; }
  int32_t at(int64_t i) const;
  // out[0..n) = tokens [begin, begin + n); the caller keeps the range inside [0, size()).
  void Read(int64_t begin, int64_t n, int32_t* out) const override;

 private:
  TokenFile() = default;
  std::string path_;
  std::unique_ptr<MappedFile> map_;
  const unsigned char* tokens_ = nullptr;
  int64_t count_ = 0;
  int64_t vocab_ = 0;
  int token_bytes_ = 0;
};

// Writes a token file. Single-threaded. Tokens go to `<path>.tmp`; Finish writes the count into
// the header, fsyncs and renames to `path`. Destroying an unfinished writer removes the temp file.
class TokenFileWriter {
 public:
  // token_bytes 2 needs vocab <= 65536; 4 allows up to 2^31.
  static absl::StatusOr<std::unique_ptr<TokenFileWriter>> Create(const std::string& path,
                                                                 int64_t vocab, int token_bytes);
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

// Convenience: writes `tokens` with the narrowest width that holds `vocab`.
absl::Status WriteTokenFile(const std::string& path, const std::vector<int32_t>& tokens,
                            int64_t vocab);

}  // namespace furnace::data
