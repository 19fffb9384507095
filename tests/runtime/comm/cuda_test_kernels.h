// Tiny kernels for the stream communicator's GPU tests (cuda_test_kernels.cu): a producer that
// writes a known pattern, a consumer that copies, and two ways to hold a stream (for a while, or
// until the host says so). Each launcher enqueues on `stream` and returns the launch's error.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace furnace::comm::test_kernels {

// out[j] = base + j for j < n.
cudaError_t Fill(int32_t* out, int64_t n, int32_t base, cudaStream_t stream);
// dst[j] = src[j] for j < n.
cudaError_t Copy(int32_t* dst, const int32_t* src, int64_t n, cudaStream_t stream);
// Loads the four kernels of this file into the current device's context (cudaFuncGetAttributes).
// Under CUDA's lazy module loading a kernel's first launch waits for the GPU's queued work, so a
// test that launches one behind Sleep would find the host held until the sleep ends: called before.
cudaError_t Preload();
// Holds the stream for `nanos` of GPU time (%globaltimer).
cudaError_t Sleep(int64_t nanos, cudaStream_t stream);
// Holds the stream until *flag != 0 (host-mapped memory: cudaHostAllocMapped, the device
// pointer), or at most `max_nanos`, so a failing test cannot hang the GPU.
cudaError_t SpinUntil(const volatile int* flag, int64_t max_nanos, cudaStream_t stream);

}  // namespace furnace::comm::test_kernels
