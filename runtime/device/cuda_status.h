// CUDA runtime errors as absl::Status, carrying the failing call, file:line and the driver's
// message. Only for code built with FURNACE_HAVE_CUDA. A missing driver or GPU is Unavailable,
// an out-of-memory ResourceExhausted, anything else Internal (Device's error contract).
// FURNACE_CUDA_RETURN_IF_ERROR also clears the runtime's per-thread last error (cudaGetLastError)
// once the failure is a Status: left set, it would be reported again by the next kernel launch's
// check (kernels/cuda: cudaPeekAtLastError) as that kernel's failure. A sticky error (a fault
// inside a kernel) stays in the context whatever is cleared, and every later call reports it.
#pragma once

#include <cuda_runtime.h>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"

namespace furnace::device {

inline absl::Status CudaStatus(cudaError_t err, const char* call, const char* file, int line) {
  if (err == cudaSuccess) return absl::OkStatus();
  std::string message = absl::StrFormat("%s failed at %s:%d: %s (%s)", call, file, line,
                                        cudaGetErrorString(err), cudaGetErrorName(err));
  switch (err) {
    case cudaErrorInsufficientDriver:
    case cudaErrorNoDevice:
    case cudaErrorInvalidDevice:
    case cudaErrorDevicesUnavailable:
      return absl::UnavailableError(message);
    case cudaErrorMemoryAllocation:
      return absl::ResourceExhaustedError(message);
    default:
      return absl::InternalError(message);
  }
}

}  // namespace furnace::device

// Returns a Status from the enclosing function when a CUDA runtime call fails.
#define FURNACE_CUDA_RETURN_IF_ERROR(call)                                                \
  do {                                                                                    \
    cudaError_t furnace_cuda_err_ = (call);                                               \
    if (furnace_cuda_err_ != cudaSuccess) {                                               \
      cudaGetLastError();                                                                 \
      return ::furnace::device::CudaStatus(furnace_cuda_err_, #call, __FILE__, __LINE__); \
    }                                                                                     \
  } while (0)
