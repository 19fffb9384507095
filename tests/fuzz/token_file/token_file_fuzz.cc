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
  std::vector<int32_t> tokens(static_cast<size_t>(f.size()));
  if (!tokens.empty()) f.Read(0, f.size(), tokens.data());
  for (int64_t i = 0; i < f.size(); ++i) {
    FUZZ_CHECK(tokens[i] >= 0 && tokens[i] < f.vocab(), "token %lld = %d outside vocab %lld",
               static_cast<long long>(i), tokens[i], static_cast<long long>(f.vocab()));
    FUZZ_CHECK(f.at(i) == tokens[i], "at(%lld) and Read disagree", static_cast<long long>(i));
  }
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
  if (!again.empty()) (*back)->Read(0, (*back)->size(), again.data());
  FUZZ_CHECK(again == tokens, "the tokens change on a write/read round trip");
  return 0;
}
