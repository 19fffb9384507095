// CUDA fused softmax cross-entropy (see ../cross_entropy.h). One block per row. Errors: common.h.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace furnace::kernels::cuda {
void CrossEntropyForward(float* losses,           // (N) overwritten: -log p[target]
                         float* probs,            // (N, V) overwritten
                         const float* logits,     // (N, V)
                         const int32_t* targets,  // (N)
                         int N, int V, cudaStream_t stream);
// dlogits (N, V) accumulated with dloss * (probs - onehot(target)); dloss is a host scalar.
void CrossEntropyBackward(float* dlogits, const float* probs, const int32_t* targets, float dloss,
                          int N, int V, cudaStream_t stream);
}  // namespace furnace::kernels::cuda
