#include "kernels/blas.h"

#include <cblas.h>

namespace furnace::kernels::cpu {
void SetBlasThreads(int n) { openblas_set_num_threads(n < 1 ? 1 : n); }
}  // namespace furnace::kernels::cpu
