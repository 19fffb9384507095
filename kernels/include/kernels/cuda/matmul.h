// CUDA dense and grouped GEMMs through cuBLAS (see ../matmul.h for the contract). fp32 GEMMs use
// cublasSgemm in full fp32 (no TF32). Row-major (N, C) @ (C, OC) is computed as the column-major
// product out^T = weight^T inp^T, so no transposes are materialised. Errors: common.h.
#pragma once
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace furnace::kernels::cuda {
void MatmulForward(float* out,           // (N, OC) overwritten
                   const float* inp,     // (N, C)
                   const float* weight,  // (C, OC)
                   const float* bias,    // (OC) or nullptr
                   int N, int C, int OC, cublasHandle_t handle, cudaStream_t stream);
void MatmulBackward(float* dinp,          // (N, C)  accumulated; may be nullptr
                    float* dweight,       // (C, OC) accumulated
                    float* dbias,         // (OC)    accumulated or nullptr
                    const float* dout,    // (N, OC)
                    const float* inp,     // (N, C)
                    const float* weight,  // (C, OC)
                    int N, int C, int OC, cublasHandle_t handle, cudaStream_t stream);

// bf16 storage, fp32 accumulation (cublasGemmEx, CUBLAS_COMPUTE_32F); bias added in fp32 by the
// GEMM epilogue before the single rounding of out to bf16. (The bf16 backend table's GEMMs, fp32
// in and out with bf16 operands, are matmul_bf16.h.)
void MatmulForwardBf16Storage(__nv_bfloat16* out,           // (N, OC) overwritten
                              const __nv_bfloat16* inp,     // (N, C)
                              const __nv_bfloat16* weight,  // (C, OC)
                              const __nv_bfloat16* bias,    // (OC) or nullptr
                              int N, int C, int OC, cublasHandle_t handle, cudaStream_t stream);

// Grouped (per-expert) GEMMs. `offsets` is HOST memory (E + 1 entries): cuBLAS needs the group
// sizes on the host, so the dispatch plan's offsets are kept there (they are known before the
// expert buffers are sized anyway). One GEMM per non-empty group on `stream`.
void GroupedMatmulForward(float* out,              // (S, OC) overwritten, S = offsets[E]
                          const float* inp,        // (S, C)
                          const float* weight,     // (E, C, OC)
                          const float* bias,       // (E, OC) or nullptr
                          const int64_t* offsets,  // (E + 1) HOST
                          int E, int C, int OC, cublasHandle_t handle, cudaStream_t stream);
void GroupedMatmulBackward(float* dinp,             // (S, C)     accumulated; may be nullptr
                           float* dweight,          // (E, C, OC) accumulated
                           float* dbias,            // (E, OC)    accumulated or nullptr
                           const float* dout,       // (S, OC)
                           const float* inp,        // (S, C)
                           const float* weight,     // (E, C, OC)
                           const int64_t* offsets,  // (E + 1) HOST
                           int E, int C, int OC, cublasHandle_t handle, cudaStream_t stream);
}  // namespace furnace::kernels::cuda
