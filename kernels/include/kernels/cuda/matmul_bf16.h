// CUDA GEMMs of the bf16 backend table (runtime/device/backend.h "Precision"; the CPU oracle is
// ../matmul_bf16.h): fp32 inputs and fp32 results as matmul.h, but every GEMM operand is first
// rounded to bf16 (round to nearest even, bit-identical to the CPU's rounding) into `workspace`,
// and cublasGemmEx multiplies the bf16 copies with fp32 accumulation (CUDA_R_16BF A and B,
// CUDA_R_32F C, CUBLAS_COMPUTE_32F) into the fp32 output. Bias adds and bias gradients stay fp32.
// Grouped GEMMs: one cublasGemmEx per non-empty group, `offsets` in HOST memory (E + 1) as in
// matmul.h; each operand tensor is cast once for all groups.
//
// Workspace: device memory of at least the *WorkspaceBytes(...) of the same arguments, owned by
// the caller (the backend table allocates it stream-ordered per call), used only by work enqueued
// on `stream` by this call: it may be freed (stream-ordered) right after. Errors: common.h.
// weight16 (optional, device): the weight already rounded to bf16 (a weight mirror,
// runtime/device/weight_mirror.h), read instead of rounding `weight` into the workspace; the
// workspace then needs no room for it (cast_weight false in *WorkspaceBytes).
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace furnace::kernels::cuda {

size_t MatmulForwardBf16WorkspaceBytes(int N, int C, int OC, bool cast_weight = true);
void MatmulForwardBf16(float* out,           // (N, OC) overwritten
                       const float* inp,     // (N, C)
                       const float* weight,  // (C, OC)
                       const float* bias,    // (OC) or nullptr
                       int N, int C, int OC, void* workspace, cublasHandle_t handle,
                       cudaStream_t stream, const __nv_bfloat16* weight16 = nullptr);

// with_dinp: whether dinp is given (the weight is then cast too, unless weight16 is given).
size_t MatmulBackwardBf16WorkspaceBytes(int N, int C, int OC, bool with_dinp,
                                        bool cast_weight = true);
void MatmulBackwardBf16(float* dinp,          // (N, C)  accumulated; may be nullptr
                        float* dweight,       // (C, OC) accumulated
                        float* dbias,         // (OC)    accumulated or nullptr
                        const float* dout,    // (N, OC)
                        const float* inp,     // (N, C)
                        const float* weight,  // (C, OC)
                        int N, int C, int OC, void* workspace, cublasHandle_t handle,
                        cudaStream_t stream, const __nv_bfloat16* weight16 = nullptr);

size_t GroupedMatmulForwardBf16WorkspaceBytes(int64_t S, int E, int C, int OC,
                                              bool cast_weight = true);
void GroupedMatmulForwardBf16(float* out,              // (S, OC) overwritten, S = offsets[E]
                              const float* inp,        // (S, C)
                              const float* weight,     // (E, C, OC)
                              const float* bias,       // (E, OC) or nullptr
                              const int64_t* offsets,  // (E + 1) HOST
                              int E, int C, int OC, void* workspace, cublasHandle_t handle,
                              cudaStream_t stream, const __nv_bfloat16* weight16 = nullptr);

size_t GroupedMatmulBackwardBf16WorkspaceBytes(int64_t S, int E, int C, int OC, bool with_dinp,
                                               bool cast_weight = true);
void GroupedMatmulBackwardBf16(float* dinp,             // (S, C)     accumulated; may be nullptr
                               float* dweight,          // (E, C, OC) accumulated
                               float* dbias,            // (E, OC)    accumulated or nullptr
                               const float* dout,       // (S, OC)
                               const float* inp,        // (S, C)
                               const float* weight,     // (E, C, OC)
                               const int64_t* offsets,  // (E + 1) HOST
                               int E, int C, int OC, void* workspace, cublasHandle_t handle,
                               cudaStream_t stream, const __nv_bfloat16* weight16 = nullptr);
}  // namespace furnace::kernels::cuda
