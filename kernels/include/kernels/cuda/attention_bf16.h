// CUDA causal attention of the bf16 backend table (the arithmetic is ../attention_bf16.h: the
// operands of QK^T, PV and the four backward products rounded to bf16, fp32 accumulation, the
// softmax and its backward in fp32). cuBLAS strided-batched GEMMs over the heads of a sequence
// (cublasGemmStridedBatchedEx, bf16 A/B, fp32 C, CUBLAS_COMPUTE_32F) on bf16 copies in
// `workspace`; the fp32 probabilities are stored in `att` as in attention.h.
// Workspace: device memory of at least *WorkspaceBytes(...) of the same arguments, used only by
// this call's work on `stream` (it may be freed stream-ordered right after). Errors: common.h.
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstddef>

namespace furnace::kernels::cuda {
size_t AttentionForwardBf16WorkspaceBytes(int B, int Tlen, int C, int NH);
void AttentionForwardBf16(float* out,        // (B, T, C)      overwritten
                          float* att,        // (B, NH, T, T)  overwritten (fp32 probabilities)
                          const float* qkv,  // (B, T, 3C)
                          int B, int Tlen, int C, int NH, void* workspace, cublasHandle_t handle,
                          cudaStream_t stream);
// AttentionForwardBf16's att alone (the same casts, products and softmax), without the output.
size_t AttentionProbsBf16WorkspaceBytes(int B, int Tlen, int C, int NH);
void AttentionProbsBf16(float* att,        // (B, NH, T, T)  overwritten (fp32 probabilities)
                        const float* qkv,  // (B, T, 3C)
                        int B, int Tlen, int C, int NH, void* workspace, cublasHandle_t handle,
                        cudaStream_t stream);
size_t AttentionBackwardBf16WorkspaceBytes(int B, int Tlen, int C, int NH);
void AttentionBackwardBf16(float* dqkv,        // (B, T, 3C) accumulated
                           const float* dout,  // (B, T, C)
                           const float* qkv,   // (B, T, 3C)
                           const float* att,   // (B, NH, T, T)
                           int B, int Tlen, int C, int NH, void* workspace, cublasHandle_t handle,
                           cudaStream_t stream);

// The RowStats pair with these roundings (../attention_bf16.h): attention.h's
// AttentionForwardRowStats / AttentionBackwardRowStats (the same query blocks of R rows, row_block
// as there) on the bf16 copies, the block's fp32 P (forward) or rebuilt P (backward) and dS rounded
// into bf16 block scratch before they enter a product; S, dP, the softmax and the stats in fp32.
size_t AttentionForwardRowStatsBf16WorkspaceBytes(int B, int Tlen, int C, int NH,
                                                  int row_block = 0);
void AttentionForwardRowStatsBf16(float* out,        // (B, T, C)      overwritten
                                  float* stats,      // (B, NH, T, 2)  overwritten: (m, r) per row
                                  const float* qkv,  // (B, T, 3C)
                                  int B, int Tlen, int C, int NH, void* workspace,
                                  cublasHandle_t handle, cudaStream_t stream, int row_block = 0);
size_t AttentionBackwardRowStatsBf16WorkspaceBytes(int B, int Tlen, int C, int NH,
                                                   int row_block = 0);
void AttentionBackwardRowStatsBf16(float* dqkv,         // (B, T, 3C) accumulated
                                   const float* dout,   // (B, T, C)
                                   const float* qkv,    // (B, T, 3C)
                                   const float* stats,  // (B, NH, T, 2)
                                   int B, int Tlen, int C, int NH, void* workspace,
                                   cublasHandle_t handle, cudaStream_t stream, int row_block = 0);
}  // namespace furnace::kernels::cuda
