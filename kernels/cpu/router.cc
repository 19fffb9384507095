// MoE router pieces. Top-k is a k-pass selection (E is small): each pass takes the largest
// remaining probability, with a strict comparison in ascending expert order so that ties go to
// the lower expert index. The aux loss reductions accumulate in double whatever T is.
#include "kernels/router.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "fast_math.h"

namespace furnace::kernels::cpu {

template <typename T>
void SoftmaxForward(T* probs, const T* logits, int N, int E) {
  for (int n = 0; n < N; ++n) {
    const T* x = logits + static_cast<int64_t>(n) * E;
    T* p = probs + static_cast<int64_t>(n) * E;
    const T sum = internal::ExpShifted(p, x, internal::Max(x, E), E);
    internal::ScaleInPlace(p, T(1) / sum, E);
  }
}

template <typename T>
void SoftmaxBackward(T* dlogits, const T* dprobs, const T* probs, int N, int E) {
  for (int n = 0; n < N; ++n) {
    const T* dp = dprobs + static_cast<int64_t>(n) * E;
    const T* p = probs + static_cast<int64_t>(n) * E;
    T* dx = dlogits + static_cast<int64_t>(n) * E;
    T dot = 0;
    for (int e = 0; e < E; ++e) dot += p[e] * dp[e];
    for (int e = 0; e < E; ++e) dx[e] += p[e] * (dp[e] - dot);
  }
}

template <typename T>
void TopKForward(int32_t* indices, T* gates, const T* probs, int N, int E, int k, bool normalize) {
  std::vector<uint8_t> taken(E, 0);
  for (int n = 0; n < N; ++n) {
    const T* p = probs + static_cast<int64_t>(n) * E;
    int32_t* idx = indices + static_cast<int64_t>(n) * k;
    T* g = gates + static_cast<int64_t>(n) * k;
    T sum = 0;
    for (int j = 0; j < k; ++j) {
      int best = -1;
      for (int e = 0; e < E; ++e) {
        if (!taken[e] && (best < 0 || p[e] > p[best])) best = e;
      }
      taken[best] = 1;
      idx[j] = best;
      g[j] = p[best];
      sum += p[best];
    }
    for (int j = 0; j < k; ++j) taken[idx[j]] = 0;
    if (normalize) {
      const T inv = T(1) / sum;
      for (int j = 0; j < k; ++j) g[j] *= inv;
    }
  }
}

template <typename T>
void TopKBackward(T* dprobs, const T* dgates, const T* probs, const int32_t* indices, int N, int E,
                  int k, bool normalize) {
  for (int n = 0; n < N; ++n) {
    const T* p = probs + static_cast<int64_t>(n) * E;
    T* dp = dprobs + static_cast<int64_t>(n) * E;
    const int32_t* idx = indices + static_cast<int64_t>(n) * k;
    const T* dg = dgates + static_cast<int64_t>(n) * k;
    if (!normalize) {
      for (int j = 0; j < k; ++j) dp[idx[j]] += dg[j];
      continue;
    }
    // g_j = p_j / S:  dp_i = dg_i / S - sum_j dg_j p_j / S^2
    T s = 0;
    T dot = 0;
    for (int j = 0; j < k; ++j) {
      s += p[idx[j]];
      dot += dg[j] * p[idx[j]];
    }
    const T inv = T(1) / s;
    const T common = dot * inv * inv;
    for (int j = 0; j < k; ++j) dp[idx[j]] += dg[j] * inv - common;
  }
}

namespace {
// counts[e] = routing choices that picked e (dropped or not).
std::vector<int64_t> ChoiceCounts(const int32_t* indices, int N, int E, int k) {
  std::vector<int64_t> counts(E, 0);
  const int64_t total = static_cast<int64_t>(N) * k;
  for (int64_t i = 0; i < total; ++i) ++counts[indices[i]];
  return counts;
}
}  // namespace

template <typename T>
T AuxLossForward(const T* probs, const int32_t* indices, int N, int E, int k, T alpha) {
  if (N == 0) return T(0);
  const std::vector<int64_t> counts = ChoiceCounts(indices, N, E, k);
  std::vector<double> psum(E, 0.0);
  for (int n = 0; n < N; ++n) {
    const T* p = probs + static_cast<int64_t>(n) * E;
    for (int e = 0; e < E; ++e) psum[e] += p[e];
  }
  double acc = 0;
  for (int e = 0; e < E; ++e) {
    const double frac = static_cast<double>(counts[e]) / (static_cast<double>(k) * N);
    acc += frac * (psum[e] / N);
  }
  return static_cast<T>(static_cast<double>(alpha) * E * acc);
}

template <typename T>
void AuxLossBackward(T* dprobs, const int32_t* indices, int N, int E, int k, T alpha, T daux) {
  if (N == 0) return;
  const std::vector<int64_t> counts = ChoiceCounts(indices, N, E, k);
  std::vector<T> coef(E);
  for (int e = 0; e < E; ++e) {
    const double frac = static_cast<double>(counts[e]) / (static_cast<double>(k) * N);
    coef[e] = static_cast<T>(static_cast<double>(daux) * alpha * E * frac / N);
  }
  for (int n = 0; n < N; ++n) {
    T* dp = dprobs + static_cast<int64_t>(n) * E;
    for (int e = 0; e < E; ++e) dp[e] += coef[e];
  }
}

#define FURNACE_INSTANTIATE(T)                                                                \
  template void SoftmaxForward<T>(T*, const T*, int, int);                                    \
  template void SoftmaxBackward<T>(T*, const T*, const T*, int, int);                         \
  template void TopKForward<T>(int32_t*, T*, const T*, int, int, int, bool);                  \
  template void TopKBackward<T>(T*, const T*, const T*, const int32_t*, int, int, int, bool); \
  template T AuxLossForward<T>(const T*, const int32_t*, int, int, int, T);                   \
  template void AuxLossBackward<T>(T*, const int32_t*, int, int, int, T, T);
FURNACE_INSTANTIATE(float)
FURNACE_INSTANTIATE(double)
#undef FURNACE_INSTANTIATE

}  // namespace furnace::kernels::cpu
