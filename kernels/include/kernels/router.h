// MoE router (MODEL.md "The MoE layer"): probabilities p = softmax(logits) in fp32, top-k with
// ties to the lower expert index, gates = the k probabilities, renormalised to sum 1 when
// `normalize`; and the Switch load-balancing loss aux = alpha * E * sum_e frac_e * meanprob_e.
#pragma once
#include <cstdint>

namespace furnace::kernels::cpu {
template <typename T>
void SoftmaxForward(T* probs, const T* logits, int N, int E);  // (N, E) overwritten
template <typename T>
void SoftmaxBackward(T* dlogits,       // (N, E) accumulated
                     const T* dprobs,  // (N, E)
                     const T* probs,   // (N, E)
                     int N, int E);

// indices (N, k) overwritten, in descending probability order; gates (N, k) overwritten.
template <typename T>
void TopKForward(int32_t* indices, T* gates, const T* probs, int N, int E, int k, bool normalize);
// dprobs (N, E) accumulated from dgates (N, k).
template <typename T>
void TopKBackward(T* dprobs, const T* dgates, const T* probs, const int32_t* indices, int N, int E,
                  int k, bool normalize);

// Returns aux; counts every routing choice (dropped or not).
template <typename T>
T AuxLossForward(const T* probs, const int32_t* indices, int N, int E, int k, T alpha);
// dprobs (N, E) accumulated with daux * d aux / d probs (frac_e is piecewise constant).
template <typename T>
void AuxLossBackward(T* dprobs, const int32_t* indices, int N, int E, int k, T alpha, T daux);
}  // namespace furnace::kernels::cpu
