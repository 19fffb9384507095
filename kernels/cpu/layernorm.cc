// LayerNorm as in llm.c: the forward saves mean and 1/std per row; the backward needs two row
// reductions (mean of dnorm and of dnorm * norm) before writing dinp. Rows are short (C), so the
// passes within a row hit cache; accumulation is in T (float for the model, double for tests).
#include "kernels/layernorm.h"

#include <cmath>
#include <cstdint>

namespace furnace::kernels::cpu {

template <typename T>
void LayerNormForward(T* out, T* mean, T* rstd, const T* inp, const T* weight, const T* bias, int N,
                      int C, T eps) {
  for (int n = 0; n < N; ++n) {
    const T* x = inp + static_cast<int64_t>(n) * C;
    T* o = out + static_cast<int64_t>(n) * C;
    T sum = 0;
    for (int c = 0; c < C; ++c) sum += x[c];
    const T m = sum / C;
    T var = 0;
    for (int c = 0; c < C; ++c) {
      const T xm = x[c] - m;
      var += xm * xm;
    }
    const T s = T(1) / std::sqrt(var / C + eps);
    for (int c = 0; c < C; ++c) o[c] = (x[c] - m) * s * weight[c] + bias[c];
    mean[n] = m;
    rstd[n] = s;
  }
}

template <typename T>
void LayerNormBackward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight,
                       const T* mean, const T* rstd, int N, int C) {
  for (int n = 0; n < N; ++n) {
    const T* d = dout + static_cast<int64_t>(n) * C;
    const T* x = inp + static_cast<int64_t>(n) * C;
    T* dx = dinp + static_cast<int64_t>(n) * C;
    const T m = mean[n];
    const T s = rstd[n];
    T dnorm_mean = 0;
    T dnorm_norm_mean = 0;
    for (int c = 0; c < C; ++c) {
      const T norm = (x[c] - m) * s;
      const T dnorm = weight[c] * d[c];
      dnorm_mean += dnorm;
      dnorm_norm_mean += dnorm * norm;
      dbias[c] += d[c];
      dweight[c] += norm * d[c];
    }
    dnorm_mean /= C;
    dnorm_norm_mean /= C;
    for (int c = 0; c < C; ++c) {
      const T norm = (x[c] - m) * s;
      const T dnorm = weight[c] * d[c];
      dx[c] += (dnorm - dnorm_mean - norm * dnorm_norm_mean) * s;
    }
  }
}

#define FURNACE_INSTANTIATE(T)                                                                     \
  template void LayerNormForward<T>(T*, T*, T*, const T*, const T*, const T*, int, int, T);        \
  template void LayerNormBackward<T>(T*, T*, T*, const T*, const T*, const T*, const T*, const T*, \
                                     int, int);
FURNACE_INSTANTIATE(float)
FURNACE_INSTANTIATE(double)
#undef FURNACE_INSTANTIATE

}  // namespace furnace::kernels::cpu
