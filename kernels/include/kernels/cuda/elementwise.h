// CUDA elementwise and layout ops of the residual stream and the head (see ../elementwise.h).
// The adds are in the CPU's order ((out + bias) + x), so they are bit-identical to it; the
// transpose moves bits. add_row's `row` is DEVICE memory here (the backend table uploads the
// host row of its contract). Errors: common.h.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace furnace::kernels::cuda {
// out[i] += x[i]. out, x (n).
void AddInPlace(float* out, const float* x, int64_t n, cudaStream_t stream);
// out[n, c] = (out[n, c] + bias[c]) + x[n, c]. out, x (N, C); bias (C).
void BiasResidual(float* out, const float* bias, const float* x, int64_t N, int C,
                  cudaStream_t stream);
// out[n, c] += row[c]. out (N, C); row (C), device memory.
void AddRow(float* out, const float* row, int64_t N, int C, cudaStream_t stream);
// out (cols, rows) overwritten with inp (rows, cols) transposed (32 x 32 shared-memory tiles).
void Transpose(float* out, const float* inp, int rows, int cols, cudaStream_t stream);
}  // namespace furnace::kernels::cuda
