// The loops exactly as the model wrote them before they became ops (same order, same rounding), so
// the CPU backend's results did not change when they moved here.
#include "kernels/elementwise.h"

#include <cstdint>

namespace furnace::kernels::cpu {

template <typename T>
void AddInPlace(T* out, const T* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] += x[i];
}

template <typename T>
void BiasResidual(T* out, const T* bias, const T* x, int64_t N, int C) {
  for (int64_t n = 0; n < N; ++n) {
    T* row = out + n * C;
    const T* xr = x + n * C;
    for (int c = 0; c < C; ++c) row[c] = (row[c] + bias[c]) + xr[c];
  }
}

template <typename T>
void AddRow(T* out, const T* row, int64_t N, int C) {
  for (int64_t n = 0; n < N; ++n) {
    T* o = out + n * C;
    for (int c = 0; c < C; ++c) o[c] += row[c];
  }
}

template <typename T>
void Transpose(T* out, const T* inp, int rows, int cols) {
  for (int r = 0; r < rows; ++r) {
    for (int c = 0; c < cols; ++c) out[int64_t{c} * rows + r] = inp[int64_t{r} * cols + c];
  }
}

template void AddInPlace<float>(float*, const float*, int64_t);
template void AddInPlace<double>(double*, const double*, int64_t);
template void BiasResidual<float>(float*, const float*, const float*, int64_t, int);
template void BiasResidual<double>(double*, const double*, const double*, int64_t, int);
template void AddRow<float>(float*, const float*, int64_t, int);
template void AddRow<double>(double*, const double*, int64_t, int);
template void Transpose<float>(float*, const float*, int, int);
template void Transpose<double>(double*, const double*, int, int);

}  // namespace furnace::kernels::cpu
