// The one tokenizer interface that everything which turns text into token ids or back shares:
// `furnace data prepare` (encode), `furnace sample` (decode), the worker (identity). Two
// implementations: the byte-level tokenizer (byte_tokenizer.h) and SentencePiece
// (sentencepiece_tokenizer.h, BPE or unigram models).
//
// identity() names the vocabulary: "byte", or "sentencepiece:<sha256 of the model file, hex>". A
// token file records the identity of the tokenizer that wrote it (token_file.h, version 2), so a
// job whose data.tokenizer names another vocabulary is refused instead of training on ids that mean
// something else. TokenizerIdentity computes it without loading the model (the worker needs only
// this and does not link SentencePiece).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace furnace::data {

// Where an encoded text sits in its document: the whole of it, or a part of a document encoded in
// parts (data prepare's blocks), first, between two others, or last.
enum class TextPart { kWhole, kFirst, kMiddle, kLast };

// Immutable after construction: Encode and Decode may be called from any thread.
class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // Ids of `text`, without an end-of-document id. Lossless: Decode(Encode(t)) == t for any UTF-8
  // text (bytes the vocabulary lacks are spelled with byte pieces). A document cut after newlines
  // and encoded part by part (kFirst, kMiddle..., kLast) gives the ids of the whole (kWhole): a
  // model that adds a dummy whitespace to a text adds it at the document's start (or, as a suffix,
  // its end) only (sentencepiece_tokenizer.h says for which models). Errors: the tokenizer refused
  // the text (INVALID_ARGUMENT, with its reason).
  virtual absl::StatusOr<std::vector<int32_t>> Encode(absl::string_view text,
                                                      TextPart part) const = 0;
  // Text of `ids`. The end-of-document id and ids outside [0, vocab()) decode to nothing.
  virtual std::string Decode(absl::Span<const int32_t> ids) const = 0;
  virtual int64_t vocab() const = 0;
  virtual int32_t eod_id() const = 0;        // end-of-document id (-1 if none)
  virtual std::string identity() const = 0;  // "byte" or "sentencepiece:<sha256 of model file>"
};

// The byte-level tokenizer for "byte" (with its end-of-document id 256, vocab 257), else the
// SentencePiece model at that path. Errors name the file: NOT_FOUND when it is not there,
// UNAVAILABLE when it is but cannot be read now (runtime/base/file_error.h),
// INVALID_ARGUMENT when it is not a SentencePiece model. Defined in furnace_tokenizer (links
// SentencePiece), not furnace_data.
absl::StatusOr<std::unique_ptr<Tokenizer>> OpenTokenizer(const std::string& path_or_byte);

// The identity OpenTokenizer(path_or_byte)->identity() would return, computed from the file's
// bytes alone ("byte" for "byte"). Errors name the file: NOT_FOUND when it is not there,
// UNAVAILABLE when it cannot be read now.
absl::StatusOr<std::string> TokenizerIdentity(const std::string& path_or_byte);

// Lowercase hex SHA-256 of a file's bytes, read in blocks. Errors name the file.
absl::StatusOr<std::string> Sha256OfFile(const std::string& path);
// Lowercase hex SHA-256 of `bytes`.
std::string Sha256Hex(absl::string_view bytes);

}  // namespace furnace::data
