// Elementwise and layout ops of the residual stream and the head: the adds and the transpose that
// model code used to write as host loops, so that they run on the model's device like every other
// op (runtime/device/backend.h). Plain loops in this order on the CPU, so a model that moved from
// host loops to these computes bit-identical results.
#pragma once
#include <cstdint>

namespace furnace::kernels::cpu {
// out[i] += x[i]. out, x (n).
template <typename T>
void AddInPlace(T* out, const T* x, int64_t n);
// out[n, c] = (out[n, c] + bias[c]) + x[n, c]: a row-parallel GEMM's summed partial output
// finished with its bias and the residual. out, x (N, C); bias (C).
template <typename T>
void BiasResidual(T* out, const T* bias, const T* x, int64_t N, int C);
// out[n, c] += row[c]. out (N, C); row (C).
template <typename T>
void AddRow(T* out, const T* row, int64_t N, int C);
// out (cols, rows) overwritten with inp (rows, cols) transposed.
template <typename T>
void Transpose(T* out, const T* inp, int rows, int cols);
}  // namespace furnace::kernels::cpu
