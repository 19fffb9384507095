// CUDA reduced-precision casts (see ../cast.h): bf16 round-to-nearest-even; fp8 e4m3 with one
// fp32 scale per block (scale = amax / 448, saturating; an all-zero block gets scale 1, as the
// CPU). Codes match the CPU's bit for bit (both round to nearest even). Errors: common.h.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace furnace::kernels::cuda {
void CastF32ToBf16(uint16_t* out, const float* inp, int64_t n, cudaStream_t stream);
void CastBf16ToF32(float* out, const uint16_t* inp, int64_t n, cudaStream_t stream);
// scales has ceil(n / block) entries.
void QuantizeFp8E4M3(uint8_t* out, float* scales, const float* inp, int64_t n, int block,
                     cudaStream_t stream);
void DequantizeFp8E4M3(float* out, const uint8_t* inp, const float* scales, int64_t n, int block,
                       cudaStream_t stream);
}  // namespace furnace::kernels::cuda
