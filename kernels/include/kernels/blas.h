// Threading of the BLAS library behind the CPU GEMMs. One thread per rank by default: ranks are
// processes that already share the cores, and an oversubscribed OpenBLAS is slower than none.
#pragma once

namespace furnace::kernels::cpu {
// Process-wide; call before the first GEMM, not concurrently with one. n < 1 is treated as 1.
void SetBlasThreads(int n);
}  // namespace furnace::kernels::cpu
