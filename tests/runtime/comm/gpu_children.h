// Test helper for the GPU tests that run each case in fork()ed children (a CUDA context does not
// survive fork, so the parent never touches CUDA): the GPU count asked in a probe child, and a
// skip (with the reason) where there are not enough GPUs.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <vector>

#include "fork_world.h"
#include "gtest/gtest.h"

namespace furnace::comm::forked {

// The number of CUDA devices, asked in a child process; 0 when CUDA fails.
inline int ProbeGpuCount() {
  std::vector<ChildExit> exits = RunForked(
      1,
      [](int) {
        int count = 0;
        if (cudaGetDeviceCount(&count) != cudaSuccess) return 0;
        return std::min(count, 100);
      },
      60);
  return exits[0].exited ? exits[0].code : 0;
}

}  // namespace furnace::comm::forked

#define SKIP_WITHOUT_GPUS(needed)                                                           \
  do {                                                                                      \
    const int gpus_ = ::furnace::comm::forked::ProbeGpuCount();                             \
    if (gpus_ == 0) GTEST_SKIP() << "no GPU: cudaGetDeviceCount returned 0 or failed";      \
    if (gpus_ < (needed)) GTEST_SKIP() << "needs " << (needed) << " GPUs, found " << gpus_; \
  } while (0)
