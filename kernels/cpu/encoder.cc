#include "kernels/encoder.h"

#include <cstdint>

namespace furnace::kernels::cpu {

template <typename T>
void EmbeddingForward(T* out, const int32_t* tokens, const T* wte, const T* wpe, int B, int Tlen,
                      int C) {
  for (int b = 0; b < B; ++b) {
    for (int t = 0; t < Tlen; ++t) {
      const int64_t bt = static_cast<int64_t>(b) * Tlen + t;
      T* o = out + bt * C;
      const T* we = wte + static_cast<int64_t>(tokens[bt]) * C;
      const T* pe = wpe + static_cast<int64_t>(t) * C;
      for (int c = 0; c < C; ++c) o[c] = we[c] + pe[c];
    }
  }
}

template <typename T>
void EmbeddingBackward(T* dwte, T* dwpe, const T* dout, const int32_t* tokens, int B, int Tlen,
                       int C) {
  for (int b = 0; b < B; ++b) {
    for (int t = 0; t < Tlen; ++t) {
      const int64_t bt = static_cast<int64_t>(b) * Tlen + t;
      const T* d = dout + bt * C;
      T* dwe = dwte + static_cast<int64_t>(tokens[bt]) * C;
      T* dpe = dwpe + static_cast<int64_t>(t) * C;
      for (int c = 0; c < C; ++c) {
        dwe[c] += d[c];
        dpe[c] += d[c];
      }
    }
  }
}

#define FURNACE_INSTANTIATE(T)                                                              \
  template void EmbeddingForward<T>(T*, const int32_t*, const T*, const T*, int, int, int); \
  template void EmbeddingBackward<T>(T*, T*, const T*, const int32_t*, int, int, int);
FURNACE_INSTANTIATE(float)
FURNACE_INSTANTIATE(double)
#undef FURNACE_INSTANTIATE

}  // namespace furnace::kernels::cpu
