#include "worker/rank_device.h"

#include <stdlib.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "runtime/base/status.h"
#include "runtime/device/emulated_device.h"
#ifdef FURNACE_HAVE_CUDA
#include "kernels/cuda/cublas_library.h"
#include "runtime/comm/nccl_library.h"
#endif

namespace furnace::worker {

absl::StatusOr<RankDevice> MakeRankDevice(const furnace::v1::RankTask& task) {
  const std::string& kind = task.spec().resources().device();
  RankDevice d;
  d.precision = task.spec().model().precision() == "bf16" ? device::Precision::kBf16
                                                          : device::Precision::kFp32;
  if (kind.empty() || kind == "cpu") {
    d.device = device::CreateCpuDevice();
  } else if (kind == "emulated") {
    device::EmulatedDeviceOptions options;
    if (task.device_memory() > 0) options.memory_bytes = task.device_memory();
    options.name = absl::StrCat("emulated:", task.device_ordinal());
    ASSIGN_OR_RETURN(d.device, device::CreateEmulatedDevice(options));
  } else if (kind == "cuda") {
    // CUDA loads a kernel's module at its first launch by default (lazy loading), and that load
    // waits for the work already queued on the GPU. Behind an NCCL kernel waiting for a peer that
    // is itself in such a load, or behind one of another group's communicators, ranks wait on
    // each other for good. Furnace's kernels are loaded up front (LoadCudaKernels), cuBLAS's are
    // not, and it picks new ones mid-run as the experts' row counts change: so a rank loads every
    // module when its context is made (seconds, some device memory), unless the environment says
    // otherwise (a CUDA_MODULE_LOADING of the worker's environment is kept).
    setenv("CUDA_MODULE_LOADING", "EAGER", /*overwrite=*/0);
    ASSIGN_OR_RETURN(d.device, device::CreateCudaDevice(static_cast<int>(task.device_ordinal())));
#ifdef FURNACE_HAVE_CUDA
    // cuBLAS and NCCL are opened on first use (kernels/cuda/lazy_library.h): a host without them
    // cannot give this device either, said before any rendezvous rather than at the first GEMM.
    if (const std::string cublas = kernels::cuda::LoadCublas(); !cublas.empty()) {
      return absl::UnavailableError(cublas);
    }
    if (task.world_size() > 1) {
      if (absl::Status nccl = comm::LoadNccl(); !nccl.ok()) {
        return absl::UnavailableError(nccl.message());
      }
    }
#endif
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("'", kind, "' is not a device kind (allowed: cpu, cuda, emulated)"));
  }
  ASSIGN_OR_RETURN(d.compute, d.device->CreateStream());
  return d;
}

}  // namespace furnace::worker
