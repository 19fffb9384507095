#include "kernels/optimizer.h"

#include <cmath>
#include <cstdint>

namespace furnace::kernels::cpu {

void AdamWUpdate(float* param, const float* grad, float* m, float* v, int64_t n, float lr,
                 float beta1, float beta2, float eps, float weight_decay, int64_t step) {
  // Bias corrections in double: 1 - beta2^t is tiny for small t and beta2 near 1.
  const float bc1 = static_cast<float>(1.0 - std::pow(static_cast<double>(beta1), step));
  const float bc2 = static_cast<float>(1.0 - std::pow(static_cast<double>(beta2), step));
  const float inv_bc1 = 1.0f / bc1;
  const float inv_bc2 = 1.0f / bc2;
  for (int64_t i = 0; i < n; ++i) {
    const float g = grad[i];
    const float mi = beta1 * m[i] + (1.0f - beta1) * g;
    const float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
    m[i] = mi;
    v[i] = vi;
    const float mhat = mi * inv_bc1;
    const float vhat = vi * inv_bc2;
    param[i] -= lr * (mhat / (std::sqrt(vhat) + eps) + weight_decay * param[i]);
  }
}

double SumOfSquares(const float* x, int64_t n) {
  // Independent accumulators so the loop is not one serial chain of dependent adds (and
  // vectorises); the order is fixed, so the result is reproducible.
  constexpr int kLanes = 8;
  double acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int l = 0; l < kLanes; ++l) acc[l] += static_cast<double>(x[i + l]) * x[i + l];
  }
  for (; i < n; ++i) acc[0] += static_cast<double>(x[i]) * x[i];
  double total = 0;
  for (double a : acc) total += a;
  return total;
}

double SumOfSquaresRanges(const float* x, const int64_t* begin, const int64_t* count, int ranges) {
  double total = 0;
  for (int r = 0; r < ranges; ++r) total += SumOfSquares(x + begin[r], count[r]);
  return total;
}

void Scale(float* x, float s, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] *= s;
}

}  // namespace furnace::kernels::cpu
