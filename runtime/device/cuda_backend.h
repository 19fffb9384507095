// The CUDA backend tables (backend.h): every op is the kernels::cuda launcher of its name on the
// calling thread's current stream (current_stream.h: StreamScope with a stream of a CUDA device;
// else the default stream of the CUDA device that holds the op's first pointer argument). Only in
// builds with FURNACE_ENABLE_CUDA (BackendFor(Kind::kCuda) refuses the kind elsewhere).
//
// Adapting the CUDA kernels to the CPU signatures (backend.h's contract):
//  - cuBLAS: one handle per (thread, device, stream), created on first use and bound with
//    cublasSetStream by each launcher, so no handle (nor its workspace) is shared between threads
//    or between streams.
//  - Host arguments: the dispatch plan's slot and token arrays and add_row's row are copied into
//    pinned staging memory owned by the calling thread (reused once the event recorded after its
//    last copy has completed) and uploaded with cudaMemcpyAsync on the op's stream into scratch
//    device memory (Device::Allocate, stream-ordered, freed after the kernels are enqueued), as
//    kernels::cuda::DeviceDispatchPlan; the grouped GEMMs' offsets stay on the host (read at the
//    call, as cuBLAS launches one GEMM per group).
//  - Host scalars: aux_loss_forward and sum_of_squares run their kernel into scratch, copy the
//    value back and synchronise the op's stream.
//  - bf16 table (CudaBf16Backend): the GEMMs and attention round their operands into a bf16
//    workspace allocated per op (Device::Allocate/Free on the op's stream, outside the job's
//    activation budget like cuBLAS's own workspace) and multiply with cublasGemmEx /
//    cublasGemmStridedBatchedEx (kernels/cuda/matmul_bf16.h, attention_bf16.h).
//
// Errors: a launch or cuBLAS failure at enqueue (kernels::cuda::TakeLastError() after each op), a
// failed scratch allocation or staging copy becomes the device's sticky error (cuda_device.h),
// naming the op; the op's remaining work is skipped, its outputs are undefined, and every later
// SynchronizeStream/SynchronizeEvent of that device returns the error. A fault inside a kernel
// (e.g. a host pointer given as device memory) is CUDA's own sticky context error, reported by
// the next synchronisation. aux_loss_forward and sum_of_squares return NaN on any error. Pointer
// arguments are not checked (that would cost a driver call per pointer); an op whose device
// cannot be resolved (no CUDA current stream and a first non-null pointer no live CudaDevice
// owns) stops the program with the op's name, as the emulated table does; with no current stream
// and only null pointers (an empty op) it does nothing.
// Thread-safety: tables are immutable; any number of threads may call them, each on its own
// streams.
#pragma once

#include "runtime/device/backend.h"

namespace furnace::device {
// fp32 throughout (cuBLAS fp32 GEMMs without TF32).
const Backend& CudaBackend();
// bf16 GEMMs and attention products (backend.h "Precision"); every other op as CudaBackend.
const Backend& CudaBf16Backend();
// Loads every kernel of kernels/cuda into `device`'s GPU once (kernels::cuda::PreloadKernels: the
// first launch of a lazily loaded kernel can wait for all queued GPU work, a hang behind an NCCL
// kernel waiting on a peer). cuBLAS's own kernels still load on their first use. BackendFor(device)
// calls it, so a rank loads them before its first collective; the first op on a GPU does too.
// InvalidArgument for a device not CUDA.
absl::Status LoadCudaKernels(const Device& device);
}  // namespace furnace::device
