// Dense and grouped (per-expert) GEMMs: out = inp @ weight + bias with weight (C, OC).
// CPU: float goes through OpenBLAS cblas_sgemm (single-threaded per rank by default); double
// through cblas_dgemm (tests only).
#pragma once
#include <cstdint>

namespace furnace::kernels::cpu {
template <typename T>
void MatmulForward(T* out,           // (N, OC) overwritten
                   const T* inp,     // (N, C)
                   const T* weight,  // (C, OC)
                   const T* bias,    // (OC) or nullptr
                   int N, int C, int OC);
template <typename T>
void MatmulBackward(T* dinp,          // (N, C)  accumulated; may be nullptr (not needed)
                    T* dweight,       // (C, OC) accumulated
                    T* dbias,         // (OC)    accumulated; nullptr when there is no bias
                    const T* dout,    // (N, OC)
                    const T* inp,     // (N, C)
                    const T* weight,  // (C, OC)
                    int N, int C, int OC);

// Grouped GEMM for experts: rows [offsets[e], offsets[e+1]) of inp use weight e. A group with
// zero rows is normal and costs nothing.
template <typename T>
void GroupedMatmulForward(T* out,                  // (S, OC) overwritten, S = offsets[E]
                          const T* inp,            // (S, C)
                          const T* weight,         // (E, C, OC)
                          const T* bias,           // (E, OC) or nullptr
                          const int64_t* offsets,  // (E + 1), offsets[0] = 0
                          int E, int C, int OC);
template <typename T>
void GroupedMatmulBackward(T* dinp,                 // (S, C)     accumulated; may be nullptr
                           T* dweight,              // (E, C, OC) accumulated
                           T* dbias,                // (E, OC)    accumulated or nullptr
                           const T* dout,           // (S, OC)
                           const T* inp,            // (S, C)
                           const T* weight,         // (E, C, OC)
                           const int64_t* offsets,  // (E + 1)
                           int E, int C, int OC);
}  // namespace furnace::kernels::cpu
