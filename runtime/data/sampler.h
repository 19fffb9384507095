// Deterministic batch sampling (MODEL.md "Data"): the batch of (step, data-parallel rank,
// micro-batch) is a pure function of those numbers and the seed. Sequence b of a batch is drawn
// from a counter-based stream keyed by hash(seed, step, rank, micro-batch, b), so a run resumed
// from a checkpoint at step s sees exactly the batches an uninterrupted run would, and no sampler
// state needs to be checkpointed beyond the seed and the step.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/data/markov.h"
#include "runtime/data/token_file.h"

namespace furnace::data {

// inputs, targets: (B, T) row-major; targets[b, t] = the token after inputs[b, t].
struct Batch {
  int B = 0;
  int T = 0;
  std::vector<int32_t> inputs;
  std::vector<int32_t> targets;
};

struct SamplerConfig {
  int batch = 1;    // B: sequences per micro-batch
  int seq_len = 1;  // T
  uint64_t seed = 0;
};

// Thread-safe (Sample is const and keeps no state).
class Sampler {
 public:
  virtual ~Sampler() = default;
  virtual Batch Sample(int64_t step, int dp_rank, int micro_batch) const = 0;
  virtual int64_t vocab() const = 0;
  virtual const SamplerConfig& config() const = 0;
};

// Sequences are windows of T+1 tokens at pseudo-random offsets in the file. The file is shared,
// not copied.
absl::StatusOr<std::unique_ptr<Sampler>> MakeTokenFileSampler(std::shared_ptr<const TokenFile> file,
                                                              const SamplerConfig& config);

// Each sequence starts in a state drawn from the stationary distribution and walks the chain.
absl::StatusOr<std::unique_ptr<Sampler>> MakeMarkovSampler(MarkovChain chain,
                                                           const SamplerConfig& config);

}  // namespace furnace::data
