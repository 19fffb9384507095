// bf16-operand attention: attention.cu's GEMMs as cublasGemmStridedBatchedEx on bf16 copies
// (column-major reading as there; per sequence, batched over heads):
//   S^T = Kc^T Qc (scaled) -> att;  causal softmax in fp32;  P16 = bf16(att_b);  out^T = Vc P16c
//   dP^T = Vc^T dout16c;  dV^T += dout16c P16c^T;  dS = softmax'(att, dP) (fp32);  dS16 = bf16(dS);
//   dQ^T += scale Kc dS16c;  dK^T += scale Qc dS16c^T
// qkv and dout are cast once for all sequences; P16, dP and dS16 are per-sequence scratch reused
// in stream order.
#include <cmath>

#include "common.cuh"
#include "kernels/cuda/attention_bf16.h"

namespace furnace::kernels::cuda {
namespace {

using internal::AlignUp;

bool GemmSB(cublasHandle_t handle, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
            float alpha, const __nv_bfloat16* A, int lda, long long sa, const __nv_bfloat16* B,
            int ldb, long long sb, float beta, float* C, int ldc, long long sc, int batch,
            const char* op) {
  return FURNACE_CHECK_CUBLAS(
      op, cublasGemmStridedBatchedEx(handle, ta, tb, m, n, k, &alpha, A, CUDA_R_16BF, lda, sa, B,
                                     CUDA_R_16BF, ldb, sb, &beta, C, CUDA_R_32F, ldc, sc, batch,
                                     CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

size_t Bf16Bytes(int64_t n) { return AlignUp(static_cast<size_t>(n) * sizeof(__nv_bfloat16)); }

}  // namespace

size_t AttentionForwardBf16WorkspaceBytes(int B, int Tlen, int C, int NH) {
  return Bf16Bytes(int64_t{B} * Tlen * 3 * C) + Bf16Bytes(int64_t{NH} * Tlen * Tlen);
}

void AttentionForwardBf16(float* out, float* att, const float* qkv, int B, int Tlen, int C, int NH,
                          void* workspace, cublasHandle_t handle, cudaStream_t stream) {
  const char* op = "AttentionForwardBf16";
  if (!internal::BindCublas(handle, stream, op)) return;
  if (B <= 0 || Tlen <= 0 || C <= 0) return;
  const int hs = C / NH;
  const int ld = 3 * C;
  const int64_t tt = int64_t{Tlen} * Tlen;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  internal::WorkspaceCarver ws(workspace);
  auto* qkv16 = ws.Take<__nv_bfloat16>(int64_t{B} * Tlen * ld);
  auto* p16 = ws.Take<__nv_bfloat16>(NH * tt);
  internal::ToBf16(qkv16, qkv, int64_t{B} * Tlen * ld, stream, op);
  for (int b = 0; b < B; ++b) {
    const __nv_bfloat16* q = qkv16 + int64_t{b} * Tlen * ld;
    if (!GemmSB(handle, CUBLAS_OP_T, CUBLAS_OP_N, Tlen, Tlen, hs, scale, q + C, ld, hs, q, ld, hs,
                0.0f, att + int64_t{b} * NH * tt, Tlen, tt, NH, op)) {
      return;
    }
  }
  internal::CausalSoftmax(att, int64_t{B} * NH * Tlen, Tlen, stream, op);
  for (int b = 0; b < B; ++b) {
    const __nv_bfloat16* v = qkv16 + int64_t{b} * Tlen * ld + 2 * C;
    internal::ToBf16(p16, att + int64_t{b} * NH * tt, NH * tt, stream, op);
    if (!GemmSB(handle, CUBLAS_OP_N, CUBLAS_OP_N, hs, Tlen, Tlen, 1.0f, v, ld, hs, p16, Tlen, tt,
                0.0f, out + int64_t{b} * Tlen * C, C, hs, NH, op)) {
      return;
    }
  }
}

size_t AttentionBackwardBf16WorkspaceBytes(int B, int Tlen, int C, int NH) {
  const int64_t tt = int64_t{Tlen} * Tlen;
  return Bf16Bytes(int64_t{B} * Tlen * 3 * C) + Bf16Bytes(int64_t{B} * Tlen * C) +
         2 * Bf16Bytes(NH * tt) + AlignUp(static_cast<size_t>(NH * tt) * sizeof(float));
}

void AttentionBackwardBf16(float* dqkv, const float* dout, const float* qkv, const float* att,
                           int B, int Tlen, int C, int NH, void* workspace, cublasHandle_t handle,
                           cudaStream_t stream) {
  const char* op = "AttentionBackwardBf16";
  if (!internal::BindCublas(handle, stream, op)) return;
  if (B <= 0 || Tlen <= 0 || C <= 0) return;
  const int hs = C / NH;
  const int ld = 3 * C;
  const int64_t tt = int64_t{Tlen} * Tlen;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  internal::WorkspaceCarver ws(workspace);
  auto* qkv16 = ws.Take<__nv_bfloat16>(int64_t{B} * Tlen * ld);
  auto* dout16 = ws.Take<__nv_bfloat16>(int64_t{B} * Tlen * C);
  auto* p16 = ws.Take<__nv_bfloat16>(NH * tt);
  auto* ds16 = ws.Take<__nv_bfloat16>(NH * tt);
  auto* dp = ws.Take<float>(NH * tt);
  internal::ToBf16(qkv16, qkv, int64_t{B} * Tlen * ld, stream, op);
  internal::ToBf16(dout16, dout, int64_t{B} * Tlen * C, stream, op);
  const int64_t rows = int64_t{NH} * Tlen;
  for (int b = 0; b < B; ++b) {
    const __nv_bfloat16* q = qkv16 + int64_t{b} * Tlen * ld;
    const __nv_bfloat16* k = q + C;
    const __nv_bfloat16* v = q + 2 * C;
    float* dq = dqkv + int64_t{b} * Tlen * ld;
    float* dk = dq + C;
    float* dv = dq + 2 * C;
    const __nv_bfloat16* dy = dout16 + int64_t{b} * Tlen * C;
    const float* p = att + int64_t{b} * NH * tt;
    internal::ToBf16(p16, p, NH * tt, stream, op);
    if (!GemmSB(handle, CUBLAS_OP_T, CUBLAS_OP_N, Tlen, Tlen, hs, 1.0f, v, ld, hs, dy, C, hs, 0.0f,
                dp, Tlen, tt, NH, op) ||
        !GemmSB(handle, CUBLAS_OP_N, CUBLAS_OP_T, hs, Tlen, Tlen, 1.0f, dy, C, hs, p16, Tlen, tt,
                1.0f, dv, ld, hs, NH, op)) {
      return;
    }
    internal::CausalSoftmaxBackward(dp, p, rows, Tlen, stream, op);
    internal::ToBf16(ds16, dp, NH * tt, stream, op);
    if (!GemmSB(handle, CUBLAS_OP_N, CUBLAS_OP_N, hs, Tlen, Tlen, scale, k, ld, hs, ds16, Tlen, tt,
                1.0f, dq, ld, hs, NH, op) ||
        !GemmSB(handle, CUBLAS_OP_N, CUBLAS_OP_T, hs, Tlen, Tlen, scale, q, ld, hs, ds16, Tlen, tt,
                1.0f, dk, ld, hs, NH, op)) {
      return;
    }
  }
}

}  // namespace furnace::kernels::cuda
