// Causal attention with cuBLAS strided-batched GEMMs over the heads of one sequence (a head's q,
// k, v are (T, hs) views of qkv with leading dimension 3C, hs apart from head to head).
// Column-major reading (see matmul.cu): with Qc = Q^T (hs, T) etc.,
//   scores^T = Kc^T Qc             -> att (T, T) row-major, scaled by 1/sqrt(hs)
//   out^T    = Vc Pc               -> out (T, hs) with leading dimension C
// backward, with dP = dout V^T and dS = softmax'(P, dP):
//   dP^T = Vc^T doutc;  dV^T += doutc Pc^T;  dQ^T += scale Kc dSc;  dK^T += scale Qc dSc^T
#include <cmath>

#include "common.cuh"
#include "kernels/cuda/attention.h"

namespace furnace::kernels::cuda {
namespace {

constexpr int kWarpsPerBlock = 8;

// Row i of each (T, T) matrix: softmax over j <= i in place, zeros above the diagonal.
__global__ void CausalSoftmaxKernel(float* att, int64_t rows, int Tlen) {
  int64_t row = blockIdx.x * int64_t{kWarpsPerBlock} + threadIdx.x / 32;
  int lane = threadIdx.x % 32;
  if (row >= rows) return;
  int i = static_cast<int>(row % Tlen);
  float* a = att + row * Tlen;
  float mx = -INFINITY;
  for (int j = lane; j <= i; j += 32) mx = fmaxf(mx, a[j]);
  mx = internal::WarpMax(mx);
  float sum = 0.0f;
  for (int j = lane; j <= i; j += 32) {
    float e = expf(a[j] - mx);
    a[j] = e;
    sum += e;
  }
  float inv = 1.0f / internal::WarpSum(sum);
  for (int j = lane; j < Tlen; j += 32) a[j] = j <= i ? a[j] * inv : 0.0f;
}

// dS = P * (dP - rowsum(P * dP)) in place in dp; zero above the diagonal.
__global__ void CausalSoftmaxBackwardKernel(float* dp, const float* att, int64_t rows, int Tlen) {
  int64_t row = blockIdx.x * int64_t{kWarpsPerBlock} + threadIdx.x / 32;
  int lane = threadIdx.x % 32;
  if (row >= rows) return;
  int i = static_cast<int>(row % Tlen);
  float* d = dp + row * Tlen;
  const float* p = att + row * Tlen;
  float dot = 0.0f;
  for (int j = lane; j <= i; j += 32) dot += p[j] * d[j];
  dot = internal::WarpSum(dot);
  for (int j = lane; j < Tlen; j += 32) d[j] = j <= i ? p[j] * (d[j] - dot) : 0.0f;
}

FURNACE_PRELOAD_KERNELS(CausalSoftmaxKernel, CausalSoftmaxBackwardKernel);

}  // namespace

namespace internal {
void CausalSoftmax(float* att, int64_t rows, int Tlen, cudaStream_t stream, const char* op) {
  if (rows <= 0) return;
  CausalSoftmaxKernel<<<static_cast<unsigned>(CeilDiv(rows, kWarpsPerBlock)), kWarpsPerBlock * 32,
                        0, stream>>>(att, rows, Tlen);
  FURNACE_CHECK_LAUNCH(op);
}
void CausalSoftmaxBackward(float* dp, const float* att, int64_t rows, int Tlen, cudaStream_t stream,
                           const char* op) {
  if (rows <= 0) return;
  CausalSoftmaxBackwardKernel<<<static_cast<unsigned>(CeilDiv(rows, kWarpsPerBlock)),
                                kWarpsPerBlock * 32, 0, stream>>>(dp, att, rows, Tlen);
  FURNACE_CHECK_LAUNCH(op);
}
}  // namespace internal

void AttentionForward(float* out, float* att, const float* qkv, int B, int Tlen, int C, int NH,
                      cublasHandle_t handle, cudaStream_t stream) {
  const char* op = "AttentionForward";
  if (!internal::BindCublas(handle, stream, op)) return;
  if (B <= 0 || Tlen <= 0 || C <= 0) return;
  const int hs = C / NH;
  const int ld = 3 * C;
  const int64_t tt = int64_t{Tlen} * Tlen;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const float zero = 0.0f, one = 1.0f;
  for (int b = 0; b < B; ++b) {
    const float* q = qkv + int64_t{b} * Tlen * ld;
    const float* k = q + C;
    float* a = att + int64_t{b} * NH * tt;
    if (!FURNACE_CHECK_CUBLAS(
            op, cublasSgemmStridedBatched(handle, CUBLAS_OP_T, CUBLAS_OP_N, Tlen, Tlen, hs, &scale,
                                          k, ld, hs, q, ld, hs, &zero, a, Tlen, tt, NH))) {
      return;
    }
  }
  int64_t rows = int64_t{B} * NH * Tlen;
  CausalSoftmaxKernel<<<static_cast<unsigned>(internal::CeilDiv(rows, kWarpsPerBlock)),
                        kWarpsPerBlock * 32, 0, stream>>>(att, rows, Tlen);
  if (!FURNACE_CHECK_LAUNCH(op)) return;
  for (int b = 0; b < B; ++b) {
    const float* v = qkv + int64_t{b} * Tlen * ld + 2 * C;
    const float* a = att + int64_t{b} * NH * tt;
    float* o = out + int64_t{b} * Tlen * C;
    if (!FURNACE_CHECK_CUBLAS(
            op, cublasSgemmStridedBatched(handle, CUBLAS_OP_N, CUBLAS_OP_N, hs, Tlen, Tlen, &one, v,
                                          ld, hs, a, Tlen, tt, &zero, o, C, hs, NH))) {
      return;
    }
  }
}

size_t AttentionBackwardWorkspaceBytes(int /*B*/, int Tlen, int /*C*/, int NH) {
  return static_cast<size_t>(NH) * Tlen * Tlen * sizeof(float);
}

void AttentionBackward(float* dqkv, const float* dout, const float* qkv, const float* att, int B,
                       int Tlen, int C, int NH, void* workspace, cublasHandle_t handle,
                       cudaStream_t stream) {
  const char* op = "AttentionBackward";
  if (!internal::BindCublas(handle, stream, op)) return;
  if (B <= 0 || Tlen <= 0 || C <= 0) return;
  const int hs = C / NH;
  const int ld = 3 * C;
  const int64_t tt = int64_t{Tlen} * Tlen;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const float zero = 0.0f, one = 1.0f;
  float* dp = static_cast<float*>(workspace);
  int64_t rows = int64_t{NH} * Tlen;
  for (int b = 0; b < B; ++b) {
    const float* q = qkv + int64_t{b} * Tlen * ld;
    const float* k = q + C;
    const float* v = q + 2 * C;
    float* dq = dqkv + int64_t{b} * Tlen * ld;
    float* dk = dq + C;
    float* dv = dq + 2 * C;
    const float* dy = dout + int64_t{b} * Tlen * C;
    const float* p = att + int64_t{b} * NH * tt;
    bool ok = FURNACE_CHECK_CUBLAS(op, cublasSgemmStridedBatched(
                                           handle, CUBLAS_OP_T, CUBLAS_OP_N, Tlen, Tlen, hs, &one,
                                           v, ld, hs, dy, C, hs, &zero, dp, Tlen, tt, NH)) &&
              FURNACE_CHECK_CUBLAS(op, cublasSgemmStridedBatched(handle, CUBLAS_OP_N, CUBLAS_OP_T,
                                                                 hs, Tlen, Tlen, &one, dy, C, hs, p,
                                                                 Tlen, tt, &one, dv, ld, hs, NH));
    if (!ok) break;
    CausalSoftmaxBackwardKernel<<<static_cast<unsigned>(internal::CeilDiv(rows, kWarpsPerBlock)),
                                  kWarpsPerBlock * 32, 0, stream>>>(dp, p, rows, Tlen);
    ok = FURNACE_CHECK_LAUNCH(op) &&
         FURNACE_CHECK_CUBLAS(
             op, cublasSgemmStridedBatched(handle, CUBLAS_OP_N, CUBLAS_OP_N, hs, Tlen, Tlen, &scale,
                                           k, ld, hs, dp, Tlen, tt, &one, dq, ld, hs, NH)) &&
         FURNACE_CHECK_CUBLAS(
             op, cublasSgemmStridedBatched(handle, CUBLAS_OP_N, CUBLAS_OP_T, hs, Tlen, Tlen, &scale,
                                           q, ld, hs, dp, Tlen, tt, &one, dk, ld, hs, NH));
    if (!ok) break;
  }
}

}  // namespace furnace::kernels::cuda
