// The token-file reader (runtime/data/token_file.h) on arbitrary bytes written to a file, as a
// worker opens a job's data.path. Beyond not crashing:
//  - an accepted file is exactly as long as its header says, every token is in [0, vocab), and
//    at() and Read() agree;
//  - writing the tokens back with the same vocab and identity (TokenFileWriter) and reopening
//    gives the same tokens, vocab and identity;
//  - a refusal names the file.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "runtime/data/token_file.h"
#include "tests/fuzz/fuzz_check.h"
#include "tests/fuzz/scratch_dir.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using furnace::data::TokenFile;
  static const furnace::fuzz::ScratchDir scratch;
  const std::string path = scratch.Write("input.tok", data, size);
  const absl::StatusOr<std::unique_ptr<TokenFile>> file = TokenFile::Open(path);
  if (!file.ok()) {
    FUZZ_CHECK(file.status().message().find(path) != std::string::npos,
               "refusal does not name the file: %s", std::string(file.status().message()).c_str());
    return 0;
  }
  const TokenFile& f = **file;
  const int64_t header = f.version() == 1 ? furnace::data::kTokenFileHeaderBytes
                                          : furnace::data::kTokenFileHeaderBytes + 4 +
                                                static_cast<int64_t>(f.identity().size());
  FUZZ_CHECK(f.version() == 1 || f.version() == 2, "version %d", f.version());
  FUZZ_CHECK(f.token_bytes() == 2 || f.token_bytes() == 4, "token width %d", f.token_bytes());
  FUZZ_CHECK(header + f.size() * f.token_bytes() == static_cast<int64_t>(size),
             "%lld tokens of %d bytes after a %lld-byte header in a %zu-byte file",
             static_cast<long long>(f.size()), f.token_bytes(), static_cast<long long>(header),
             size);
  // Tokens are checked as they are read: a file whose tokens are not all below its vocab opens
  // but fails the read, as damage (its header vouches for them); token by token, the reads agree
  // with the whole one and fail exactly at the first bad token.
  std::vector<int32_t> tokens(static_cast<size_t>(f.size()));
  const absl::Status whole = f.Read(0, f.size(), tokens.data());
  int64_t first_bad = -1;
  for (int64_t i = 0; i < f.size(); ++i) {
    int32_t t = 0;
    const absl::Status one = f.Read(i, 1, &t);
    if (!one.ok()) {
      FUZZ_CHECK(absl::IsDataLoss(one), "a bad token is not DataLoss: %s",
                 std::string(one.message()).c_str());
      if (first_bad < 0) first_bad = i;
      continue;
    }
    FUZZ_CHECK(t >= 0 && t < f.vocab(), "token %lld = %d read outside vocab %lld",
               static_cast<long long>(i), t, static_cast<long long>(f.vocab()));
    if (first_bad < 0) {
      FUZZ_CHECK(tokens[i] == t, "token %lld: whole and single reads disagree",
                 static_cast<long long>(i));
    }
  }
  FUZZ_CHECK(whole.ok() == (first_bad < 0), "the whole read %s but a single read %s",
             whole.ok() ? "passed" : "failed", first_bad < 0 ? "never failed" : "failed");
  if (!whole.ok()) return 0;
  (void)furnace::data::CheckTokenizerIdentity(f, "byte");

  const std::string copy = scratch.path() + "/copy.tok";
  const absl::Status written = furnace::data::WriteTokenFile(copy, tokens, f.vocab(), f.identity());
  FUZZ_CHECK(written.ok(), "the tokens of an accepted file cannot be written back: %s",
             std::string(written.message()).c_str());
  const absl::StatusOr<std::unique_ptr<TokenFile>> back = TokenFile::Open(copy);
  FUZZ_CHECK(back.ok(), "a written token file does not open: %s",
             std::string(back.status().message()).c_str());
  FUZZ_CHECK((*back)->size() == f.size() && (*back)->vocab() == f.vocab() &&
                 (*back)->identity() == f.identity(),
             "a token file changes on a write/read round trip");
  std::vector<int32_t> again(tokens.size());
  const absl::Status reread = (*back)->Read(0, (*back)->size(), again.data());
  FUZZ_CHECK(reread.ok(), "a written token file does not read: %s",
             std::string(reread.message()).c_str());
  FUZZ_CHECK(again == tokens, "the tokens change on a write/read round trip");
  return 0;
}
