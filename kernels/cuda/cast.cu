// bf16 and fp8-e4m3 casts with the hardware conversions (round to nearest even; e4m3 saturating
// to +-448). Quantisation: one block per scale block (amax, then codes).
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include "common.cuh"
#include "kernels/cuda/cast.h"

namespace furnace::kernels::cuda {
namespace {

constexpr int kBlock = 256;
constexpr float kE4M3Max = 448.0f;

__global__ void F32ToBf16Kernel(uint16_t* out, const float* inp, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    out[i] = __bfloat16_as_ushort(__float2bfloat16_rn(inp[i]));
  }
}

__global__ void Bf16ToF32Kernel(float* out, const uint16_t* inp, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    out[i] = __bfloat162float(__ushort_as_bfloat16(inp[i]));
  }
}

__global__ void QuantizeKernel(uint8_t* out, float* scales, const float* inp, int64_t n,
                               int block) {
  __shared__ float shared[32];
  int64_t begin = int64_t{blockIdx.x} * block;
  int64_t end = begin + block < n ? begin + block : n;
  float amax = 0.0f;
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) amax = fmaxf(amax, fabsf(inp[i]));
  amax = internal::BlockMax(amax, shared);
  float scale = amax > 0.0f ? amax / kE4M3Max : 1.0f;  // as the CPU: an all-zero block gets 1
  if (threadIdx.x == 0) scales[blockIdx.x] = scale;
  float inv = 1.0f / scale;
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    out[i] = static_cast<uint8_t>(__nv_cvt_float_to_fp8(inp[i] * inv, __NV_SATFINITE, __NV_E4M3));
  }
}

__global__ void DequantizeKernel(float* out, const uint8_t* inp, const float* scales, int64_t n,
                                 int block) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    __half_raw h = __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(inp[i]), __NV_E4M3);
    out[i] = __half2float(__half(h)) * scales[i / block];
  }
}

}  // namespace

void CastF32ToBf16(uint16_t* out, const float* inp, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  F32ToBf16Kernel<<<internal::GridFor(n, kBlock), kBlock, 0, stream>>>(out, inp, n);
  FURNACE_CHECK_LAUNCH("CastF32ToBf16");
}

void CastBf16ToF32(float* out, const uint16_t* inp, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  Bf16ToF32Kernel<<<internal::GridFor(n, kBlock), kBlock, 0, stream>>>(out, inp, n);
  FURNACE_CHECK_LAUNCH("CastBf16ToF32");
}

void QuantizeFp8E4M3(uint8_t* out, float* scales, const float* inp, int64_t n, int block,
                     cudaStream_t stream) {
  if (block <= 0) {
    internal::RecordError("QuantizeFp8E4M3", "argument check", "block must be positive", __FILE__,
                          __LINE__);
    return;
  }
  if (n <= 0) return;
  int64_t blocks = internal::CeilDiv(n, block);
  QuantizeKernel<<<static_cast<unsigned>(blocks), kBlock, 0, stream>>>(out, scales, inp, n, block);
  FURNACE_CHECK_LAUNCH("QuantizeFp8E4M3");
}

void DequantizeFp8E4M3(float* out, const uint8_t* inp, const float* scales, int64_t n, int block,
                       cudaStream_t stream) {
  if (block <= 0) {
    internal::RecordError("DequantizeFp8E4M3", "argument check", "block must be positive", __FILE__,
                          __LINE__);
    return;
  }
  if (n <= 0) return;
  DequantizeKernel<<<internal::GridFor(n, kBlock), kBlock, 0, stream>>>(out, inp, scales, n, block);
  FURNACE_CHECK_LAUNCH("DequantizeFp8E4M3");
}

}  // namespace furnace::kernels::cuda
