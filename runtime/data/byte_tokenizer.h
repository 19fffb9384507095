// The byte-level text tokenizer (MODEL.md "Data"): token = byte value (vocab 256), plus the
// end-of-document id 256 (vocab 257) appended after each input file when enabled. Lossless and
// needs no vocabulary file, which is what a CPU demo and the tests want.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace furnace::data {

inline constexpr int32_t kByteVocab = 256;
inline constexpr int32_t kEndOfDocument = 256;

// Vocab of the byte tokenizer: 256, or 257 with the end-of-document id.
inline int64_t ByteTokenizerVocab(bool eod) { return eod ? 257 : 256; }

// Tokens of one document.
std::vector<int32_t> ByteTokenize(absl::string_view text, bool eod);

struct PrepareStats {
  int64_t documents = 0;
  int64_t tokens = 0;
  int64_t vocab = 0;
};

// Reads each input text file (one document each, in order), and writes their tokens to `output`
// as a token file (2-byte tokens). Errors name the file that could not be read or written.
absl::StatusOr<PrepareStats> PrepareTokenFile(const std::vector<std::string>& inputs,
                                              const std::string& output, bool eod);

}  // namespace furnace::data
