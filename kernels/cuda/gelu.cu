// GELU (tanh approximation), elementwise with a grid-stride loop.
#include "common.cuh"
#include "kernels/cuda/gelu.h"

namespace furnace::kernels::cuda {
namespace {

constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr int kBlock = 256;

__global__ void GeluForwardKernel(float* out, const float* inp, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    float x = inp[i];
    float cube = 0.044715f * x * x * x;
    out[i] = 0.5f * x * (1.0f + tanhf(kSqrt2OverPi * (x + cube)));
  }
}

__global__ void GeluBackwardKernel(float* dinp, const float* inp, const float* dout, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    float x = inp[i];
    float cube = 0.044715f * x * x * x;
    float arg = kSqrt2OverPi * (x + cube);
    float th = tanhf(arg);
    float sech2 = 1.0f - th * th;
    float local =
        0.5f * (1.0f + th) + 0.5f * x * sech2 * kSqrt2OverPi * (1.0f + 3.0f * 0.044715f * x * x);
    dinp[i] += local * dout[i];
  }
}

}  // namespace

void GeluForward(float* out, const float* inp, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  GeluForwardKernel<<<internal::GridFor(n, kBlock), kBlock, 0, stream>>>(out, inp, n);
  FURNACE_CHECK_LAUNCH("GeluForward");
}

void GeluBackward(float* dinp, const float* inp, const float* dout, int64_t n,
                  cudaStream_t stream) {
  if (n <= 0) return;
  GeluBackwardKernel<<<internal::GridFor(n, kBlock), kBlock, 0, stream>>>(dinp, inp, dout, n);
  FURNACE_CHECK_LAUNCH("GeluBackward");
}

}  // namespace furnace::kernels::cuda
