// A small made-up corpus for tokenizer tests: a few hundred lines of words, some with non-ASCII
// characters, deterministic (no randomness), so training a vocabulary on it takes well under a
// second.
#pragma once

#include <string>

namespace furnace::data::testing_corpus {

inline std::string Corpus(int lines = 400) {
  static const char* const kWords[] = {
      "the",    "model", "learns",   "experts",  "route", "tokens", "naïve",     "café",   "über",
      "daß",    "—",     "日本語",   "données",  "año",   "of",     "and",       "to",     "a",
      "tensor", "layer", "parallel", "training", "Ωmega", "π",      "copyright", "license"};
  constexpr int kCount = sizeof(kWords) / sizeof(kWords[0]);
  std::string text;
  for (int line = 0; line < lines; ++line) {
    const int n = 5 + line % 7;
    for (int w = 0; w < n; ++w) {
      if (w > 0) text += (line + w) % 13 == 0 ? "  " : " ";
      text += kWords[(line * 7 + w * w * 3 + w) % kCount];
    }
    text += line % 5 == 0 ? ".\n" : ",\n";
  }
  return text;
}

}  // namespace furnace::data::testing_corpus
