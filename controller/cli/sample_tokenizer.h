// The tokenizers `furnace sample` encodes prompts and decodes text with: the data layer's
// (runtime/data/tokenizer.h: "byte", or a SentencePiece model), and sample's own IdTokenizer: a
// model trained on the synthetic Markov chain has symbols, not text, so its prompt and its output
// are token ids written in decimal, separated by spaces.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "runtime/data/tokenizer.h"

namespace furnace::cli {

using data::OpenTokenizer;
using data::Tokenizer;

// Token ids as decimal text ("3 14 15"). Encode refuses a word that is not a number (naming it);
// ids outside [0, vocab) are kept (the decoder refuses them, naming the id).
std::unique_ptr<Tokenizer> IdTokenizer(int64_t vocab);

// Streaming the generated text: the text of `ids` beyond what `shown` already holds (appended to
// it). While not `last`, it stops before what a later token may still change: an incomplete UTF-8
// character at the end (a character whose bytes span tokens is printed with its last byte), and
// trailing U+FFFD, which a byte-fallback tokenizer decodes an incomplete byte run to until the run
// is complete. When the decoded text no longer starts with what was shown (a tokenizer that joins
// pieces differently once it sees more of them), nothing while streaming; the `last` call then
// prints the text after the longest prefix the two share (from a character's start), so no
// generated text goes unprinted; what was shown after that prefix stays on the screen before it.
std::string StreamedText(const Tokenizer& tok, const std::vector<int32_t>& ids, bool last,
                         std::string* shown);

}  // namespace furnace::cli
