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
}  // namespace furnace::kernels::cuda
