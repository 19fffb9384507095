// GELU, tanh approximation (GPT-2), evaluated through the identity 0.5 (1 + tanh(u)) =
// 1 / (1 + exp(-2u)) = s: out = x s and d out / dx = s + 2 x s (1 - s) du/dx. The sigmoid form
// needs one exp (vectorised for float, see fast_math.h) and has no cancellation for negative x.
// The backward recomputes s from the saved input rather than keeping a second activation buffer.
#include "kernels/gelu.h"

#include <cstdint>

#include "fast_math.h"

namespace furnace::kernels::cpu {
using internal::Exp;
using internal::kChunk;
namespace {
template <typename T>
constexpr T kSqrt2OverPi = T(0.79788456080286535587989211986876);
template <typename T>
constexpr T kCubic = T(0.044715);

template <typename T>
inline T MinusTwoU(T x) {
  return T(-2) * kSqrt2OverPi<T> * (x + kCubic<T> * x * x * x);
}
// d out / dx given s = 1 / (1 + exp(-2u)).
template <typename T>
inline T GradFromSigmoid(T x, T s) {
  const T du = kSqrt2OverPi<T> * (T(1) + T(3) * kCubic<T> * x * x);
  return s + T(2) * x * s * (T(1) - s) * du;
}
}  // namespace

// Chunks of kChunk in local arrays (vectorised exp, and out == inp stays safe); a scalar tail.
template <typename T>
void GeluForward(T* out, const T* inp, int64_t n) {
  int64_t i = 0;
  for (; i + kChunk <= n; i += kChunk) {
    T x[kChunk], a[kChunk], e[kChunk];
    for (int j = 0; j < kChunk; ++j) x[j] = inp[i + j];
    for (int j = 0; j < kChunk; ++j) a[j] = MinusTwoU(x[j]);
    internal::ExpChunk(e, a);
    for (int j = 0; j < kChunk; ++j) out[i + j] = x[j] / (T(1) + e[j]);
  }
  for (; i < n; ++i) out[i] = inp[i] / (T(1) + Exp(MinusTwoU(inp[i])));
}

template <typename T>
void GeluBackward(T* dinp, const T* inp, const T* dout, int64_t n) {
  int64_t i = 0;
  for (; i + kChunk <= n; i += kChunk) {
    T x[kChunk], a[kChunk], e[kChunk], g[kChunk];
    for (int j = 0; j < kChunk; ++j) x[j] = inp[i + j];
    for (int j = 0; j < kChunk; ++j) a[j] = MinusTwoU(x[j]);
    internal::ExpChunk(e, a);
    for (int j = 0; j < kChunk; ++j)
      g[j] = GradFromSigmoid(x[j], T(1) / (T(1) + e[j])) * dout[i + j];
    for (int j = 0; j < kChunk; ++j) dinp[i + j] += g[j];
  }
  for (; i < n; ++i) {
    const T s = T(1) / (T(1) + Exp(MinusTwoU(inp[i])));
    dinp[i] += GradFromSigmoid(inp[i], s) * dout[i];
  }
}

template void GeluForward<float>(float*, const float*, int64_t);
template void GeluForward<double>(double*, const double*, int64_t);
template void GeluBackward<float>(float*, const float*, const float*, int64_t);
template void GeluBackward<double>(double*, const double*, const double*, int64_t);

}  // namespace furnace::kernels::cpu
