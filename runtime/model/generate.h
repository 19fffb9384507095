// Text generation with a KvDecoder (kv_decoder.h): the prompt runs through the model once, then
// one token per step through the key-value cache, each drawn from the logits of the last position.
//
// Drawing a token (SampleToken): temperature 0 is greedy (the largest logit; ties go to the lower
// id). Otherwise the logits are divided by the temperature, only the top_k largest are kept when
// top_k > 0 (ties to the lower id), and a token is drawn from their softmax with one uniform draw
// keyed by (seed, index of the generated token): a fixed seed gives the same text every time, on
// any machine.
//
// The context window: the model has seq_len positions. A prompt longer than that keeps its last
// seq_len tokens (Generation::prompt_dropped says how many went). When the cache is full, the
// context is re-encoded from its last seq_len / 2 tokens (positions start again at 0; one full
// forward of that window) and decoding goes on with the cache (Generation::context_resets counts
// these). Inside the window every logit is exactly what a full forward of the window gives.
//
// Thread-safety: Generate uses the decoder alone; one call at a time per decoder.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "runtime/model/kv_decoder.h"

namespace furnace::model {

struct SamplingOptions {
  int max_new_tokens = 200;
  double temperature = 1.0;  // 0: greedy
  int top_k = 0;             // 0: every token
  uint64_t seed = 0;
  int32_t stop_id = -1;  // generation ends after this token (the end of a document); -1: never
  // Only ids below it are drawn (a tokenizer with fewer ids than the model has no text for the
  // rest); 0: every id.
  int sample_vocab = 0;
};

struct Generation {
  std::vector<int32_t> tokens;  // generated, the stop token included when it ended the text
  bool stopped = false;         // ended on stop_id
  int64_t prompt_dropped = 0;   // prompt tokens beyond the window, left out (its first ones)
  int context_resets = 0;       // times the window was re-encoded
};

// InvalidArgument for a temperature < 0 (or not finite) or top_k < 0, naming the option.
absl::Status ValidateSampling(const SamplingOptions& options);

// The token drawn from `logits` (V of them) as the `index`-th generated token.
int32_t SampleToken(absl::Span<const float> logits, const SamplingOptions& options, int64_t index);

// Generates up to options.max_new_tokens after `prompt` (at least one token). `on_token` sees
// each token as it is drawn (streaming output). Errors: ValidateSampling's; InvalidArgument for an
// empty prompt or a prompt token outside the vocabulary; the decoder's.
absl::StatusOr<Generation> Generate(KvDecoder& decoder, absl::Span<const int32_t> prompt,
                                    const SamplingOptions& options,
                                    const std::function<void(int32_t)>& on_token = nullptr);

}  // namespace furnace::model
