// The cuBLAS entry points Furnace calls, forwarding to libcublas loaded on first use
// (kernels/cuda/cublas_library.h). Each definition is checked against cublas_api.h's declaration
// by the compiler; the list given to LazyLibrary names them all, so that a library lacking one
// fails to load as a whole instead of in the middle of a step.
#include "kernels/cuda/cublas_library.h"

#include <cublas_v2.h>

#include <string>

#include "kernels/cuda/lazy_library.h"

namespace furnace::kernels::cuda {
namespace {

LazyLibrary& Cublas() {
  static LazyLibrary* const library = new LazyLibrary(  // never destroyed: calls may come late
      "libcublas.so." + std::to_string(CUBLAS_VER_MAJOR), {FURNACE_CUDA_LIBRARY_DIR},
      {"cublasCreate_v2", "cublasDestroy_v2", "cublasSetStream_v2", "cublasSetMathMode",
       "cublasGetStatusString", "cublasSgemm_v2", "cublasSgemmStridedBatched", "cublasGemmEx",
       "cublasGemmStridedBatchedEx", "cublasGemmGroupedBatchedEx"});
  return *library;
}

}  // namespace

std::string LoadCublas() { return Cublas().Load(); }

}  // namespace furnace::kernels::cuda

// Forwards to the library's `name`, found once per entry point.
#define FURNACE_CUBLAS_FORWARD(name, ...)                                   \
  static void* const real = furnace::kernels::cuda::Cublas().Symbol(#name); \
  if (real == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;                \
  return furnace::kernels::cuda::CallAs<cublasStatus_t>(real, __VA_ARGS__)

extern "C" {

cublasStatus_t CUBLASWINAPI cublasCreate_v2(cublasHandle_t* handle) {
  FURNACE_CUBLAS_FORWARD(cublasCreate_v2, handle);
}

cublasStatus_t CUBLASWINAPI cublasDestroy_v2(cublasHandle_t handle) {
  FURNACE_CUBLAS_FORWARD(cublasDestroy_v2, handle);
}

cublasStatus_t CUBLASWINAPI cublasSetStream_v2(cublasHandle_t handle, cudaStream_t stream) {
  FURNACE_CUBLAS_FORWARD(cublasSetStream_v2, handle, stream);
}

cublasStatus_t CUBLASWINAPI cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode) {
  FURNACE_CUBLAS_FORWARD(cublasSetMathMode, handle, mode);
}

const char* CUBLASWINAPI cublasGetStatusString(cublasStatus_t status) {
  static void* const real = furnace::kernels::cuda::Cublas().Symbol("cublasGetStatusString");
  if (real == nullptr) return furnace::kernels::cuda::Cublas().Load().c_str();
  return furnace::kernels::cuda::CallAs<const char*>(real, status);
}

cublasStatus_t CUBLASWINAPI cublasSgemm_v2(cublasHandle_t handle, cublasOperation_t transa,
                                           cublasOperation_t transb, int m, int n, int k,
                                           const float* alpha, const float* A, int lda,
                                           const float* B, int ldb, const float* beta, float* C,
                                           int ldc) {
  FURNACE_CUBLAS_FORWARD(cublasSgemm_v2, handle, transa, transb, m, n, k, alpha, A, lda, B, ldb,
                         beta, C, ldc);
}

cublasStatus_t CUBLASWINAPI cublasSgemmStridedBatched(
    cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n, int k,
    const float* alpha, const float* A, int lda, long long int strideA, const float* B, int ldb,
    long long int strideB, const float* beta, float* C, int ldc, long long int strideC,
    int batchCount) {
  FURNACE_CUBLAS_FORWARD(cublasSgemmStridedBatched, handle, transa, transb, m, n, k, alpha, A, lda,
                         strideA, B, ldb, strideB, beta, C, ldc, strideC, batchCount);
}

cublasStatus_t CUBLASWINAPI cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa,
                                         cublasOperation_t transb, int m, int n, int k,
                                         const void* alpha, const void* A, cudaDataType Atype,
                                         int lda, const void* B, cudaDataType Btype, int ldb,
                                         const void* beta, void* C, cudaDataType Ctype, int ldc,
                                         cublasComputeType_t computeType, cublasGemmAlgo_t algo) {
  FURNACE_CUBLAS_FORWARD(cublasGemmEx, handle, transa, transb, m, n, k, alpha, A, Atype, lda, B,
                         Btype, ldb, beta, C, Ctype, ldc, computeType, algo);
}

cublasStatus_t CUBLASWINAPI cublasGemmStridedBatchedEx(
    cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n, int k,
    const void* alpha, const void* A, cudaDataType Atype, int lda, long long int strideA,
    const void* B, cudaDataType Btype, int ldb, long long int strideB, const void* beta, void* C,
    cudaDataType Ctype, int ldc, long long int strideC, int batchCount,
    cublasComputeType_t computeType, cublasGemmAlgo_t algo) {
  FURNACE_CUBLAS_FORWARD(cublasGemmStridedBatchedEx, handle, transa, transb, m, n, k, alpha, A,
                         Atype, lda, strideA, B, Btype, ldb, strideB, beta, C, Ctype, ldc, strideC,
                         batchCount, computeType, algo);
}

cublasStatus_t CUBLASWINAPI cublasGemmGroupedBatchedEx(
    cublasHandle_t handle, const cublasOperation_t transa_array[],
    const cublasOperation_t transb_array[], const int m_array[], const int n_array[],
    const int k_array[], const void* alpha_array, const void* const Aarray[], cudaDataType_t Atype,
    const int lda_array[], const void* const Barray[], cudaDataType_t Btype, const int ldb_array[],
    const void* beta_array, void* const Carray[], cudaDataType_t Ctype, const int ldc_array[],
    int group_count, const int group_size[], cublasComputeType_t computeType) {
  FURNACE_CUBLAS_FORWARD(cublasGemmGroupedBatchedEx, handle, transa_array, transb_array, m_array,
                         n_array, k_array, alpha_array, Aarray, Atype, lda_array, Barray, Btype,
                         ldb_array, beta_array, Carray, Ctype, ldc_array, group_count, group_size,
                         computeType);
}

}  // extern "C"
