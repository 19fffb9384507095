// The tokenizers `furnace sample` encodes prompts and decodes text with: the data layer's
// (runtime/data/tokenizer.h: "byte", or a SentencePiece model), and sample's own IdTokenizer: a
// model trained on the synthetic Markov chain has symbols, not text, so its prompt and its output
// are token ids written in decimal, separated by spaces.
#pragma once

#include <cstdint>
#include <memory>

#include "runtime/data/tokenizer.h"

namespace furnace::cli {

using data::OpenTokenizer;
using data::Tokenizer;

// Token ids as decimal text ("3 14 15"). Encode refuses a word that is not a number (naming it);
// ids outside [0, vocab) are kept (the decoder refuses them, naming the id).
std::unique_ptr<Tokenizer> IdTokenizer(int64_t vocab);

}  // namespace furnace::cli
