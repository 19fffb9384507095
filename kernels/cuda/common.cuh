// Internals shared by the CUDA kernels: error recording (see kernels/cuda/common.h), launch
// geometry, warp/block reductions and the deterministic column sum used for bias/weight grads.
#pragma once

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <initializer_list>
#include <string>

#include "kernels/cuda/common.h"

namespace furnace::kernels::cuda::internal {

// Records the first error on this thread (later ones are dropped until TakeLastError()).
void RecordError(const char* op, const char* call, const char* message, const char* file, int line);
// Records cudaPeekAtLastError() if it is set; true when all is well.
bool CheckLaunch(const char* op, const char* file, int line);
bool CheckCublas(cublasStatus_t status, const char* op, const char* call, const char* file,
                 int line);
bool CheckCuda(cudaError_t err, const char* op, const char* call, const char* file, int line);
// Points `handle` at `stream` for the cuBLAS calls that follow; records an error (and returns
// false) for a null handle or a failed cublasSetStream.
bool BindCublas(cublasHandle_t handle, cudaStream_t stream, const char* op);

// out[c] += sum_n in[n * C + c]; deterministic (one block owns a column strip).
void ColumnSumAccumulate(float* out, const float* in, int64_t N, int C, cudaStream_t stream);

// Shared launchers of one op's file used by another's (defined where the comment says).
// cast.cu: out (n) = inp rounded to bf16 (nearest even), 16-byte loads where aligned.
void ToBf16(__nv_bfloat16* out, const float* inp, int64_t n, cudaStream_t stream, const char* op);
// matmul.cu: out (N, OC) = bias (OC) broadcast over rows.
void BroadcastBias(float* out, const float* bias, int64_t N, int OC, cudaStream_t stream,
                   const char* op);
// attention.cu: the causal softmax of `rows` rows of length Tlen in place (row i of each (T, T)
// matrix over j <= i, zeros above), and its backward dS = P * (dP - rowsum(P * dP)) in place in dp.
void CausalSoftmax(float* att, int64_t rows, int Tlen, cudaStream_t stream, const char* op);
void CausalSoftmaxBackward(float* dp, const float* att, int64_t rows, int Tlen, cudaStream_t stream,
                           const char* op);
// attention.cu, the RowStats pair (kernels/cuda/attention.h): the block of query rows [r0, r1) of
// one sequence, its (NH, r1 - r0, r1) row-major scores s (keys [0, r1), heads (r1 - r0) * r1
// apart), stats the sequence's (NH, T, 2). RowStatsRowBlock: the block's rows R (row_block where
// > 0, clamped to T, else AttentionRowStatsRowBlock). CausalSoftmaxRowStats: s becomes P in place
// (zeros above the diagonal) and (m, r) of each row go to stats. CausalSoftmaxRebuild: s becomes
// P = exp(s - m) r with the forward's operations (bit-identical to its P for the same s).
// CausalSoftmaxBackwardBlock: dS = P * (dP - rowsum(P * dP)) in place in dp (p the rebuilt P).
// They return false (the error recorded) where a launch failed.
int RowStatsRowBlock(int Tlen, int NH, int row_block);
bool CausalSoftmaxRowStats(float* s, float* stats, int NH, int r0, int r1, int Tlen,
                           cudaStream_t stream, const char* op);
bool CausalSoftmaxRebuild(float* s, const float* stats, int NH, int r0, int r1, int Tlen,
                          cudaStream_t stream, const char* op);
bool CausalSoftmaxBackwardBlock(float* dp, const float* p, int NH, int r0, int r1,
                                cudaStream_t stream, const char* op);

// Registers kernels for PreloadKernels (common.h): each .cu lists every kernel it launches, once,
// at namespace scope after their definitions (a template kernel: each instantiation launched):
//   FURNACE_PRELOAD_KERNELS(FooKernel, BarKernel<float>);
// The registration runs at static initialisation (a .cu's launchers are linked, so is its list).
void RegisterKernels(const char* names, std::initializer_list<const void*> kernels);
template <typename... Kernel>
bool RegisterKernelList(const char* names, Kernel*... kernels) {
  RegisterKernels(names, {reinterpret_cast<const void*>(kernels)...});
  return true;
}
#define FURNACE_PRELOAD_KERNELS(...)                               \
  [[maybe_unused]] static const bool furnace_kernels_registered_ = \
      ::furnace::kernels::cuda::internal::RegisterKernelList(#__VA_ARGS__, __VA_ARGS__)

// Kernels a .cu launches through a library (CUB) have no symbol of its own to list: a preload hook
// loads them by running them, small, on a stream of its own (waiting for that stream only); it
// returns "" or what failed. PreloadKernels calls each hook after loading the listed kernels.
//   FURNACE_PRELOAD_HOOK(PreloadCubKernels);
// tests/kernels/cuda/check_preload_list.py wants one in every .cu that includes a CUB header.
bool RegisterPreloadHook(const char* name, std::string (*hook)());
#define FURNACE_PRELOAD_HOOK(hook)                                      \
  [[maybe_unused]] static const bool furnace_preload_hook_registered_ = \
      ::furnace::kernels::cuda::internal::RegisterPreloadHook(#hook, &hook)

inline int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Carves a byte workspace into 256-byte aligned pieces (cuBLAS wants 16-byte aligned operands).
inline constexpr size_t kWorkspaceAlign = 256;
inline constexpr size_t AlignUp(size_t bytes) {
  return (bytes + kWorkspaceAlign - 1) / kWorkspaceAlign * kWorkspaceAlign;
}
class WorkspaceCarver {
 public:
  explicit WorkspaceCarver(void* base) : next_(static_cast<char*>(base)) {}
  template <typename T>
  T* Take(int64_t n) {
    T* p = reinterpret_cast<T*>(next_);
    next_ += AlignUp(static_cast<size_t>(n) * sizeof(T));
    return p;
  }

 private:
  char* next_;
};
// Grid for a grid-stride loop over n elements.
inline unsigned GridFor(int64_t n, int block) {
  int64_t blocks = CeilDiv(n, block);
  if (blocks > 65535LL * 16) blocks = 65535LL * 16;
  return static_cast<unsigned>(blocks < 1 ? 1 : blocks);
}

__device__ __forceinline__ float WarpSum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float WarpMax(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
// Block-wide reductions for blockDim.x a multiple of 32 (<= 1024); every thread gets the result.
// `shared` needs 32 floats; consecutive calls may reuse it (a barrier guards the reuse).
__device__ __forceinline__ float BlockSum(float v, float* shared) {
  int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  v = WarpSum(v);
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = lane < warps ? shared[lane] : 0.0f;
  return WarpSum(v);
}
__device__ __forceinline__ float BlockMax(float v, float* shared) {
  int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  v = WarpMax(v);
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = lane < warps ? shared[lane] : -INFINITY;
  return WarpMax(v);
}

}  // namespace furnace::kernels::cuda::internal

#define FURNACE_CHECK_LAUNCH(op) \
  ::furnace::kernels::cuda::internal::CheckLaunch(op, __FILE__, __LINE__)
#define FURNACE_CHECK_CUBLAS(op, call) \
  ::furnace::kernels::cuda::internal::CheckCublas((call), op, #call, __FILE__, __LINE__)
#define FURNACE_CHECK_CUDA(op, call) \
  ::furnace::kernels::cuda::internal::CheckCuda((call), op, #call, __FILE__, __LINE__)
