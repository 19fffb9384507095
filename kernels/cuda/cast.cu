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

// The bf16 bits of f as the CPU oracle rounds it (kernels/cpu/cast.cc F32ToBf16): nearest even,
// and a NaN keeps its sign and the top of its payload, made quiet. __float2bfloat16_rn turns every
// NaN into 0x7FFF, which would make a NaN tensor's bits differ from the CPU's.
__device__ __forceinline__ uint16_t Bf16Bits(float f) {
  const uint32_t bits = __float_as_uint(f);
  if ((bits & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((bits >> 16) | 0x0040u);
  return __bfloat16_as_ushort(__float2bfloat16_rn(f));
}

__global__ void F32ToBf16Kernel(uint16_t* out, const float* inp, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    out[i] = Bf16Bits(inp[i]);
  }
}

// 4 elements per step from 16-byte loads (inp 16-byte aligned), 8-byte stores.
__global__ void F32ToBf16x4Kernel(__nv_bfloat16* out, const float4* inp, int64_t n4) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n4;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float4 v = inp[i];
    // One 8-byte store of the four (as the CPU rounds them, NaNs included).
    const uint2 packed{Bf16Bits(v.x) | (uint32_t{Bf16Bits(v.y)} << 16),
                       Bf16Bits(v.z) | (uint32_t{Bf16Bits(v.w)} << 16)};
    *reinterpret_cast<uint2*>(out + 4 * i) = packed;
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
  // As the CPU: an all-zero block gets 1; the scale is at least the smallest subnormal (1.4e-45).
  float scale = amax > 0.0f ? fmaxf(amax / kE4M3Max, 1.40129846e-45f) : 1.0f;
  if (threadIdx.x == 0) scales[blockIdx.x] = scale;
  // Divided, as the CPU: a subnormal scale's reciprocal would overflow (0 * inf = NaN).
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    out[i] = static_cast<uint8_t>(__nv_cvt_float_to_fp8(inp[i] / scale, __NV_SATFINITE, __NV_E4M3));
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

FURNACE_PRELOAD_KERNELS(F32ToBf16Kernel, F32ToBf16x4Kernel, Bf16ToF32Kernel, QuantizeKernel,
                        DequantizeKernel);

}  // namespace

namespace internal {
void ToBf16(__nv_bfloat16* out, const float* inp, int64_t n, cudaStream_t stream, const char* op) {
  if (n <= 0) return;
  const bool aligned =
      reinterpret_cast<uintptr_t>(inp) % 16 == 0 && reinterpret_cast<uintptr_t>(out) % 8 == 0;
  int64_t done = 0;
  if (aligned && n >= 4) {
    const int64_t n4 = n / 4;
    F32ToBf16x4Kernel<<<GridFor(n4, kBlock), kBlock, 0, stream>>>(
        out, reinterpret_cast<const float4*>(inp), n4);
    if (!FURNACE_CHECK_LAUNCH(op)) return;
    done = n4 * 4;
  }
  if (done < n) {
    F32ToBf16Kernel<<<GridFor(n - done, kBlock), kBlock, 0, stream>>>(
        reinterpret_cast<uint16_t*>(out + done), inp + done, n - done);
    FURNACE_CHECK_LAUNCH(op);
  }
}
}  // namespace internal

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
