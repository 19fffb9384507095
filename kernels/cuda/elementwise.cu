// Residual adds (grid-stride loops, one element per thread step) and a tiled transpose: a block
// reads a 32 x 32 tile with coalesced loads into padded shared memory (no bank conflicts on the
// column read) and writes it transposed with coalesced stores.
#include "common.cuh"
#include "kernels/cuda/elementwise.h"

namespace furnace::kernels::cuda {
namespace {

constexpr int kBlock = 256;
constexpr int kTile = 32;
constexpr int kTileRows = 8;  // a 32 x 8 block walks the tile's 32 rows in 4 steps

__global__ void AddInPlaceKernel(float* out, const float* x, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    out[i] += x[i];
  }
}

__global__ void BiasResidualKernel(float* out, const float* bias, const float* x, int64_t total,
                                   int C) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * blockDim.x) {
    out[i] = (out[i] + bias[i % C]) + x[i];
  }
}

__global__ void AddRowKernel(float* out, const float* row, int64_t total, int C) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * blockDim.x) {
    out[i] += row[i % C];
  }
}

__global__ void TransposeKernel(float* out, const float* inp, int rows, int cols) {
  __shared__ float tile[kTile][kTile + 1];
  const int c = blockIdx.x * kTile + threadIdx.x;
  for (int j = threadIdx.y; j < kTile; j += kTileRows) {
    const int r = blockIdx.y * kTile + j;
    if (r < rows && c < cols) tile[j][threadIdx.x] = inp[int64_t{r} * cols + c];
  }
  __syncthreads();
  const int r = blockIdx.y * kTile + threadIdx.x;  // the output's column
  for (int j = threadIdx.y; j < kTile; j += kTileRows) {
    const int oc = blockIdx.x * kTile + j;  // the output's row (an input column)
    if (oc < cols && r < rows) out[int64_t{oc} * rows + r] = tile[threadIdx.x][j];
  }
}

FURNACE_PRELOAD_KERNELS(AddInPlaceKernel, BiasResidualKernel, AddRowKernel, TransposeKernel);

}  // namespace

void AddInPlace(float* out, const float* x, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  AddInPlaceKernel<<<internal::GridFor(n, kBlock), kBlock, 0, stream>>>(out, x, n);
  FURNACE_CHECK_LAUNCH("AddInPlace");
}

void BiasResidual(float* out, const float* bias, const float* x, int64_t N, int C,
                  cudaStream_t stream) {
  const int64_t total = N * C;
  if (total <= 0) return;
  BiasResidualKernel<<<internal::GridFor(total, kBlock), kBlock, 0, stream>>>(out, bias, x, total,
                                                                              C);
  FURNACE_CHECK_LAUNCH("BiasResidual");
}

void AddRow(float* out, const float* row, int64_t N, int C, cudaStream_t stream) {
  const int64_t total = N * C;
  if (total <= 0) return;
  AddRowKernel<<<internal::GridFor(total, kBlock), kBlock, 0, stream>>>(out, row, total, C);
  FURNACE_CHECK_LAUNCH("AddRow");
}

void Transpose(float* out, const float* inp, int rows, int cols, cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return;
  const int64_t grid_y = internal::CeilDiv(rows, kTile);
  if (grid_y > 65535) {
    internal::RecordError("Transpose", "argument check", "more than 65535 * 32 rows", __FILE__,
                          __LINE__);
    return;
  }
  dim3 grid(static_cast<unsigned>(internal::CeilDiv(cols, kTile)), static_cast<unsigned>(grid_y));
  TransposeKernel<<<grid, dim3(kTile, kTileRows), 0, stream>>>(out, inp, rows, cols);
  FURNACE_CHECK_LAUNCH("Transpose");
}

}  // namespace furnace::kernels::cuda
