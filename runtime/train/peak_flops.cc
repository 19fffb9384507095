#include "runtime/train/peak_flops.h"

#include <algorithm>
#include <chrono>
#include <vector>

#include "kernels/matmul.h"

namespace furnace::train {

double MeasureSgemmPeakFlops(int n, int reps) {
  std::vector<float> a(static_cast<size_t>(n) * n, 0.5f), b(a.size(), 0.25f), c(a.size());
  double best = 0;
  for (int r = 0; r <= reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    kernels::cpu::MatmulForward<float>(c.data(), a.data(), b.data(), nullptr, n, n, n);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (r > 0 && s > 0) best = std::max(best, 2.0 * n * n * static_cast<double>(n) / s);
  }
  return best;
}

}  // namespace furnace::train
