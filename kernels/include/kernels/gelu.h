// GELU, tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
#pragma once
#include <cstdint>

namespace furnace::kernels::cpu {
template <typename T>
void GeluForward(T* out, const T* inp, int64_t n);  // out overwritten
template <typename T>
void GeluBackward(T* dinp, const T* inp, const T* dout, int64_t n);  // dinp accumulated
}  // namespace furnace::kernels::cpu
