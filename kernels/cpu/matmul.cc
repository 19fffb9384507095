// Dense and grouped GEMMs through cblas (sgemm for float, dgemm for double). The forward writes
// the bias into out and lets the GEMM accumulate (beta = 1), so the bias costs one pass over out.
// The backward accumulates into the caller's buffers with beta = 1:
//   dinp += dout @ weight^T,   dweight += inp^T @ dout,   dbias += column sums of dout.
#include "kernels/matmul.h"

#include <cstdint>

#include "gemm.h"

namespace furnace::kernels::cpu {
using internal::Gemm;

template <typename T>
void MatmulForward(T* out, const T* inp, const T* weight, const T* bias, int N, int C, int OC) {
  if (N == 0 || OC == 0) return;
  T beta = 0;
  if (bias != nullptr) {
    for (int n = 0; n < N; ++n) {
      T* o = out + static_cast<int64_t>(n) * OC;
      for (int j = 0; j < OC; ++j) o[j] = bias[j];
    }
    beta = 1;
  }
  Gemm(false, false, N, OC, C, T(1), inp, C, weight, OC, beta, out, OC);
}

template <typename T>
void MatmulBackward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight,
                    int N, int C, int OC) {
  if (N == 0) return;
  if (dinp != nullptr) Gemm(false, true, N, C, OC, T(1), dout, OC, weight, OC, T(1), dinp, C);
  Gemm(true, false, C, OC, N, T(1), inp, C, dout, OC, T(1), dweight, OC);
  if (dbias != nullptr) {
    for (int n = 0; n < N; ++n) {
      const T* d = dout + static_cast<int64_t>(n) * OC;
      for (int j = 0; j < OC; ++j) dbias[j] += d[j];
    }
  }
}

template <typename T>
void GroupedMatmulForward(T* out, const T* inp, const T* weight, const T* bias,
                          const int64_t* offsets, int E, int C, int OC) {
  for (int e = 0; e < E; ++e) {
    const int64_t begin = offsets[e];
    const int rows = static_cast<int>(offsets[e + 1] - begin);
    if (rows == 0) continue;
    MatmulForward(out + begin * OC, inp + begin * C, weight + static_cast<int64_t>(e) * C * OC,
                  bias == nullptr ? nullptr : bias + static_cast<int64_t>(e) * OC, rows, C, OC);
  }
}

template <typename T>
void GroupedMatmulBackward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp,
                           const T* weight, const int64_t* offsets, int E, int C, int OC) {
  for (int e = 0; e < E; ++e) {
    const int64_t begin = offsets[e];
    const int rows = static_cast<int>(offsets[e + 1] - begin);
    if (rows == 0) continue;
    const int64_t w = static_cast<int64_t>(e) * C * OC;
    MatmulBackward(dinp == nullptr ? nullptr : dinp + begin * C, dweight + w,
                   dbias == nullptr ? nullptr : dbias + static_cast<int64_t>(e) * OC,
                   dout + begin * OC, inp + begin * C, weight + w, rows, C, OC);
  }
}

#define FURNACE_INSTANTIATE(T)                                                                     \
  template void MatmulForward<T>(T*, const T*, const T*, const T*, int, int, int);                 \
  template void MatmulBackward<T>(T*, T*, T*, const T*, const T*, const T*, int, int, int);        \
  template void GroupedMatmulForward<T>(T*, const T*, const T*, const T*, const int64_t*, int,     \
                                        int, int);                                                 \
  template void GroupedMatmulBackward<T>(T*, T*, T*, const T*, const T*, const T*, const int64_t*, \
                                         int, int, int);
FURNACE_INSTANTIATE(float)
FURNACE_INSTANTIATE(double)
#undef FURNACE_INSTANTIATE

}  // namespace furnace::kernels::cpu
