#include "runtime/train/peak_flops.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
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

absl::StatusOr<double> MachinePeakFlops(const std::string& cache_dir, const std::string& host,
                                        const std::function<double()>& measure, bool* cached) {
  if (cached != nullptr) *cached = false;
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(cache_dir, ec);
  if (ec) {
    return absl::UnavailableError(absl::StrCat("peak FLOPs cache ", cache_dir, ": ", ec.message()));
  }
  const fs::path path = fs::path(cache_dir) / absl::StrCat("peak_flops.", host, ".txt");
  const std::string lock_path = (fs::path(cache_dir) / absl::StrCat("peak_flops.", host, ".lock"));
  const int fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) {
    return absl::UnavailableError(
        absl::StrCat("peak FLOPs cache ", lock_path, ": ", std::strerror(errno)));
  }
  int locked;
  do {
    locked = ::flock(fd, LOCK_EX);
  } while (locked != 0 && errno == EINTR);
  if (locked != 0) {
    const int err = errno;
    ::close(fd);
    return absl::UnavailableError(
        absl::StrCat("peak FLOPs cache ", lock_path, ": lock: ", std::strerror(err)));
  }
  // The lock is released when the descriptor closes, whichever way this returns.
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  {
    std::ifstream in(path);
    double value = 0;
    if (in >> value && value > 0) {
      if (cached != nullptr) *cached = true;
      return value;
    }
  }
  const double peak = measure();
  if (!(peak > 0)) return peak;  // nothing worth keeping
  const std::string tmp = absl::StrCat(path.string(), ".tmp.", ::getpid());
  {
    std::ofstream out(tmp);
    out << absl::StrFormat("%.6e\n", peak);
    if (!out) return peak;  // a cache that cannot be written: measured again next time
  }
  fs::rename(tmp, path, ec);
  if (ec) fs::remove(tmp, ec);
  return peak;
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
