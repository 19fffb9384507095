#include "runtime/train/peak_flops.h"

#include <algorithm>
#include <chrono>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
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

namespace {

// NVIDIA's datasheet dense figures (without sparsity), FLOP/s. The first entry whose key the name
// contains wins, so the more specific keys come first.
struct Datasheet {
  const char* key;
  double bf16;
  double fp32;
  const char* sheet;
};
constexpr Datasheet kGpus[] = {
    {"H200 NVL", 835.5e12, 60.0e12, "H200 NVL datasheet"},
    {"H200", 989.4e12, 66.9e12, "H200 SXM datasheet"},
    {"H100 PCIe", 756.4e12, 51.2e12, "H100 PCIe datasheet"},
    {"H100 NVL", 835.5e12, 60.0e12, "H100 NVL datasheet"},
    {"H100", 989.4e12, 66.9e12, "H100 SXM datasheet"},
    {"A100", 312.0e12, 19.5e12, "A100 datasheet"},
};

}  // namespace

double DatasheetPeakFlops(const std::string& gpu_name, device::Precision precision,
                          std::string* source) {
  for (const Datasheet& d : kGpus) {
    if (!absl::StrContains(gpu_name, d.key)) continue;
    const bool bf16 = precision == device::Precision::kBf16;
    if (source != nullptr) {
      *source = absl::StrCat(d.sheet, ", dense ", bf16 ? "bf16 tensor core" : "fp32 (no TF32)");
    }
    return bf16 ? d.bf16 : d.fp32;
  }
  if (source != nullptr) {
    *source = absl::StrCat("no datasheet figure for '", gpu_name, "': MFU not reported");
  }
  return 0;
}

}  // namespace furnace::train
