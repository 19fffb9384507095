// LayerNorm over the last dimension, eps given (MODEL.md: 1e-5), biased variance.
#pragma once

namespace furnace::kernels::cpu {
template <typename T>
void LayerNormForward(T* out,           // (N, C)  overwritten
                      T* mean,          // (N)     overwritten (saved for backward)
                      T* rstd,          // (N)     overwritten (saved for backward)
                      const T* inp,     // (N, C)
                      const T* weight,  // (C)
                      const T* bias,    // (C)
                      int N, int C, T eps);
template <typename T>
void LayerNormBackward(T* dinp,          // (N, C) accumulated
                       T* dweight,       // (C)    accumulated
                       T* dbias,         // (C)    accumulated
                       const T* dout,    // (N, C)
                       const T* inp,     // (N, C)
                       const T* weight,  // (C)
                       const T* mean,    // (N)
                       const T* rstd,    // (N)
                       int N, int C);
}  // namespace furnace::kernels::cpu
