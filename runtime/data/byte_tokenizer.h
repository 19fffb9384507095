// The byte-level text tokenizer (MODEL.md "Data"): token = byte value (vocab 256), plus the
// end-of-document id 256 (vocab 257) when enabled. Lossless and needs no vocabulary file, which is
// what a CPU demo and the tests want. Identity "byte" with or without the end-of-document id: the
// ids of the one are the ids of the other.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "runtime/data/tokenizer.h"

namespace furnace::data {

inline constexpr int32_t kByteVocab = 256;
inline constexpr int32_t kEndOfDocument = 256;
inline constexpr char kByteTokenizerName[] = "byte";

// Vocab of the byte tokenizer: 256, or 257 with the end-of-document id.
inline int64_t ByteTokenizerVocab(bool eod) { return eod ? 257 : 256; }

// Tokens of one document, followed by the end-of-document id when `eod`.
std::vector<int32_t> ByteTokenize(absl::string_view text, bool eod);

class ByteTokenizer final : public Tokenizer {
 public:
  explicit ByteTokenizer(bool eod = true) : eod_(eod) {}
  absl::StatusOr<std::vector<int32_t>> Encode(absl::string_view text, TextPart part) const override;
  std::string Decode(absl::Span<const int32_t> ids) const override;
  int64_t vocab() const override { return ByteTokenizerVocab(eod_); }
  int32_t eod_id() const override { return eod_ ? kEndOfDocument : -1; }
  std::string identity() const override { return kByteTokenizerName; }

 private:
  bool eod_;
};

}  // namespace furnace::data
