// Sequences and epochs over finite token data (token files and Megatron indexed datasets).
//
// Packing. A dataset is one token stream: a token file's tokens, or an indexed dataset's
// sequences concatenated in file order (documents keep their end-of-document tokens if the data
// has them; a window may span two documents, as in Megatron's GPT dataset). The stream of L
// tokens is cut into N = (L - 1) / T windows of T + 1 tokens, window k = tokens [k*T, k*T + T]
// (consecutive windows share one token: the last target of one is the first input of the next).
// The tail shorter than a window is not used. A held-out fraction f takes the last
// max(1, round(f * N)) windows of every dataset, and the window just before them is dropped, so
// no token of a held-out window is ever trained on (not even as a target).
//
// Epochs. Training visits the windows in epochs: epoch e is the permutation P(seed, e) of the N
// training windows, a keyed bijection (a Feistel network over the smallest power of four >= N
// with cycle walking) so window j of epoch e is computed in O(1) memory without materialising
// the order. Global position p (sequence b of global micro-batch g of step s is
// p = s * global_batch + g * B + b) is epoch p / N, index p % N: every window is seen exactly
// once per epoch, and a new order starts each epoch.
//
// Blends. With several datasets of weights w_d, positions are assigned to datasets by a fixed
// interleave of period K = 4096 slots (slot counts the largest-remainder apportionment of K*w_d,
// spread by the smooth weighted round-robin): position p goes to dataset layout[p % K] as that
// dataset's own position (p / K) * n_d + rank of the slot. Each dataset then has its own epochs
// (it may repeat while another has not finished one). Shares are whole slots: a dataset gets its
// weight's share to within half a slot (1/8192 of the positions), so a weight near 1/K can be
// off by up to half of itself; one that rounds to no slot is refused.
//
// Validation samplers read the held-out windows in order, position p -> window p % N_val.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/data/sampler.h"
#include "runtime/data/token_stream.h"

namespace furnace::data {

// One dataset of an epoch sampler and its share of the blend.
struct EpochSource {
  std::shared_ptr<const TokenStream> stream;
  double weight = 1;
};

enum class SplitPart {
  kAll,         // every window (validation files, or no held-out split)
  kTrain,       // the windows before the held-out tail (and the one dropped between)
  kValidation,  // the held-out tail
};

struct EpochSamplerOptions {
  SplitPart part = SplitPart::kAll;
  double validation_fraction = 0;  // with kTrain / kValidation
  bool shuffle = true;             // training: a new permutation per epoch; validation: in order
};

// InvalidArgument (naming the file) when a dataset has no window of seq_len + 1 tokens in the
// requested part, or a weight is not positive or rounds to no slot of the K (above).
absl::StatusOr<std::unique_ptr<Sampler>> MakeEpochSampler(std::vector<EpochSource> sources,
                                                          const SamplerConfig& config,
                                                          const EpochSamplerOptions& options);

// A keyed pseudo-random permutation of [0, n): At(i) for i < n is a bijection onto [0, n).
class FeistelPermutation {
 public:
  FeistelPermutation(uint64_t n, uint64_t key);
  uint64_t At(uint64_t i) const;

 private:
  uint64_t Encrypt(uint64_t x) const;
  uint64_t n_;
  uint64_t key_;
  int half_bits_ = 1;
};

}  // namespace furnace::data
