// CUDA kernels: error reporting and the cuBLAS handle helper shared by every launcher.
//
// Errors: launchers return void (leaf code, as llm.c). Each one checks cudaPeekAtLastError after
// its launches and the status of every cuBLAS call; the first failure on the calling thread is
// recorded (op, call, file:line, message) until TakeLastError() collects it. Launch errors are
// also left in the CUDA runtime's own per-thread error (cudaGetLastError), which TakeLastError
// clears too. Asynchronous faults (a bad address inside a kernel) appear only at the next
// synchronisation, as with any CUDA code. Callers above the kernels check once per group of
// launches and turn a non-empty message into an absl::Status.
//
// Memory: every pointer argument is device memory unless its comment says host.
// Streams: work is enqueued on the given stream; nothing synchronises the host unless noted.
// Thread-safety: launchers are reentrant; a cublasHandle_t must be used by one thread at a time
// (launchers bind it to their stream with cublasSetStream).
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <string>

namespace furnace::kernels::cuda {

// The first error recorded on this thread since the last call ("" when none), and clears it
// (including the CUDA runtime's last error, which is reported when nothing else was recorded).
std::string TakeLastError();

// The same, with whether that error was a failed allocation (cudaErrorMemoryAllocation, or
// cuBLAS's CUBLAS_STATUS_ALLOC_FAILED: its workspace or handle did not fit), so a caller can report
// an out-of-memory as one (absl ResourceExhausted) rather than as an internal error.
struct KernelError {
  std::string message;  // "" when none
  bool out_of_memory = false;
};
KernelError TakeLastKernelError();

// Loads every kernel of this library into the current device's context; "" or what failed (the
// CUDA runtime's last error cleared). CUDA loads kernels lazily by default (Linux, CUDA 12.2 on):
// a kernel's first launch loads it, and loading may wait for all work queued on the GPU to finish
// while holding the context's lock. With a kernel in flight that waits on something only the host
// can do next (an NCCL kernel waiting for a peer that itself waits on this rank, a stream held by
// a host function), that first launch hangs. Call it once per device before any such work; each
// later call loads nothing new. Kernels launched through CUB are loaded by running them once,
// small, on a stream of their own (the preload hooks of kernels/cuda/common.cuh); each call runs
// them again (a few small kernels). Thread-safe.
std::string PreloadKernels();

// Owns a cuBLAS handle (fp32 GEMMs in full precision: no TF32). get() is nullptr when creation
// failed; the reason is then recorded for TakeLastError().
class CublasHandle {
 public:
  CublasHandle();
  ~CublasHandle();
  CublasHandle(const CublasHandle&) = delete;
  CublasHandle& operator=(const CublasHandle&) = delete;
  cublasHandle_t get() const { return handle_; }

 private:
  cublasHandle_t handle_ = nullptr;
};

}  // namespace furnace::kernels::cuda
