// Routing-spike injection (MODEL.md "Routing-spike injection", for benchmarks and tests only):
// in a seeded share P of the steps, every MoE layer pushes a share of its tokens onto one chosen
// expert so that the busiest expert receives about r times the mean, r varying up to R. It
// changes routing, not the data: a forced token gets kSpikeBias added to that expert's router
// logit before the softmax (a constant, so backward is unchanged: the saved probabilities already
// hold it).
//
// Every draw is a pure function of the seed and of indices that do not depend on the layout:
//   spike step     U(seed, step) < P
//   expert, ratio  per (seed, step, layer): expert uniform in [0, E), r = 1 + (R - 1) v^2 with v
//                  uniform in [0, 1]
//   forced token   U(seed, step, layer, global token) < q,  q = k (r - 1) / (E - k)
// where the global token index is (sequence index in the global batch) * T + position. So DP, PP,
// TP, EP and micro-batch splits of one global batch force exactly the same tokens as one process.
//
// Why q: a forced token always routes to the expert; any other token picks it with about the
// balanced share k / E. The expert then receives N (q + (1 - q) k / E) of the k N assignments,
// whose mean per expert is k N / E, so busiest / mean = 1 + q (E - k) / k = r. q <= 1 bounds R by
// E / k (every token forced). tests/runtime/model/spikes_test.cc measures the ratio.
#pragma once

#include <cstdint>
#include <optional>

#include "absl/status/status.h"

namespace furnace::model {

// The bias a forced token's chosen expert gets on its router logit.
inline constexpr float kSpikeBias = 30.0f;

struct SpikeConfig {
  double probability = 0;  // P, in [0, 1]; 0 = off
  double max_ratio = 1;    // R, in [1, E / k]
  uint64_t seed = 0;

  bool enabled() const { return probability > 0 && max_ratio > 1; }
  // InvalidArgument naming the field ("spikes.probability", ...), its value and what is allowed.
  absl::Status Validate(int experts, int top_k) const;
};

// The spike of one MoE layer on one micro-batch: which expert, the target ratio and which tokens
// are forced. A value type: MoeSaved keeps a copy, so a rebuild of the router probabilities
// (recompute) applies exactly the same bias.
struct RoutingSpike {
  int expert = 0;
  double ratio = 1;              // r: the target busiest / mean
  double force_probability = 0;  // q
  uint64_t token_key = 0;        // keys the per-token draws of (seed, step, layer)
  int64_t first_token = 0;       // global index of the micro-batch's token 0

  // Whether local token n (row n of the (N, E) logits) is forced.
  bool Forced(int64_t n) const;
  // Adds kSpikeBias to logits[n * E + expert] of every forced token n. logits: (N, E), host memory.
  void Apply(float* logits, int N, int E) const;
};

// Whether `step` is a spike step (false when spikes are off).
bool IsSpikeStep(const SpikeConfig& config, int64_t step);

// The spike of MoE layer `layer` (the model's layer index) on the micro-batch whose first
// sequence is global sequence `first_sequence` (each sequence has `seq_len` tokens); nullopt when
// spikes are off or `step` is not a spike step. config must be valid for (experts, top_k).
std::optional<RoutingSpike> SpikeFor(const SpikeConfig& config, int experts, int top_k,
                                     int64_t step, int layer, int64_t first_sequence, int seq_len);

}  // namespace furnace::model
