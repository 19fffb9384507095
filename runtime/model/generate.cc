#include "runtime/model/generate.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "runtime/base/status.h"
#include "runtime/data/counter_rng.h"

namespace furnace::model {
namespace {

constexpr uint64_t kSampleDomain = 0x53414d504c45544bull;  // "SAMPLETK": the sampling draws

// The largest logit's id, ties to the lower id.
int32_t Argmax(absl::Span<const float> logits) {
  return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

}  // namespace

absl::Status ValidateSampling(const SamplingOptions& o) {
  if (!std::isfinite(o.temperature) || o.temperature < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--temperature ", o.temperature, " is not allowed (0 for greedy, or a positive number)"));
  }
  if (o.top_k < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--top-k ", o.top_k, " is not allowed (0 for every token, or >= 1)"));
  }
  if (o.max_new_tokens < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("-n ", o.max_new_tokens, " is not allowed (tokens to generate, >= 0)"));
  }
  return absl::OkStatus();
}

int32_t SampleToken(absl::Span<const float> logits, const SamplingOptions& o, int64_t index) {
  if (o.sample_vocab > 0 && o.sample_vocab < static_cast<int>(logits.size())) {
    logits = logits.subspan(0, static_cast<size_t>(o.sample_vocab));
  }
  if (o.temperature == 0 || o.top_k == 1) return Argmax(logits);
  const int V = static_cast<int>(logits.size());
  std::vector<int32_t> ids(V);
  std::iota(ids.begin(), ids.end(), 0);
  // Largest first, ties to the lower id; stable so the order is the same on every platform.
  std::stable_sort(ids.begin(), ids.end(),
                   [&logits](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  if (o.top_k > 0 && o.top_k < V) ids.resize(o.top_k);
  const double mx = logits[ids.front()];
  std::vector<double> weight(ids.size());
  double sum = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    sum += weight[i] = std::exp((logits[ids[i]] - mx) / o.temperature);
  }
  data::CounterRng rng(data::HashKey({kSampleDomain, o.seed, static_cast<uint64_t>(index)}));
  double u = rng.NextDouble() * sum;
  for (size_t i = 0; i < ids.size(); ++i) {
    u -= weight[i];
    if (u < 0) return ids[i];
  }
  return ids.back();
}

absl::StatusOr<Generation> Generate(KvDecoder& decoder, absl::Span<const int32_t> prompt,
                                    const SamplingOptions& options,
                                    const std::function<void(int32_t)>& on_token) {
  RETURN_IF_ERROR(ValidateSampling(options));
  if (prompt.empty()) {
    return absl::InvalidArgumentError("the prompt has no tokens (at least one is needed)");
  }
  const int window = decoder.max_length();
  Generation g;
  // The context the model sees: the prompt's last `window` tokens, then what is generated.
  std::vector<int32_t> context;
  if (static_cast<int>(prompt.size()) > window) {
    g.prompt_dropped = static_cast<int64_t>(prompt.size()) - window;
  }
  context.assign(prompt.begin() + g.prompt_dropped, prompt.end());
  decoder.Reset();
  ASSIGN_OR_RETURN(std::vector<float> logits, decoder.Append(context));
  const int V = decoder.config().vocab;
  for (int i = 0; i < options.max_new_tokens; ++i) {
    const absl::Span<const float> last(logits.data() + logits.size() - V, V);
    const int32_t token = SampleToken(last, options, i);
    g.tokens.push_back(token);
    context.push_back(token);
    if (on_token) on_token(token);
    if (token == options.stop_id) {
      g.stopped = true;
      break;
    }
    if (i + 1 == options.max_new_tokens) break;
    if (decoder.length() < window) {
      ASSIGN_OR_RETURN(logits, decoder.Append(absl::MakeConstSpan(&context.back(), 1)));
    } else {
      // The window is full: re-encode its last half (at least one token).
      const size_t keep = static_cast<size_t>(std::max(1, window / 2));
      decoder.Reset();
      ASSIGN_OR_RETURN(logits, decoder.Append(absl::MakeConstSpan(context).last(keep)));
      ++g.context_resets;
    }
  }
  return g;
}

}  // namespace furnace::model
