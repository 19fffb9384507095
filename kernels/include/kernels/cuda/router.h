// CUDA MoE router ops (see ../router.h for the contract). Errors: common.h.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace furnace::kernels::cuda {
// Top-k supports k <= kMaxTopK (register arrays); larger k records an error and does nothing.
inline constexpr int kMaxTopK = 16;

void SoftmaxForward(float* probs, const float* logits, int N, int E,
                    cudaStream_t stream);  // (N, E) overwritten
void SoftmaxBackward(float* dlogits,       // (N, E) accumulated
                     const float* dprobs,  // (N, E)
                     const float* probs,   // (N, E)
                     int N, int E, cudaStream_t stream);

// indices (N, k) overwritten in descending probability order (ties to the lower expert index);
// gates (N, k) overwritten.
void TopKForward(int32_t* indices, float* gates, const float* probs, int N, int E, int k,
                 bool normalize, cudaStream_t stream);
// dprobs (N, E) accumulated from dgates (N, k).
void TopKBackward(float* dprobs, const float* dgates, const float* probs, const int32_t* indices,
                  int N, int E, int k, bool normalize, cudaStream_t stream);

// The CPU function returns aux; here it is written to `aux` (ONE float of device memory,
// overwritten) so that no host synchronisation is needed. Deterministic: each expert's term goes
// to `terms` (E floats of device memory, scratch), then they are added in expert order.
void AuxLossForward(float* aux, float* terms, const float* probs, const int32_t* indices, int N,
                    int E, int k, float alpha, cudaStream_t stream);
// dprobs (N, E) accumulated with daux * d aux / d probs.
void AuxLossBackward(float* dprobs, const int32_t* indices, int N, int E, int k, float alpha,
                     float daux, cudaStream_t stream);
}  // namespace furnace::kernels::cuda
