// NCCL, loaded on first use (kernels/cuda/lazy_library.h says why). The programs link
// runtime/comm/nccl_library.cc instead of libnccl: it defines each NCCL entry point Furnace calls,
// and the first call loads libnccl.so.<NCCL_MAJOR> (the dynamic loader's search first, then the
// directory the build found NCCL in). Where the library cannot be loaded, every call returns
// ncclSystemError, and ncclGetErrorString and ncclGetLastError return why (each path tried), so
// NcclCommunicator's errors carry the reason. Built only with FURNACE_ENABLE_CUDA.
#pragma once

#include "absl/status/status.h"

namespace furnace::comm {

// Loads NCCL now if no call has yet: OK when it is loaded with every entry point Furnace calls,
// else FailedPrecondition with the reason. Thread-safe; the first attempt's outcome holds.
absl::Status LoadNccl();

}  // namespace furnace::comm
