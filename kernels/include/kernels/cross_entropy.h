// Softmax cross-entropy over the vocabulary, fused: keeps the probabilities for backward.
#pragma once
#include <cstdint>

namespace furnace::kernels::cpu {
template <typename T>
void CrossEntropyForward(T* losses,               // (N) overwritten: -log p[target]
                         T* probs,                // (N, V) overwritten
                         const T* logits,         // (N, V)
                         const int32_t* targets,  // (N)
                         int N, int V);
// dlogits (N, V) accumulated with dloss * (probs - onehot(target)); dloss is the gradient of
// the final loss w.r.t. each token's loss (e.g. 1 / tokens_in_global_batch).
template <typename T>
void CrossEntropyBackward(T* dlogits, const T* probs, const int32_t* targets, T dloss, int N,
                          int V);
}  // namespace furnace::kernels::cpu
