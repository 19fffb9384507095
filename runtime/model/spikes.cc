#include "runtime/model/spikes.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "runtime/data/counter_rng.h"

namespace furnace::model {
namespace {

// Domain words keep the three kinds of draw apart even where their indices coincide.
constexpr uint64_t kStepDomain = 0x5350494b45535445ull;   // "SPIKESTE"
constexpr uint64_t kLayerDomain = 0x5350494b454c4159ull;  // "SPIKELAY"
constexpr uint64_t kTokenDomain = 0x5350494b45544f4bull;  // "SPIKETOK"

absl::Status Bad(const std::string& field, double value, const std::string& allowed) {
  return absl::InvalidArgumentError(
      absl::StrCat("model config: spikes.", field, " = ", value, " is invalid: ", allowed));
}

double UnitDraw(uint64_t key) { return data::CounterRng(key).NextDouble(); }

}  // namespace

absl::Status SpikeConfig::Validate(int experts, int top_k) const {
  if (!(probability >= 0 && probability <= 1)) {
    return Bad("probability", probability, "must be in [0, 1]");
  }
  if (!(max_ratio >= 1)) return Bad("max_ratio", max_ratio, "must be >= 1");
  if (experts >= 1 && top_k >= 1 && max_ratio * top_k > experts) {
    return Bad("max_ratio", max_ratio,
               absl::StrCat("must be <= experts / top_k = ", experts, " / ", top_k, " = ",
                            static_cast<double>(experts) / top_k,
                            " (at that ratio every token is forced onto the spiking expert)"));
  }
  return absl::OkStatus();
}

bool RoutingSpike::Forced(int64_t n) const {
  const uint64_t token = static_cast<uint64_t>(first_token + n);
  return UnitDraw(data::HashKey({token_key, token})) < force_probability;
}

void RoutingSpike::Apply(float* logits, int N, int E) const {
  for (int n = 0; n < N; ++n) {
    if (Forced(n)) logits[int64_t{n} * E + expert] += kSpikeBias;
  }
}

bool IsSpikeStep(const SpikeConfig& config, int64_t step) {
  if (!config.enabled()) return false;
  const uint64_t key = data::HashKey({kStepDomain, config.seed, static_cast<uint64_t>(step)});
  return UnitDraw(key) < config.probability;
}

std::optional<RoutingSpike> SpikeFor(const SpikeConfig& config, int experts, int top_k,
                                     int64_t step, int layer, int64_t first_sequence, int seq_len) {
  if (experts <= top_k || !IsSpikeStep(config, step)) return std::nullopt;
  const uint64_t s = static_cast<uint64_t>(step), l = static_cast<uint64_t>(layer);
  data::CounterRng rng(data::HashKey({kLayerDomain, config.seed, s, l}));
  RoutingSpike spike;
  spike.expert = static_cast<int>(rng.NextBelow(static_cast<uint64_t>(experts)));
  const double v = rng.NextDouble();
  spike.ratio = 1 + (config.max_ratio - 1) * v * v;
  spike.force_probability = top_k * (spike.ratio - 1) / (experts - top_k);
  spike.token_key = data::HashKey({kTokenDomain, config.seed, s, l});
  spike.first_token = first_sequence * seq_len;
  return spike;
}

}  // namespace furnace::model
