#include "runtime/data/markov.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "runtime/base/status.h"

namespace furnace::data {
namespace {

// CDF of p (n entries) with the last positive entry and everything after it exactly 1, so a
// uniform draw in [0, 1) never lands on a zero-probability symbol.
void BuildCdf(const double* p, int n, double* cdf) {
  double acc = 0;
  int last = 0;
  for (int j = 0; j < n; ++j) {
    acc += p[j];
    cdf[j] = acc;
    if (p[j] > 0) last = j;
  }
  for (int j = last; j < n; ++j) cdf[j] = 1.0;
}

}  // namespace

absl::StatusOr<MarkovChain> MarkovChain::Create(const MarkovConfig& config) {
  const int V = config.vocab;
  if (V < 1) return absl::InvalidArgumentError(absl::StrCat("markov: vocab ", V, " must be >= 1"));
  if (config.successors < 1 || config.successors > V) {
    return absl::InvalidArgumentError(
        absl::StrCat("markov: successors ", config.successors, " must be in [1, vocab=", V, "]"));
  }
  if (!(config.smoothing >= 0 && config.smoothing <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("markov: smoothing ", config.smoothing, " must be in [0, 1]"));
  }
  std::vector<double> p(static_cast<size_t>(V) * V, config.smoothing / V);
  std::vector<int> symbols(V);
  for (int i = 0; i < V; ++i) {
    CounterRng rng(HashKey({config.seed, 0x4D61726B6F76ull, static_cast<uint64_t>(i)}));
    std::iota(symbols.begin(), symbols.end(), 0);
    std::vector<double> w(config.successors);
    double total = 0;
    for (int j = 0; j < config.successors; ++j) {  // partial Fisher-Yates: distinct successors
      std::swap(symbols[j], symbols[j + rng.NextBelow(V - j)]);
      w[j] = -std::log(1.0 - rng.NextDouble());  // Exp(1): normalised, Dirichlet(1) weights
      total += w[j];
    }
    for (int j = 0; j < config.successors; ++j) {
      p[static_cast<size_t>(i) * V + symbols[j]] += (1.0 - config.smoothing) * w[j] / total;
    }
  }
  MarkovChain chain;
  chain.vocab_ = V;
  chain.p_ = std::move(p);
  RETURN_IF_ERROR(chain.Finish());
  return chain;
}

absl::StatusOr<MarkovChain> MarkovChain::FromTransitions(int vocab, std::vector<double> p) {
  if (vocab < 1 || p.size() != static_cast<size_t>(vocab) * vocab) {
    return absl::InvalidArgumentError(
        absl::StrCat("markov: need a ", vocab, "x", vocab, " matrix, got ", p.size(), " entries"));
  }
  for (int i = 0; i < vocab; ++i) {
    double sum = 0;
    for (int j = 0; j < vocab; ++j) {
      const double x = p[static_cast<size_t>(i) * vocab + j];
      if (!(x >= 0)) {
        return absl::InvalidArgumentError(
            absl::StrCat("markov: transition (", i, ", ", j, ") = ", x, " is negative"));
      }
      sum += x;
    }
    if (std::abs(sum - 1.0) > 1e-9) {
      return absl::InvalidArgumentError(absl::StrCat("markov: row ", i, " sums to ", sum));
    }
    for (int j = 0; j < vocab; ++j) p[static_cast<size_t>(i) * vocab + j] /= sum;
  }
  MarkovChain chain;
  chain.vocab_ = vocab;
  chain.p_ = std::move(p);
  RETURN_IF_ERROR(chain.Finish());
  return chain;
}

absl::Status MarkovChain::Finish() {
  const int V = vocab_;
  // Lazy power iteration pi <- (pi + pi P) / 2: same fixed point as pi P, and it converges for
  // periodic chains too (a deterministic cycle), where plain iteration can oscillate.
  std::vector<double> pi(V, 1.0 / V), next(V);
  constexpr int kMaxIterations = 1'000'000;
  bool converged = false;
  for (int it = 0; it < kMaxIterations && !converged; ++it) {
    std::fill(next.begin(), next.end(), 0.0);
    for (int i = 0; i < V; ++i) {
      const double* row = p_.data() + static_cast<size_t>(i) * V;
      for (int j = 0; j < V; ++j) next[j] += pi[i] * row[j];
    }
    double delta = 0, total = 0;
    for (int j = 0; j < V; ++j) {
      next[j] = 0.5 * (pi[j] + next[j]);
      delta += std::abs(next[j] - pi[j]);
      total += next[j];
    }
    for (int j = 0; j < V; ++j) pi[j] = next[j] / total;
    converged = delta < 1e-13;
  }
  if (!converged) {
    return absl::FailedPreconditionError(
        absl::StrCat("markov: stationary distribution did not converge to 1e-13 in ",
                     kMaxIterations, " iterations"));
  }
  pi_ = std::move(pi);
  entropy_rate_ = 0;
  for (int i = 0; i < V; ++i) entropy_rate_ += pi_[i] * RowEntropy(i);
  cdf_.resize(p_.size());
  for (int i = 0; i < V; ++i) {
    BuildCdf(p_.data() + static_cast<size_t>(i) * V, V, cdf_.data() + static_cast<size_t>(i) * V);
  }
  pi_cdf_.resize(V);
  BuildCdf(pi_.data(), V, pi_cdf_.data());
  return absl::OkStatus();
}

double MarkovChain::RowEntropy(int from) const {
  double h = 0;
  for (int j = 0; j < vocab_; ++j) {
    const double x = transition(from, j);
    if (x > 0) h -= x * std::log(x);
  }
  return h;
}

int MarkovChain::Pick(const double* cdf, double u) const {
  return static_cast<int>(std::upper_bound(cdf, cdf + vocab_, u) - cdf);
}

}  // namespace furnace::data
