// AdamW (elementwise; bias corrections from the host in double) and the global-norm helpers.
#include <cmath>

#include "common.cuh"
#include "kernels/cuda/optimizer.h"

namespace furnace::kernels::cuda {
namespace {

constexpr int kBlock = 256;

// The CPU's operations in the CPU's order, each rounded on its own: the _rn intrinsics are never
// contracted into FMAs (nvcc contracts a * b + c by default, which moved m by up to 1.6e-8 from
// the CPU's over three steps, past the kernel test's 1e-8 floor), so m, v and param are
// bit-identical to kernels/cpu/optimizer.cc (sqrt and division are IEEE in both).
__global__ void AdamWKernel(float* param, const float* grad, float* m, float* v, int64_t n,
                            float lr, float beta1, float beta2, float eps, float weight_decay,
                            float inv_correction1, float inv_correction2) {
  const float one_minus_beta1 = __fsub_rn(1.0f, beta1);
  const float one_minus_beta2 = __fsub_rn(1.0f, beta2);
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float g = grad[i];
    const float mi = __fadd_rn(__fmul_rn(beta1, m[i]), __fmul_rn(one_minus_beta1, g));
    const float vi = __fadd_rn(__fmul_rn(beta2, v[i]), __fmul_rn(__fmul_rn(one_minus_beta2, g), g));
    m[i] = mi;
    v[i] = vi;
    const float mhat = __fmul_rn(mi, inv_correction1);
    const float vhat = __fmul_rn(vi, inv_correction2);
    const float p = param[i];
    const float step =
        __fadd_rn(__fdiv_rn(mhat, __fadd_rn(__fsqrt_rn(vhat), eps)), __fmul_rn(weight_decay, p));
    param[i] = __fsub_rn(p, __fmul_rn(lr, step));
  }
}

__global__ void SumOfSquaresKernel(double* partials, const float* x, int64_t n) {
  __shared__ double shared[kBlock / 32];
  double sum = 0.0;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    double v = x[i];
    sum += v * v;
  }
  for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  if (threadIdx.x % 32 == 0) shared[threadIdx.x / 32] = sum;
  __syncthreads();
  if (threadIdx.x == 0) {
    double total = 0.0;
    for (int w = 0; w < kBlock / 32; ++w) total += shared[w];
    partials[blockIdx.x] = total;
  }
}

// One block of kSumOfSquaresPartials threads: the partials added in a fixed tree (the same order
// every run), into (or onto) *out.
static_assert((kSumOfSquaresPartials & (kSumOfSquaresPartials - 1)) == 0 &&
                  kSumOfSquaresPartials <= 1024,
              "the tree over the partials wants a power of two, one block of threads");
__global__ void __launch_bounds__(kSumOfSquaresPartials)
    AddPartialsKernel(double* out, const double* partials, int count, bool accumulate) {
  __shared__ double shared[kSumOfSquaresPartials];
  shared[threadIdx.x] = static_cast<int>(threadIdx.x) < count ? partials[threadIdx.x] : 0.0;
  __syncthreads();
  for (int half = kSumOfSquaresPartials / 2; half > 0; half /= 2) {
    if (static_cast<int>(threadIdx.x) < half) shared[threadIdx.x] += shared[threadIdx.x + half];
    __syncthreads();
  }
  if (threadIdx.x == 0) *out = accumulate ? *out + shared[0] : shared[0];
}

__global__ void ScaleKernel(float* x, float s, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    x[i] *= s;
  }
}

FURNACE_PRELOAD_KERNELS(AdamWKernel, SumOfSquaresKernel, AddPartialsKernel, ScaleKernel);

}  // namespace

void AdamWUpdate(float* param, const float* grad, float* m, float* v, int64_t n, float lr,
                 float beta1, float beta2, float eps, float weight_decay, int64_t step,
                 cudaStream_t stream) {
  if (n <= 0) return;
  // As the CPU: corrections in double (1 - beta2^t is tiny for small t), applied as reciprocals.
  float correction1 = static_cast<float>(1.0 - std::pow(static_cast<double>(beta1), step));
  float correction2 = static_cast<float>(1.0 - std::pow(static_cast<double>(beta2), step));
  AdamWKernel<<<internal::GridFor(n, kBlock), kBlock, 0, stream>>>(
      param, grad, m, v, n, lr, beta1, beta2, eps, weight_decay, 1.0f / correction1,
      1.0f / correction2);
  FURNACE_CHECK_LAUNCH("AdamWUpdate");
}

void SumOfSquares(double* out, double* partials, const float* x, int64_t n, bool accumulate,
                  cudaStream_t stream) {
  if (n > 0) {
    SumOfSquaresKernel<<<kSumOfSquaresPartials, kBlock, 0, stream>>>(partials, x, n);
    if (!FURNACE_CHECK_LAUNCH("SumOfSquares")) return;
  }
  AddPartialsKernel<<<1, kSumOfSquaresPartials, 0, stream>>>(
      out, partials, n > 0 ? kSumOfSquaresPartials : 0, accumulate);
  FURNACE_CHECK_LAUNCH("SumOfSquares");
}

void Scale(float* x, float s, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  ScaleKernel<<<internal::GridFor(n, kBlock), kBlock, 0, stream>>>(x, s, n);
  FURNACE_CHECK_LAUNCH("Scale");
}

}  // namespace furnace::kernels::cuda
