// Error recording, the cuBLAS handle helper and the deterministic column sum.
#include <cstdio>
#include <mutex>
#include <string>
#include <vector>

#include "common.cuh"

namespace furnace::kernels::cuda {
namespace internal {
namespace {
thread_local std::string first_error;
thread_local bool first_error_out_of_memory = false;

// Records the first error on this thread, and whether it was a failed allocation.
void Record(const char* op, const char* call, const char* message, const char* file, int line,
            bool out_of_memory) {
  if (!first_error.empty()) return;
  char buf[512];
  std::snprintf(buf, sizeof(buf), "%s: %s failed at %s:%d: %s", op, call, file, line, message);
  first_error = buf;
  first_error_out_of_memory = out_of_memory;
}
}  // namespace

void RecordError(const char* op, const char* call, const char* message, const char* file,
                 int line) {
  Record(op, call, message, file, line, false);
}

namespace {
struct KernelList {
  const char* names;  // as the .cu wrote them, for errors
  std::vector<const void*> kernels;
};
std::mutex& RegistryMutex() {
  static std::mutex mu;
  return mu;
}
// Constructed on first use: registrations run during static initialisation, in any order.
std::vector<KernelList>& Registry() {
  static std::vector<KernelList> lists;
  return lists;
}
struct PreloadHook {
  const char* name;
  std::string (*hook)();
};
std::vector<PreloadHook>& Hooks() {
  static std::vector<PreloadHook> hooks;
  return hooks;
}
}  // namespace

void RegisterKernels(const char* names, std::initializer_list<const void*> kernels) {
  std::lock_guard<std::mutex> lock(RegistryMutex());
  Registry().push_back({names, std::vector<const void*>(kernels)});
}

bool RegisterPreloadHook(const char* name, std::string (*hook)()) {
  std::lock_guard<std::mutex> lock(RegistryMutex());
  Hooks().push_back({name, hook});
  return true;
}

bool CheckLaunch(const char* op, const char* file, int line) {
  cudaError_t err = cudaPeekAtLastError();
  if (err == cudaSuccess) return true;
  Record(op, "kernel launch", cudaGetErrorString(err), file, line,
         err == cudaErrorMemoryAllocation);
  return false;
}

bool CheckCublas(cublasStatus_t status, const char* op, const char* call, const char* file,
                 int line) {
  if (status == CUBLAS_STATUS_SUCCESS) return true;
  Record(op, call, cublasGetStatusString(status), file, line, status == CUBLAS_STATUS_ALLOC_FAILED);
  return false;
}

bool CheckCuda(cudaError_t err, const char* op, const char* call, const char* file, int line) {
  if (err == cudaSuccess) return true;
  Record(op, call, cudaGetErrorString(err), file, line, err == cudaErrorMemoryAllocation);
  return false;
}

bool BindCublas(cublasHandle_t handle, cudaStream_t stream, const char* op) {
  if (handle == nullptr) {
    RecordError(op, "cuBLAS", "null handle", __FILE__, __LINE__);
    return false;
  }
  return FURNACE_CHECK_CUBLAS(op, cublasSetStream(handle, stream));
}

namespace {
// A block sums a strip of 8 columns over every row: a warp reads 4 rows of 32 bytes, whole
// memory sectors when C is a multiple of 8 (the model's widths; other widths straddle sectors),
// so narrow strips cost no bandwidth and give C / 8 blocks (256 at d 2,048, two per SM of an H100
// or H200: __launch_bounds__ holds the registers to 32 for that) where 32-column strips left half
// the SMs idle. Each column is summed by one block in a fixed order (row lanes, then a tree over
// them): deterministic.
constexpr int kStrip = 8;   // columns per block
constexpr int kRows = 128;  // row lanes per block (1,024 threads)

__global__ void __launch_bounds__(kStrip* kRows, 2)
    ColumnSumKernel(float* out, const float* in, int64_t N, int C) {
  __shared__ float partial[kRows][kStrip];
  const int c = blockIdx.x * kStrip + threadIdx.x;
  float sum = 0.0f;
  if (c < C) {
    for (int64_t n = threadIdx.y; n < N; n += kRows) sum += in[n * C + c];
  }
  partial[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  for (int half = kRows / 2; half > 0; half /= 2) {
    if (threadIdx.y < half)
      partial[threadIdx.y][threadIdx.x] += partial[threadIdx.y + half][threadIdx.x];
    __syncthreads();
  }
  if (threadIdx.y == 0 && c < C) out[c] += partial[0][threadIdx.x];
}

FURNACE_PRELOAD_KERNELS(ColumnSumKernel);

}  // namespace

void ColumnSumAccumulate(float* out, const float* in, int64_t N, int C, cudaStream_t stream) {
  if (C <= 0 || N <= 0) return;
  dim3 block(kStrip, kRows);
  ColumnSumKernel<<<static_cast<unsigned>(CeilDiv(C, kStrip)), block, 0, stream>>>(out, in, N, C);
  FURNACE_CHECK_LAUNCH("ColumnSumAccumulate");
}

}  // namespace internal

std::string PreloadKernels() {
  std::lock_guard<std::mutex> lock(internal::RegistryMutex());
  for (const internal::KernelList& list : internal::Registry()) {
    for (const void* kernel : list.kernels) {
      // Resolving a kernel's attributes loads it (the CUDA programming guide's remedy for the
      // lazy-loading hazard).
      cudaFuncAttributes attributes;
      const cudaError_t err = cudaFuncGetAttributes(&attributes, kernel);
      if (err != cudaSuccess) {
        cudaGetLastError();
        return std::string("loading the kernels (") + list.names +
               "): cudaFuncGetAttributes: " + cudaGetErrorString(err);
      }
    }
  }
  for (const internal::PreloadHook& hook : internal::Hooks()) {
    const std::string error = hook.hook();
    if (!error.empty()) return std::string("loading the kernels (") + hook.name + "): " + error;
  }
  return "";
}

KernelError TakeLastKernelError() {
  KernelError error;
  error.message.swap(internal::first_error);
  error.out_of_memory = internal::first_error_out_of_memory;
  internal::first_error_out_of_memory = false;
  cudaError_t err = cudaGetLastError();
  if (error.message.empty() && err != cudaSuccess) {
    error.message = std::string("CUDA error: ") + cudaGetErrorString(err);
    error.out_of_memory = err == cudaErrorMemoryAllocation;
  }
  return error;
}

std::string TakeLastError() { return TakeLastKernelError().message; }

CublasHandle::CublasHandle() {
  if (!FURNACE_CHECK_CUBLAS("CublasHandle", cublasCreate(&handle_))) {
    handle_ = nullptr;
    return;
  }
  // Default math: fp32 GEMMs stay fp32 (TF32 would need CUBLAS_TF32_TENSOR_OP_MATH).
  FURNACE_CHECK_CUBLAS("CublasHandle", cublasSetMathMode(handle_, CUBLAS_DEFAULT_MATH));
}

CublasHandle::~CublasHandle() {
  if (handle_ != nullptr) cublasDestroy(handle_);
}

}  // namespace furnace::kernels::cuda
