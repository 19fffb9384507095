// Private to kernels/cpu: exp for the hot loops (softmax rows, cross-entropy over the vocabulary,
// GELU). libm's expf/tanhf are scalar calls that GCC does not vectorise without -ffast-math, and at
// -O2 GCC 12 only vectorises loops whose trip count is a multiple of the vector width and whose
// pointers cannot alias; so the float paths run fixed-size chunks on __restrict pointers.
//
// Exp(float) is the Cephes expf scheme (range reduction by ln 2 in two parts, degree-6 polynomial,
// exponent assembled from bits): about 1 ulp over [-87.3, 88], clamped outside (exp(-100) returns
// ~1e-38, not 0); NaN propagates. Exp(double) is std::exp, so the finite-difference tests see libm.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>

#if defined(__SSE__)
#include <xmmintrin.h>
#endif

namespace furnace::kernels::cpu::internal {

inline constexpr int kChunk = 16;

// The two halves of Exp(float) are separate functions because GCC (-O2, -ftrapping-math) will not
// if-convert the clamp when arithmetic follows it in the same loop: chunk loops clamp into a local
// array first, then run the polynomial.
inline float ExpClamp(float x) {
  x = x < -87.33654f ? -87.33654f : x;
  return x > 88.0f ? 88.0f : x;
}
inline float ExpClamped(float x) {
  // n = round(x / ln 2) with the 1.5 * 2^23 trick (exact for |x / ln 2| < 2^22).
  const float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  const float r = (x - n * 0.693359375f) - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  return p * std::bit_cast<float>(bits);
}
inline float Exp(float x) { return ExpClamped(ExpClamp(x)); }
inline double Exp(double x) { return std::exp(x); }

// out[j] = Exp(in[j]) for j < kChunk. On x86 the clamp is MAXPS / MINPS, which GCC does not emit
// for ExpClamp's selects at -O2 (it branched per element: a quarter of GELU's time). Same
// results bit for bit: MAXPS(lo, x) is lo > x ? lo : x and MINPS(hi, x) is hi < x ? hi : x, each
// returning its second operand x when either is NaN, exactly as ExpClamp's selects do.
inline void ExpChunk(float* __restrict out, const float* __restrict in) {
  float t[kChunk];
#if defined(__SSE__)
  const __m128 lo = _mm_set1_ps(-87.33654f), hi = _mm_set1_ps(88.0f);
  for (int j = 0; j < kChunk; j += 4) {
    _mm_storeu_ps(t + j, _mm_min_ps(hi, _mm_max_ps(lo, _mm_loadu_ps(in + j))));
  }
#else
  for (int j = 0; j < kChunk; ++j) t[j] = ExpClamp(in[j]);
#endif
  for (int j = 0; j < kChunk; ++j) out[j] = ExpClamped(t[j]);
}
inline void ExpChunk(double* __restrict out, const double* __restrict in) {
  for (int j = 0; j < kChunk; ++j) out[j] = std::exp(in[j]);
}

// out[i] = Exp(in[i] - shift); returns the sum of the results. out == in is allowed.
template <typename T>
T ExpShifted(T* out, const T* in, T shift, int64_t n) {
  int64_t i = 0;
  T acc[kChunk] = {};
  for (; i + kChunk <= n; i += kChunk) {
    T t[kChunk], e[kChunk];
    for (int j = 0; j < kChunk; ++j) t[j] = in[i + j] - shift;
    ExpChunk(e, t);
    for (int j = 0; j < kChunk; ++j) {
      out[i + j] = e[j];
      acc[j] += e[j];
    }
  }
  T sum = 0;
  for (; i < n; ++i) sum += (out[i] = Exp(in[i] - shift));
  for (int j = 0; j < kChunk; ++j) sum += acc[j];
  return sum;
}

template <typename T>
T Max(const T* x, int64_t n) {
  T m = x[0];
  int64_t i = 0;
  if (n >= kChunk) {
    T acc[kChunk];
    for (int j = 0; j < kChunk; ++j) acc[j] = x[j];
    for (i = kChunk; i + kChunk <= n; i += kChunk) {
      for (int j = 0; j < kChunk; ++j) acc[j] = x[i + j] > acc[j] ? x[i + j] : acc[j];
    }
    for (int j = 0; j < kChunk; ++j) m = acc[j] > m ? acc[j] : m;
  }
  for (; i < n; ++i) m = x[i] > m ? x[i] : m;
  return m;
}

template <typename T>
void ScaleInPlace(T* x, T s, int64_t n) {
  int64_t i = 0;
  for (; i + kChunk <= n; i += kChunk) {
    T* __restrict c = x + i;
    for (int j = 0; j < kChunk; ++j) c[j] *= s;
  }
  for (; i < n; ++i) x[i] *= s;
}

// y[i] += a * x[i]; x and y must not overlap.
template <typename T>
void Axpy(T* __restrict y, T a, const T* __restrict x, int64_t n) {
  int64_t i = 0;
  for (; i + kChunk <= n; i += kChunk) {
    for (int j = 0; j < kChunk; ++j) y[i + j] += a * x[i + j];
  }
  for (; i < n; ++i) y[i] += a * x[i];
}

}  // namespace furnace::kernels::cpu::internal
