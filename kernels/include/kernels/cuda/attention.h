// CUDA causal multi-head attention (see ../attention.h for the contract). Per sequence, one
// strided-batched SGEMM over heads forms the scores (scaled) in `att`, a kernel applies the
// causal mask and softmax in place (upper triangle written 0), and a second batched SGEMM forms
// the weighted sum. Errors: common.h.
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstddef>

namespace furnace::kernels::cuda {
void AttentionForward(float* out,        // (B, T, C)      overwritten
                      float* att,        // (B, NH, T, T)  overwritten (probabilities)
                      const float* qkv,  // (B, T, 3C)
                      int B, int Tlen, int C, int NH, cublasHandle_t handle, cudaStream_t stream);
// AttentionForward's att alone (its scores product and softmax, the same calls), without the
// output: the adaptive planner's rebuild of a dropped att (../attention.h AttentionProbs).
void AttentionProbs(float* att,        // (B, NH, T, T)  overwritten (probabilities)
                    const float* qkv,  // (B, T, 3C)
                    int B, int Tlen, int C, int NH, cublasHandle_t handle, cudaStream_t stream);
// Workspace: device memory of at least AttentionBackwardWorkspaceBytes(...) of the same
// arguments (the score gradients of one sequence, NH * T * T floats), used only by this call's
// work on `stream`, so it may be freed stream-ordered right after. The caller allocates it (the
// device's allocator, with its out-of-memory retry), as it does the bf16 kernels' workspaces.
size_t AttentionBackwardWorkspaceBytes(int B, int Tlen, int C, int NH);
void AttentionBackward(float* dqkv,        // (B, T, 3C) accumulated
                       const float* dout,  // (B, T, C)
                       const float* qkv,   // (B, T, 3C)
                       const float* att,   // (B, NH, T, T)
                       int B, int Tlen, int C, int NH, void* workspace, cublasHandle_t handle,
                       cudaStream_t stream);

// The RowStats pair (../attention.h): (B, NH, T, 2) row statistics (m, r) saved instead of the
// probabilities. Each sequence runs in blocks of R query rows [r0, r1), batched over heads, and a
// block multiplies only against keys [0, r1): S = scale Q[r0:r1] K[0:r1]^T into a (NH, r1 - r0,
// r1) scratch, the causal softmax in place (writing m and r), out[r0:r1] = P V[0:r1]; backward
// rebuilds the block's P = exp(S - m) r from the same product and runs the four products of
// AttentionBackward on the block. R: AttentionRowStatsRowBlock, or `row_block` where it is > 0
// (clamped to T; tests force small blocks with it). Workspace: at least *WorkspaceBytes(...) of the
// same arguments (row_block included), used as AttentionBackward's is.
//
// The automatic block: the largest multiple of 64 rows whose (NH, R, T) fp32 scratch fits in
// 64 MiB, at least 64 rows, at most T.
int AttentionRowStatsRowBlock(int Tlen, int NH);
size_t AttentionForwardRowStatsWorkspaceBytes(int B, int Tlen, int C, int NH, int row_block = 0);
void AttentionForwardRowStats(float* out,        // (B, T, C)      overwritten
                              float* stats,      // (B, NH, T, 2)  overwritten: (m, r) per row
                              const float* qkv,  // (B, T, 3C)
                              int B, int Tlen, int C, int NH, void* workspace,
                              cublasHandle_t handle, cudaStream_t stream, int row_block = 0);
size_t AttentionBackwardRowStatsWorkspaceBytes(int B, int Tlen, int C, int NH, int row_block = 0);
void AttentionBackwardRowStats(float* dqkv,         // (B, T, 3C) accumulated
                               const float* dout,   // (B, T, C)
                               const float* qkv,    // (B, T, 3C)
                               const float* stats,  // (B, NH, T, 2)
                               int B, int Tlen, int C, int NH, void* workspace,
                               cublasHandle_t handle, cudaStream_t stream, int row_block = 0);
}  // namespace furnace::kernels::cuda
