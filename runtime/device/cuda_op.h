// Internal to the CUDA backend tables (cuda_backend.cc, cuda_backend_bf16.cc): CudaOp is one op's
// launch context. It resolves the device and stream (cuda_backend.h), makes the device current,
// gives the thread's cuBLAS handle for that stream, scratch device memory and uploads of host
// bytes through pinned staging, and on destruction frees the scratch (stream-ordered) and turns
// kernels::cuda::TakeLastError() into the device's sticky error. One CudaOp per table call, on the
// calling thread; not shared.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <initializer_list>
#include <vector>

#include "absl/status/status.h"
#include "runtime/device/cuda_device.h"

namespace furnace::device::cuda_internal {

// Loads every kernel into GPU `ordinal`'s context (kernels::cuda::PreloadKernels), the first time
// for that GPU; the caller has made it current. Thread-safe.
absl::Status LoadKernelsOnce(int ordinal);

class CudaOp {
 public:
  // `pointers`: the op's pointer arguments; the first non-null one names the device when the
  // thread has no CUDA current stream.
  CudaOp(const char* op, std::initializer_list<const void*> pointers);
  ~CudaOp();
  CudaOp(const CudaOp&) = delete;
  CudaOp& operator=(const CudaOp&) = delete;

  // False once something failed (recorded as the sticky error), or when there is nothing to run
  // on (no CUDA current stream and only null pointers: an empty op): skip the rest of the op.
  bool ok() const { return ok_; }
  cudaStream_t stream() const { return stream_; }
  // The (thread, device, stream) handle; nullptr (and !ok()) when it cannot be created.
  cublasHandle_t cublas();
  // `bytes` of device memory usable by this op's work on stream(), freed stream-ordered when the
  // op ends; nullptr (and !ok()) on failure. bytes 0: nullptr, not a failure.
  void* Scratch(size_t bytes);
  // A device copy of `bytes` host bytes (copied into pinned staging at the call, then uploaded on
  // stream()); nullptr (and !ok()) on failure, or for bytes 0.
  void* Upload(const void* host, size_t bytes);
  // Records a failure of this op as the device's sticky error.
  void Fail(absl::Status status);
  // Synchronises stream() and reports whether the op's work so far succeeded and no earlier op
  // of the device failed (the host-scalar ops call it before reading their result).
  bool Synchronize();

 private:
  const char* op_;
  CudaDevice* device_ = nullptr;
  cudaStream_t stream_ = nullptr;
  bool ok_ = true;
  std::vector<void*> scratch_;
};

}  // namespace furnace::device::cuda_internal
