#include "runtime/data/byte_tokenizer.h"

namespace furnace::data {

std::vector<int32_t> ByteTokenize(absl::string_view text, bool eod) {
  std::vector<int32_t> tokens;
  tokens.reserve(text.size() + (eod ? 1 : 0));
  for (char c : text) tokens.push_back(static_cast<unsigned char>(c));
  if (eod) tokens.push_back(kEndOfDocument);
  return tokens;
}

absl::StatusOr<std::vector<int32_t>> ByteTokenizer::Encode(
    absl::string_view text, TextPart /*part: bytes need no context*/) const {
  return ByteTokenize(text, false);
}

std::string ByteTokenizer::Decode(absl::Span<const int32_t> ids) const {
  std::string text;
  text.reserve(ids.size());
  for (int32_t id : ids) {
    if (id >= 0 && id < kByteVocab) text.push_back(static_cast<char>(id));
  }
  return text;
}

}  // namespace furnace::data
