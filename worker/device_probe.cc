#include "worker/device_probe.h"

#include <unistd.h>

#include "absl/strings/str_cat.h"

namespace furnace::worker {
namespace {

DeviceInfo HostCpu() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page_size = sysconf(_SC_PAGE_SIZE);
  DeviceInfo info;
  info.kind = "cpu";
  info.name = "cpu";
  info.memory = pages > 0 && page_size > 0 ? static_cast<uint64_t>(pages) * page_size : 0;
  return info;
}

}  // namespace

#ifndef FURNACE_HAVE_CUDA
absl::StatusOr<DeviceInfo> ProbeCudaDevice(uint32_t) {
  return absl::UnavailableError(
      "this furnace-worker was built without CUDA (no CUDA toolkit was found at build time)");
}
#endif

absl::StatusOr<DeviceInfo> ProbeDevice(const std::string& kind, uint32_t slot) {
  if (kind == "cpu") return HostCpu();
  if (kind == "cuda") return ProbeCudaDevice(slot);
  if (kind == "emulated") {
    DeviceInfo info;
    info.kind = "emulated";
    info.name = absl::StrCat("emulated:", slot);
    info.memory = kEmulatedDeviceMemory;
    return info;
  }
  if (kind == "auto") {
    auto gpu = ProbeCudaDevice(slot);
    return gpu.ok() ? gpu : HostCpu();
  }
  return absl::InvalidArgumentError(
      absl::StrCat("device kind '", kind, "' is not known; allowed: cpu, cuda, emulated, auto"));
}

}  // namespace furnace::worker
