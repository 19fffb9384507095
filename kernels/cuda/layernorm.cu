// LayerNorm: one warp per row for the forward and for dinp (two-pass mean/variance in fp32, as
// the CPU oracle); dweight/dbias need dout * xhat and dout summed over rows, done by a
// deterministic column-strip kernel that recomputes xhat instead of storing it.
#include "common.cuh"
#include "kernels/cuda/layernorm.h"

namespace furnace::kernels::cuda {
namespace {

constexpr int kWarpsPerBlock = 8;

__global__ void LayerNormForwardKernel(float* out, float* mean, float* rstd, const float* inp,
                                       const float* weight, const float* bias, int N, int C,
                                       float eps) {
  int row = blockIdx.x * kWarpsPerBlock + threadIdx.x / 32;
  int lane = threadIdx.x % 32;
  if (row >= N) return;
  const float* x = inp + int64_t{row} * C;
  float sum = 0.0f;
  for (int c = lane; c < C; c += 32) sum += x[c];
  float m = internal::WarpSum(sum) / C;
  float var = 0.0f;
  for (int c = lane; c < C; c += 32) {
    float d = x[c] - m;
    var += d * d;
  }
  float s = rsqrtf(internal::WarpSum(var) / C + eps);
  float* o = out + int64_t{row} * C;
  for (int c = lane; c < C; c += 32) o[c] = (x[c] - m) * s * weight[c] + bias[c];
  if (lane == 0) {
    mean[row] = m;
    rstd[row] = s;
  }
}

__global__ void LayerNormBackwardInputKernel(float* dinp, const float* dout, const float* inp,
                                             const float* weight, const float* mean,
                                             const float* rstd, int N, int C) {
  int row = blockIdx.x * kWarpsPerBlock + threadIdx.x / 32;
  int lane = threadIdx.x % 32;
  if (row >= N) return;
  const float* x = inp + int64_t{row} * C;
  const float* dy = dout + int64_t{row} * C;
  float m = mean[row], s = rstd[row];
  float dnorm_mean = 0.0f, dnorm_norm_mean = 0.0f;
  for (int c = lane; c < C; c += 32) {
    float xhat = (x[c] - m) * s;
    float dnorm = weight[c] * dy[c];
    dnorm_mean += dnorm;
    dnorm_norm_mean += dnorm * xhat;
  }
  dnorm_mean = internal::WarpSum(dnorm_mean) / C;
  dnorm_norm_mean = internal::WarpSum(dnorm_norm_mean) / C;
  float* dx = dinp + int64_t{row} * C;
  for (int c = lane; c < C; c += 32) {
    float xhat = (x[c] - m) * s;
    float dnorm = weight[c] * dy[c];
    dx[c] += (dnorm - dnorm_mean - xhat * dnorm_norm_mean) * s;
  }
}

// dweight/dbias as common.cu's ColumnSumAccumulate: strips of 8 columns (whole 32-byte sectors
// per warp row when C is a multiple of 8; C / 8 blocks, two per SM), 128 row lanes, then a tree
// over the lanes; deterministic.
constexpr int kStrip = 8;
constexpr int kRows = 128;

__global__ void __launch_bounds__(kStrip* kRows, 2)
    LayerNormBackwardParamKernel(float* dweight, float* dbias, const float* dout, const float* inp,
                                 const float* mean, const float* rstd, int N, int C) {
  __shared__ float pw[kRows][kStrip];
  __shared__ float pb[kRows][kStrip];
  const int c = blockIdx.x * kStrip + threadIdx.x;
  float sw = 0.0f, sb = 0.0f;
  if (c < C) {
    for (int64_t n = threadIdx.y; n < N; n += kRows) {
      int64_t i = n * C + c;
      float dy = dout[i];
      sw += dy * (inp[i] - mean[n]) * rstd[n];
      sb += dy;
    }
  }
  pw[threadIdx.y][threadIdx.x] = sw;
  pb[threadIdx.y][threadIdx.x] = sb;
  __syncthreads();
  for (int half = kRows / 2; half > 0; half /= 2) {
    if (threadIdx.y < half) {
      pw[threadIdx.y][threadIdx.x] += pw[threadIdx.y + half][threadIdx.x];
      pb[threadIdx.y][threadIdx.x] += pb[threadIdx.y + half][threadIdx.x];
    }
    __syncthreads();
  }
  if (threadIdx.y == 0 && c < C) {
    dweight[c] += pw[0][threadIdx.x];
    dbias[c] += pb[0][threadIdx.x];
  }
}

FURNACE_PRELOAD_KERNELS(LayerNormForwardKernel, LayerNormBackwardInputKernel,
                        LayerNormBackwardParamKernel);

}  // namespace

void LayerNormForward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                      const float* bias, int N, int C, float eps, cudaStream_t stream) {
  if (N <= 0 || C <= 0) return;
  unsigned grid = static_cast<unsigned>(internal::CeilDiv(N, kWarpsPerBlock));
  LayerNormForwardKernel<<<grid, kWarpsPerBlock * 32, 0, stream>>>(out, mean, rstd, inp, weight,
                                                                   bias, N, C, eps);
  FURNACE_CHECK_LAUNCH("LayerNormForward");
}

void LayerNormBackward(float* dinp, float* dweight, float* dbias, const float* dout,
                       const float* inp, const float* weight, const float* mean, const float* rstd,
                       int N, int C, cudaStream_t stream) {
  if (N <= 0 || C <= 0) return;
  unsigned grid = static_cast<unsigned>(internal::CeilDiv(N, kWarpsPerBlock));
  LayerNormBackwardInputKernel<<<grid, kWarpsPerBlock * 32, 0, stream>>>(dinp, dout, inp, weight,
                                                                         mean, rstd, N, C);
  FURNACE_CHECK_LAUNCH("LayerNormBackward");
  LayerNormBackwardParamKernel<<<static_cast<unsigned>(internal::CeilDiv(C, kStrip)),
                                 dim3(kStrip, kRows), 0, stream>>>(dweight, dbias, dout, inp, mean,
                                                                   rstd, N, C);
  FURNACE_CHECK_LAUNCH("LayerNormBackward");
}

}  // namespace furnace::kernels::cuda
