// The tokenizers `furnace sample` encodes prompts and decodes text with.
//
// Tokenizer and OpenTokenizer are declared exactly as runtime/data/tokenizer.h declares them on
// helper D's branch (d-tokenizer), which brings SentencePiece; until it merges, this file stands
// in for it with the byte tokenizer only ("byte": token = byte value, end-of-document 256, vocab
// 257). When it merges, these two go and cmd_sample.cc uses data::Tokenizer / data::OpenTokenizer.
//
// IdTokenizer is sample's own: a model trained on the synthetic Markov chain has symbols, not text,
// so its prompt and its output are token ids written in decimal, separated by spaces.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace furnace::cli {

// Immutable after construction: Encode and Decode may be called from any thread.
class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  virtual std::vector<int32_t> Encode(absl::string_view text) const = 0;
  // The end-of-document id and ids outside [0, vocab()) decode to nothing.
  virtual std::string Decode(absl::Span<const int32_t> ids) const = 0;
  virtual int64_t vocab() const = 0;
  virtual int32_t eod_id() const = 0;        // end-of-document id (-1 if none)
  virtual std::string identity() const = 0;  // "byte", "ids", ...
};

// "byte" only (see the file comment); another name is InvalidArgument naming it.
absl::StatusOr<std::unique_ptr<Tokenizer>> OpenTokenizer(const std::string& path_or_byte);

// Token ids as decimal text ("3 14 15"). Encode skips what is not a number; ids outside
// [0, vocab) are kept (the decoder refuses them, naming the id).
std::unique_ptr<Tokenizer> IdTokenizer(int64_t vocab);

}  // namespace furnace::cli
