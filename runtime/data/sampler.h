// Deterministic batch sampling (MODEL.md "Data"): the batch of (step, data-parallel rank,
// micro-batch) is a pure function of those numbers and the seed, so a run resumed from a
// checkpoint at step s sees exactly the batches an uninterrupted run would. Callers pass rank 0
// and the global micro-batch index g = dp_rank * micro_batches + j, so the global batch of a step
// does not depend on the layout.
//
// Markov data: sequence b of a batch is drawn from a counter-based stream keyed by hash(seed,
// step, rank, micro-batch, b). Token files and indexed datasets (epoch_sampler.h): sequence b of
// global micro-batch g of step s is the sequence at global position s * global_batch + g * B + b
// of a seeded, per-epoch shuffled order. The data position a checkpoint records (DataPosition)
// is a function of the step, and a resume checks that it and what defines the order are
// unchanged.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/data/data_position.h"
#include "runtime/data/markov.h"

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
  // Sequences per step over all ranks (micro_batch * micro_batches * dp); 0: B. Finite sources
  // need it to place a step's sequences; Sample's micro_batch must stay below global_batch / B.
  int64_t global_batch = 0;
};

// The (B, T) batch of `config`, zero-filled.
Batch EmptyBatch(const SamplerConfig& config);
// InvalidArgument unless batch, seq_len >= 1 and global_batch is 0 or a multiple of batch.
absl::Status CheckSamplerConfig(const SamplerConfig& config);

// An error of the data itself (a token outside the vocab, a damaged file), met while sampling:
// the step that asked for the batch fails with it, and the rank reports it as the data's (bad
// input or corrupt data, which a restart would meet again), not as a failed step. The mark is a
// payload, so it survives being returned up through the trainer.
absl::Status DataError(absl::Status status);
bool IsDataError(const absl::Status& status);

// Thread-safe (Sample is const and keeps no state).
class Sampler {
 public:
  virtual ~Sampler() = default;
  // The batch, or a DataError (finite data is read, and checked, here: token_stream.h).
  virtual absl::StatusOr<Batch> Sample(int64_t step, int dp_rank, int micro_batch) const = 0;
  virtual int64_t vocab() const = 0;
  virtual const SamplerConfig& config() const = 0;
  // The position before step `step` (a pure function of it).
  virtual DataPosition PositionAt(int64_t step) const = 0;
};

// Whether `recorded` (a checkpoint's DataPosition::order) is the order `now` of this run. A
// "markov v1" order, written before the Markov order named the batch shape, is this run's
// "markov v2" one without its batch fields: the same chain, seed and seq_len (the batch shape
// goes unchecked, as it did when it was written), so an upgrade does not refuse a run's own
// checkpoints.
bool SameDataOrder(const std::string& recorded, const std::string& now);

// Where two orders differ, for a refusal: "A -> B", the differing span of each (whole words: a
// hash, a size, a setting), or "" when they are equal. An order names several datasets and every
// setting, so the line a user must find is otherwise lost in two long strings.
std::string DataOrderDifference(const std::string& recorded, const std::string& now);

// Each sequence starts in a state drawn from the stationary distribution and walks the chain.
// `validation`: the held-out stream, keyed apart from the training stream (independent draws).
// The training and held-out samplers of a run share one chain (2 x vocab^2 doubles: 268 MB at
// vocab 4096).
absl::StatusOr<std::unique_ptr<Sampler>> MakeMarkovSampler(std::shared_ptr<const MarkovChain> chain,
                                                           const SamplerConfig& config,
                                                           bool validation = false);
absl::StatusOr<std::unique_ptr<Sampler>> MakeMarkovSampler(MarkovChain chain,
                                                           const SamplerConfig& config,
                                                           bool validation = false);

// Wraps `inner` with a background thread that computes the batches this rank asks for next:
// after (step, 0, g) it prepares (step, 0, g + 1) ... up to `depth` ahead, wrapping from
// first_micro + micro_count - 1 to (step + 1, first_micro). Sample returns a prepared batch (or
// error) when there is one and computes it otherwise, so results equal inner's exactly.
// Thread-safe; the thread stops on destruction.
std::unique_ptr<Sampler> MakePrefetchingSampler(std::unique_ptr<Sampler> inner, int first_micro,
                                                int micro_count, int depth = 4);

}  // namespace furnace::data
