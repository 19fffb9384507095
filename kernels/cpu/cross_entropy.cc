// Fused softmax cross-entropy. Stable: the row max is subtracted before exp, and the loss is
// taken as log(sum) - (logit[target] - max) rather than -log(prob), which keeps precision when the
// target's probability underflows.
#include "kernels/cross_entropy.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "fast_math.h"

namespace furnace::kernels::cpu {

template <typename T>
void CrossEntropyForward(T* losses, T* probs, const T* logits, const int32_t* targets, int N,
                         int V) {
  for (int n = 0; n < N; ++n) {
    const T* x = logits + static_cast<int64_t>(n) * V;
    T* p = probs + static_cast<int64_t>(n) * V;
    const T mx = internal::Max(x, V);
    const T sum = internal::ExpShifted(p, x, mx, V);
    internal::ScaleInPlace(p, T(1) / sum, V);
    losses[n] = std::log(sum) - (x[targets[n]] - mx);
  }
}

template <typename T>
void CrossEntropyBackward(T* dlogits, const T* probs, const int32_t* targets, T dloss, int N,
                          int V) {
  for (int n = 0; n < N; ++n) {
    const T* p = probs + static_cast<int64_t>(n) * V;
    T* d = dlogits + static_cast<int64_t>(n) * V;
    internal::Axpy(d, dloss, p, V);
    d[targets[n]] -= dloss;
  }
}

#define FURNACE_INSTANTIATE(T)                                                      \
  template void CrossEntropyForward<T>(T*, T*, const T*, const int32_t*, int, int); \
  template void CrossEntropyBackward<T>(T*, const T*, const int32_t*, T, int, int);
FURNACE_INSTANTIATE(float)
FURNACE_INSTANTIATE(double)
#undef FURNACE_INSTANTIATE

}  // namespace furnace::kernels::cpu
