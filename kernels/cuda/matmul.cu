// Dense and grouped GEMMs via cuBLAS. A row-major (R, K) matrix is the column-major (K, R) matrix
// with leading dimension K, so with row-major out (N, OC) = inp (N, C) @ weight (C, OC):
//   forward:  out^T   (OC, N) = weight^T (OC, C) * inp^T (C, N)        [N, N]
//   dinp:     dinp^T  (C, N)  += weight  (C, OC) * dout^T (OC, N)      [T, N]
//   dweight:  dweight^T (OC, C) += dout^T (OC, N) * inp (N, C)         [N, T]
// Bias: the output is first filled with the broadcast bias and the GEMM runs with beta = 1.
#include <cuda_bf16.h>

#include "common.cuh"
#include "kernels/cuda/matmul.h"

namespace furnace::kernels::cuda {
namespace {

constexpr int kBlock = 256;

template <typename T>
__global__ void BroadcastBiasKernel(T* out, const T* bias, int64_t N, int OC) {
  int64_t total = N * OC;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * blockDim.x) {
    out[i] = bias[i % OC];
  }
}

template <typename T>
void BroadcastBias(T* out, const T* bias, int64_t N, int OC, cudaStream_t stream, const char* op) {
  BroadcastBiasKernel<T>
      <<<internal::GridFor(N * OC, kBlock), kBlock, 0, stream>>>(out, bias, N, OC);
  FURNACE_CHECK_LAUNCH(op);
}

// One forward GEMM on rows of inp; `op` names the caller in errors.
void Forward(float* out, const float* inp, const float* weight, const float* bias, int64_t N, int C,
             int OC, cublasHandle_t handle, cudaStream_t stream, const char* op) {
  if (N == 0 || OC == 0) return;
  float alpha = 1.0f, beta = 0.0f;
  if (bias != nullptr) {
    BroadcastBias(out, bias, N, OC, stream, op);
    beta = 1.0f;
  }
  if (C == 0) {
    if (bias == nullptr)
      FURNACE_CHECK_CUDA(op, cudaMemsetAsync(out, 0, N * OC * sizeof(float), stream));
    return;
  }
  FURNACE_CHECK_CUBLAS(op, cublasSgemm(handle, CUBLAS_OP_N, CUBLAS_OP_N, OC, static_cast<int>(N), C,
                                       &alpha, weight, OC, inp, C, &beta, out, OC));
}

void Backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
              const float* weight, int64_t N, int C, int OC, cublasHandle_t handle,
              cudaStream_t stream, const char* op) {
  if (N == 0) return;
  float one = 1.0f;
  int n = static_cast<int>(N);
  if (dinp != nullptr && C > 0 && OC > 0) {
    FURNACE_CHECK_CUBLAS(op, cublasSgemm(handle, CUBLAS_OP_T, CUBLAS_OP_N, C, n, OC, &one, weight,
                                         OC, dout, OC, &one, dinp, C));
  }
  if (dweight != nullptr && C > 0 && OC > 0) {
    FURNACE_CHECK_CUBLAS(op, cublasSgemm(handle, CUBLAS_OP_N, CUBLAS_OP_T, OC, C, n, &one, dout, OC,
                                         inp, C, &one, dweight, OC));
  }
  if (dbias != nullptr) internal::ColumnSumAccumulate(dbias, dout, N, OC, stream);
}

FURNACE_PRELOAD_KERNELS(BroadcastBiasKernel<float>, BroadcastBiasKernel<__nv_bfloat16>);

}  // namespace

namespace internal {
void BroadcastBias(float* out, const float* bias, int64_t N, int OC, cudaStream_t stream,
                   const char* op) {
  ::furnace::kernels::cuda::BroadcastBias<float>(out, bias, N, OC, stream, op);
}
}  // namespace internal

void MatmulForward(float* out, const float* inp, const float* weight, const float* bias, int N,
                   int C, int OC, cublasHandle_t handle, cudaStream_t stream) {
  if (!internal::BindCublas(handle, stream, "MatmulForward")) return;
  Forward(out, inp, weight, bias, N, C, OC, handle, stream, "MatmulForward");
}

void MatmulBackward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                    const float* weight, int N, int C, int OC, cublasHandle_t handle,
                    cudaStream_t stream) {
  if (!internal::BindCublas(handle, stream, "MatmulBackward")) return;
  Backward(dinp, dweight, dbias, dout, inp, weight, N, C, OC, handle, stream, "MatmulBackward");
}

void MatmulForwardBf16Storage(__nv_bfloat16* out, const __nv_bfloat16* inp,
                              const __nv_bfloat16* weight, const __nv_bfloat16* bias, int N, int C,
                              int OC, cublasHandle_t handle, cudaStream_t stream) {
  const char* op = "MatmulForwardBf16Storage";
  if (!internal::BindCublas(handle, stream, op)) return;
  if (N == 0 || OC == 0) return;
  float alpha = 1.0f, beta = 0.0f;
  if (bias != nullptr) {
    BroadcastBias(out, bias, N, OC, stream, op);
    beta = 1.0f;
  }
  if (C == 0) {
    if (bias == nullptr) {
      FURNACE_CHECK_CUDA(op, cudaMemsetAsync(out, 0, int64_t{N} * OC * sizeof(*out), stream));
    }
    return;
  }
  FURNACE_CHECK_CUBLAS(op, cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, OC, N, C, &alpha, weight,
                                        CUDA_R_16BF, OC, inp, CUDA_R_16BF, C, &beta, out,
                                        CUDA_R_16BF, OC, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

void GroupedMatmulForward(float* out, const float* inp, const float* weight, const float* bias,
                          const int64_t* offsets, int E, int C, int OC, cublasHandle_t handle,
                          cudaStream_t stream) {
  const char* op = "GroupedMatmulForward";
  if (!internal::BindCublas(handle, stream, op)) return;
  for (int e = 0; e < E; ++e) {
    int64_t begin = offsets[e], rows = offsets[e + 1] - offsets[e];
    if (rows <= 0) continue;
    Forward(out + begin * OC, inp + begin * C, weight + int64_t{e} * C * OC,
            bias == nullptr ? nullptr : bias + int64_t{e} * OC, rows, C, OC, handle, stream, op);
  }
}

void GroupedMatmulBackward(float* dinp, float* dweight, float* dbias, const float* dout,
                           const float* inp, const float* weight, const int64_t* offsets, int E,
                           int C, int OC, cublasHandle_t handle, cudaStream_t stream) {
  const char* op = "GroupedMatmulBackward";
  if (!internal::BindCublas(handle, stream, op)) return;
  for (int e = 0; e < E; ++e) {
    int64_t begin = offsets[e], rows = offsets[e + 1] - offsets[e];
    if (rows <= 0) continue;
    Backward(dinp == nullptr ? nullptr : dinp + begin * C, dweight + int64_t{e} * C * OC,
             dbias == nullptr ? nullptr : dbias + int64_t{e} * OC, dout + begin * OC,
             inp + begin * C, weight + int64_t{e} * C * OC, rows, C, OC, handle, stream, op);
  }
}

}  // namespace furnace::kernels::cuda
