// The synthetic source with a known answer (MODEL.md "Data"): a seeded first-order Markov chain
// over V symbols. Its entropy rate H = sum_i pi_i * H(P[i, :]) (nats/token, pi the stationary
// distribution) is the lowest expected cross-entropy any next-token predictor can reach, so a model
// that learns the chain drives its loss to H, and a test can tell learning from mere movement.
//
// Generated rows are peaked: each row puts (1 - smoothing) of its mass on `successors` symbols
// chosen from the seed, with Dirichlet(1) weights, and spreads `smoothing` uniformly, which keeps
// the chain irreducible and aperiodic (so pi is unique) while staying far from uniform.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/data/counter_rng.h"

namespace furnace::data {

struct MarkovConfig {
  int vocab = 16;
  int successors = 3;       // symbols that share the peaked mass of each row, in [1, vocab]
  double smoothing = 0.05;  // mass spread uniformly over all symbols, in [0, 1]
  uint64_t seed = 0;
};

// Immutable after creation; safe to share across threads.
class MarkovChain {
 public:
  static absl::StatusOr<MarkovChain> Create(const MarkovConfig& config);
  // An explicit row-stochastic matrix (V x V, row-major): rows must be non-negative and sum to 1
  // within 1e-9 (they are renormalised exactly).
  static absl::StatusOr<MarkovChain> FromTransitions(int vocab, std::vector<double> transitions);

  int vocab() const { return vocab_; }
  double transition(int from, int to) const { return p_[static_cast<size_t>(from) * vocab_ + to]; }
  const std::vector<double>& stationary() const { return pi_; }
  double entropy_rate() const { return entropy_rate_; }  // nats/token
  double RowEntropy(int from) const;

  int SampleInitial(CounterRng& rng) const { return Pick(pi_cdf_.data(), rng.NextDouble()); }
  int SampleNext(int state, CounterRng& rng) const {
    return Pick(cdf_.data() + static_cast<size_t>(state) * vocab_, rng.NextDouble());
  }

 private:
  MarkovChain() = default;
  absl::Status Finish();  // stationary distribution, entropy rate, CDFs
  int Pick(const double* cdf, double u) const;

  int vocab_ = 0;
  std::vector<double> p_;    // (V, V) transitions
  std::vector<double> cdf_;  // (V, V) row CDFs, last reachable entry exactly 1
  std::vector<double> pi_;   // (V)
  std::vector<double> pi_cdf_;
  double entropy_rate_ = 0;
};

}  // namespace furnace::data
