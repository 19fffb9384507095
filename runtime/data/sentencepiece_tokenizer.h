// SentencePiece subword tokenizers (BPE and unigram models, Kudo & Richardson 2018) behind the
// Tokenizer interface, and their training. SentencePiece itself runs in the module that
// sentencepiece_bridge.h describes, loaded on first use from, in order: the directory of the
// running executable, its ../lib, and the build's library directory.
//
// Models trained here are lossless on any UTF-8 text: no normalization (rule "identity"), no
// dummy prefix, whitespace kept as it is, and byte fallback (a character the vocabulary lacks is
// spelled as its UTF-8 bytes, 256 pieces of the vocabulary). Ids: 0 <unk> (never produced, thanks
// to byte fallback), 1 the end-of-document id (SentencePiece's </s>), no beginning-of-sentence or
// padding ids. A newline is a piece of its own (user-defined symbol) so line breaks cost one id.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/data/sentencepiece_bridge.h"
#include "runtime/data/tokenizer.h"

namespace furnace::data {

class SentencePieceTokenizer final : public Tokenizer {
 public:
  // Loads the model file at `path`. Errors name the file: NOT_FOUND when it cannot be read,
  // INVALID_ARGUMENT when it is not a SentencePiece model; FAILED_PRECONDITION when the
  // SentencePiece module cannot be loaded (naming the places it looked).
  static absl::StatusOr<std::unique_ptr<SentencePieceTokenizer>> Open(const std::string& path);

  // SentencePiece does not refuse valid UTF-8; invalid UTF-8 is encoded as U+FFFD pieces (so only
  // valid UTF-8 round-trips). A part (TextPart) that does not start its document (or, for a model
  // whose dummy whitespace is a suffix, end it) is encoded without the dummy whitespace of a model
  // that adds one and keeps whitespace as it is (Llama's, Mistral's; models trained here add
  // none), so a document cut after newlines gives the ids of the whole wherever no piece spans a
  // newline (models trained here: it is a piece of its own). A model that removes extra whitespace
  // encodes each part as it is: the ids of the whole where its normalizer makes a newline a space
  // (nmt_nfkc), one more "▁" a cut elsewhere (sentencepiece_bridge.cc says why).
  absl::StatusOr<std::vector<int32_t>> Encode(absl::string_view text, TextPart part) const override;
  std::string Decode(absl::Span<const int32_t> ids) const override;
  int64_t vocab() const override { return vocab_; }
  int32_t eod_id() const override { return eod_id_; }
  std::string identity() const override { return identity_; }

 private:
  SentencePieceTokenizer() = default;
  std::unique_ptr<spm::Processor> processor_;
  int64_t vocab_ = 0;
  int32_t eod_id_ = -1;
  std::string identity_;
};

// Every character of the text gets a piece of its own unless the coverage is lower: the models
// that `furnace data tokenizer train` made before the option existed come out the same (and the
// README's measured demo with them). A text with thousands of characters (Chinese, Japanese)
// wants SentencePiece's own default, 0.9995: its rarest characters then cost their bytes (3 ids
// for most CJK characters) instead of a piece each.
inline constexpr double kDefaultCharacterCoverage = 1.0;
inline constexpr double kMinCharacterCoverage = 0.98;  // SentencePiece refuses less

struct SentencePieceTrainOptions {
  std::vector<std::string> inputs;     // text files; each line is one training sentence
  int64_t vocab = 0;                   // pieces, including the 256 byte pieces, <unk> and </s>
  std::string model_type = "unigram";  // unigram | bpe
  std::string output;                  // the .model file to write
  // The share of the text's characters that get a piece of their own, the most frequent first;
  // the rarest (the rest) are spelled as their UTF-8 bytes (byte fallback). In [0.98, 1].
  double character_coverage = kDefaultCharacterCoverage;
};

struct SentencePieceTrainResult {
  int64_t vocab = 0;
  int64_t input_bytes = 0;
  int64_t long_lines = 0;        // lines longer than kMaxTrainingSentenceBytes, trained on cut
  int64_t long_line_pieces = 0;  // the pieces they were cut into (training_sentences.h)
  std::string identity;          // "sentencepiece:<sha256 of the written model>"
};

// Smallest vocab a model can have: 256 byte pieces, <unk>, </s> and the newline piece, plus one.
inline constexpr int64_t kMinSentencePieceVocab = 260;
inline constexpr int32_t kSentencePieceEodId = 1;  // </s> in models trained here

// The checks on the options alone (no file is read): inputs and output given, the model type, the
// vocab's lower bound, the character coverage in [0.98, 1]. INVALID_ARGUMENT naming the option (as
// `furnace data tokenizer train` spells it) and its allowed values.
absl::Status CheckSentencePieceTrainOptions(const SentencePieceTrainOptions& options);

// Trains a model on `options.inputs` and writes it to options.output through a temporary file
// renamed into place (nothing half-written under the final name). Training reads at most a
// million sentences (lines, and the pieces of lines longer than kMaxTrainingSentenceBytes, which
// SentencePiece would skip: TrainingSentences), sampled uniformly when there are more, so memory
// stays bounded. Errors (INVALID_ARGUMENT unless said): CheckSentencePieceTrainOptions's; an input
// that cannot be read (NOT_FOUND) or is empty, named; a vocab above what the text can give (with
// the largest it can) or below the characters the coverage keeps (with the smallest); another
// refusal of SentencePiece's, in its words; an output that cannot be written (INTERNAL).
absl::StatusOr<SentencePieceTrainResult> TrainSentencePiece(
    const SentencePieceTrainOptions& options);

}  // namespace furnace::data
