// The kernels of cuda_test_kernels.h: one thread block each, nothing to tune.
#include "cuda_test_kernels.h"

namespace furnace::comm::test_kernels {
namespace {

__device__ int64_t Now() {
  int64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void FillKernel(int32_t* out, int64_t n, int32_t base) {
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) out[j] = base + static_cast<int32_t>(j);
}

__global__ void CopyKernel(int32_t* dst, const int32_t* src, int64_t n) {
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) dst[j] = src[j];
}

__global__ void SleepKernel(int64_t nanos) {
  const int64_t until = Now() + nanos;
  while (Now() < until) __nanosleep(1000);
}

__global__ void SpinUntilKernel(const volatile int* flag, int64_t max_nanos) {
  const int64_t until = Now() + max_nanos;
  while (*flag == 0 && Now() < until) __nanosleep(1000);
}

}  // namespace

cudaError_t Preload() {
  cudaFuncAttributes attributes;
  for (const void* kernel :
       {reinterpret_cast<const void*>(FillKernel), reinterpret_cast<const void*>(CopyKernel),
        reinterpret_cast<const void*>(SleepKernel),
        reinterpret_cast<const void*>(SpinUntilKernel)}) {
    if (const cudaError_t e = cudaFuncGetAttributes(&attributes, kernel); e != cudaSuccess) {
      return e;
    }
  }
  return cudaSuccess;
}

cudaError_t Fill(int32_t* out, int64_t n, int32_t base, cudaStream_t stream) {
  FillKernel<<<1, 256, 0, stream>>>(out, n, base);
  return cudaGetLastError();
}

cudaError_t Copy(int32_t* dst, const int32_t* src, int64_t n, cudaStream_t stream) {
  CopyKernel<<<1, 256, 0, stream>>>(dst, src, n);
  return cudaGetLastError();
}

cudaError_t Sleep(int64_t nanos, cudaStream_t stream) {
  SleepKernel<<<1, 1, 0, stream>>>(nanos);
  return cudaGetLastError();
}

cudaError_t SpinUntil(const volatile int* flag, int64_t max_nanos, cudaStream_t stream) {
  SpinUntilKernel<<<1, 1, 0, stream>>>(flag, max_nanos);
  return cudaGetLastError();
}

}  // namespace furnace::comm::test_kernels
