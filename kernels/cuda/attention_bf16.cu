// bf16-operand attention: attention.cu's GEMMs as cublasGemmStridedBatchedEx on bf16 copies
// (column-major reading as there; per sequence, batched over heads):
//   S^T = Kc^T Qc (scaled) -> att;  causal softmax in fp32;  P16 = bf16(att_b);  out^T = Vc P16c
//   dP^T = Vc^T dout16c;  dV^T += dout16c P16c^T;  dS = softmax'(att, dP) (fp32);  dS16 = bf16(dS);
//   dQ^T += scale Kc dS16c;  dK^T += scale Qc dS16c^T
// qkv and dout are cast once for all sequences; P16, dP and dS16 are per-sequence scratch reused
// in stream order.
// The RowStats pair: attention.cu's query blocks (rows [r0, r1) against keys [0, r1); the block's
// matrices (r1, n) column-major, n = r1 - r0) with the same GEMMs on the bf16 copies; S and dP in
// fp32 block scratch, P (forward: the softmax; backward: rebuilt from the stats) and dS rounded
// into bf16 block scratch before they enter a product.
#include <algorithm>
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
size_t F32Bytes(int64_t n) { return AlignUp(static_cast<size_t>(n) * sizeof(float)); }

// The RowStats pair's block scratch, fp32 or bf16: (NH, R, T), the most any block needs.
int64_t BlockElems(int Tlen, int NH, int R) {
  return Tlen <= 0 || NH <= 0 ? 0 : int64_t{NH} * R * Tlen;
}

// AttentionForwardBf16's first half, AttentionProbsBf16 whole: qkv cast into qkv16 (B, T, 3C),
// per sequence the scaled scores of its heads into att, then the causal softmax of every row in
// place. False on an error (recorded).
bool ScoresAndSoftmax(float* att, __nv_bfloat16* qkv16, const float* qkv, int B, int Tlen, int C,
                      int NH, cublasHandle_t handle, cudaStream_t stream, const char* op) {
  const int hs = C / NH;
  const int ld = 3 * C;
  const int64_t tt = int64_t{Tlen} * Tlen;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  internal::ToBf16(qkv16, qkv, int64_t{B} * Tlen * ld, stream, op);
  for (int b = 0; b < B; ++b) {
    const __nv_bfloat16* q = qkv16 + int64_t{b} * Tlen * ld;
    if (!GemmSB(handle, CUBLAS_OP_T, CUBLAS_OP_N, Tlen, Tlen, hs, scale, q + C, ld, hs, q, ld, hs,
                0.0f, att + int64_t{b} * NH * tt, Tlen, tt, NH, op)) {
      return false;
    }
  }
  internal::CausalSoftmax(att, int64_t{B} * NH * Tlen, Tlen, stream, op);
  return true;
}

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
  internal::WorkspaceCarver ws(workspace);
  auto* qkv16 = ws.Take<__nv_bfloat16>(int64_t{B} * Tlen * ld);
  auto* p16 = ws.Take<__nv_bfloat16>(NH * tt);
  if (!ScoresAndSoftmax(att, qkv16, qkv, B, Tlen, C, NH, handle, stream, op)) return;
  for (int b = 0; b < B; ++b) {
    const __nv_bfloat16* v = qkv16 + int64_t{b} * Tlen * ld + 2 * C;
    internal::ToBf16(p16, att + int64_t{b} * NH * tt, NH * tt, stream, op);
    if (!GemmSB(handle, CUBLAS_OP_N, CUBLAS_OP_N, hs, Tlen, Tlen, 1.0f, v, ld, hs, p16, Tlen, tt,
                0.0f, out + int64_t{b} * Tlen * C, C, hs, NH, op)) {
      return;
    }
  }
}

size_t AttentionProbsBf16WorkspaceBytes(int B, int Tlen, int C, int /*NH*/) {
  return Bf16Bytes(int64_t{B} * Tlen * 3 * C);
}

void AttentionProbsBf16(float* att, const float* qkv, int B, int Tlen, int C, int NH,
                        void* workspace, cublasHandle_t handle, cudaStream_t stream) {
  const char* op = "AttentionProbsBf16";
  if (!internal::BindCublas(handle, stream, op)) return;
  if (B <= 0 || Tlen <= 0 || C <= 0) return;
  internal::WorkspaceCarver ws(workspace);
  auto* qkv16 = ws.Take<__nv_bfloat16>(int64_t{B} * Tlen * 3 * C);
  ScoresAndSoftmax(att, qkv16, qkv, B, Tlen, C, NH, handle, stream, op);  // the forward's calls
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

size_t AttentionForwardRowStatsBf16WorkspaceBytes(int B, int Tlen, int C, int NH, int row_block) {
  const int64_t blk = BlockElems(Tlen, NH, internal::RowStatsRowBlock(Tlen, NH, row_block));
  return Bf16Bytes(int64_t{B} * Tlen * 3 * C) + F32Bytes(blk) + Bf16Bytes(blk);
}

void AttentionForwardRowStatsBf16(float* out, float* stats, const float* qkv, int B, int Tlen,
                                  int C, int NH, void* workspace, cublasHandle_t handle,
                                  cudaStream_t stream, int row_block) {
  const char* op = "AttentionForwardRowStatsBf16";
  if (!internal::BindCublas(handle, stream, op)) return;
  if (B <= 0 || Tlen <= 0 || C <= 0) return;
  const int hs = C / NH;
  const int ld = 3 * C;
  const int R = internal::RowStatsRowBlock(Tlen, NH, row_block);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  internal::WorkspaceCarver ws(workspace);
  auto* qkv16 = ws.Take<__nv_bfloat16>(int64_t{B} * Tlen * ld);
  auto* s = ws.Take<float>(BlockElems(Tlen, NH, R));            // the block's S, then P
  auto* p16 = ws.Take<__nv_bfloat16>(BlockElems(Tlen, NH, R));  // bf16(P)
  internal::ToBf16(qkv16, qkv, int64_t{B} * Tlen * ld, stream, op);
  for (int b = 0; b < B; ++b) {
    const __nv_bfloat16* q = qkv16 + int64_t{b} * Tlen * ld;
    const __nv_bfloat16* k = q + C;
    const __nv_bfloat16* v = q + 2 * C;
    float* o = out + int64_t{b} * Tlen * C;
    float* st = stats + int64_t{b} * NH * Tlen * 2;
    for (int r0 = 0, r1 = 0; r0 < Tlen; r0 = r1) {
      r1 = static_cast<int>(std::min<int64_t>(Tlen, int64_t{r0} + R));
      const int n = r1 - r0;
      const long long blk = static_cast<long long>(n) * r1;  // head stride of the block scratch
      if (!GemmSB(handle, CUBLAS_OP_T, CUBLAS_OP_N, r1, n, hs, scale, k, ld, hs,
                  q + int64_t{r0} * ld, ld, hs, 0.0f, s, r1, blk, NH, op) ||
          !internal::CausalSoftmaxRowStats(s, st, NH, r0, r1, Tlen, stream, op)) {
        return;
      }
      internal::ToBf16(p16, s, NH * blk, stream, op);
      if (!GemmSB(handle, CUBLAS_OP_N, CUBLAS_OP_N, hs, n, r1, 1.0f, v, ld, hs, p16, r1, blk, 0.0f,
                  o + int64_t{r0} * C, C, hs, NH, op)) {
        return;
      }
    }
  }
}

size_t AttentionBackwardRowStatsBf16WorkspaceBytes(int B, int Tlen, int C, int NH, int row_block) {
  const int64_t blk = BlockElems(Tlen, NH, internal::RowStatsRowBlock(Tlen, NH, row_block));
  return Bf16Bytes(int64_t{B} * Tlen * 3 * C) + Bf16Bytes(int64_t{B} * Tlen * C) +
         2 * F32Bytes(blk) + 2 * Bf16Bytes(blk);
}

void AttentionBackwardRowStatsBf16(float* dqkv, const float* dout, const float* qkv,
                                   const float* stats, int B, int Tlen, int C, int NH,
                                   void* workspace, cublasHandle_t handle, cudaStream_t stream,
                                   int row_block) {
  const char* op = "AttentionBackwardRowStatsBf16";
  if (!internal::BindCublas(handle, stream, op)) return;
  if (B <= 0 || Tlen <= 0 || C <= 0) return;
  const int hs = C / NH;
  const int ld = 3 * C;
  const int R = internal::RowStatsRowBlock(Tlen, NH, row_block);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  internal::WorkspaceCarver ws(workspace);
  auto* qkv16 = ws.Take<__nv_bfloat16>(int64_t{B} * Tlen * ld);
  auto* dout16 = ws.Take<__nv_bfloat16>(int64_t{B} * Tlen * C);
  auto* p = ws.Take<float>(BlockElems(Tlen, NH, R));             // the block's S, then P
  auto* dp = ws.Take<float>(BlockElems(Tlen, NH, R));            // dP, then dS
  auto* p16 = ws.Take<__nv_bfloat16>(BlockElems(Tlen, NH, R));   // bf16(P)
  auto* ds16 = ws.Take<__nv_bfloat16>(BlockElems(Tlen, NH, R));  // bf16(dS)
  internal::ToBf16(qkv16, qkv, int64_t{B} * Tlen * ld, stream, op);
  internal::ToBf16(dout16, dout, int64_t{B} * Tlen * C, stream, op);
  for (int b = 0; b < B; ++b) {
    const __nv_bfloat16* q = qkv16 + int64_t{b} * Tlen * ld;
    const __nv_bfloat16* k = q + C;
    const __nv_bfloat16* v = q + 2 * C;
    float* dq = dqkv + int64_t{b} * Tlen * ld;
    float* dk = dq + C;
    float* dv = dq + 2 * C;
    const __nv_bfloat16* dy = dout16 + int64_t{b} * Tlen * C;
    const float* st = stats + int64_t{b} * NH * Tlen * 2;
    for (int r0 = 0, r1 = 0; r0 < Tlen; r0 = r1) {
      r1 = static_cast<int>(std::min<int64_t>(Tlen, int64_t{r0} + R));
      const int n = r1 - r0;
      const long long blk = static_cast<long long>(n) * r1;
      const __nv_bfloat16* q_blk = q + int64_t{r0} * ld;
      const __nv_bfloat16* dy_blk = dy + int64_t{r0} * C;
      if (!GemmSB(handle, CUBLAS_OP_T, CUBLAS_OP_N, r1, n, hs, scale, k, ld, hs, q_blk, ld, hs,
                  0.0f, p, r1, blk, NH, op) ||
          !internal::CausalSoftmaxRebuild(p, st, NH, r0, r1, Tlen, stream, op)) {
        return;
      }
      internal::ToBf16(p16, p, NH * blk, stream, op);
      if (!GemmSB(handle, CUBLAS_OP_N, CUBLAS_OP_T, hs, r1, n, 1.0f, dy_blk, C, hs, p16, r1, blk,
                  1.0f, dv, ld, hs, NH, op) ||
          !GemmSB(handle, CUBLAS_OP_T, CUBLAS_OP_N, r1, n, hs, 1.0f, v, ld, hs, dy_blk, C, hs, 0.0f,
                  dp, r1, blk, NH, op) ||
          !internal::CausalSoftmaxBackwardBlock(dp, p, NH, r0, r1, stream, op)) {
        return;
      }
      internal::ToBf16(ds16, dp, NH * blk, stream, op);
      if (!GemmSB(handle, CUBLAS_OP_N, CUBLAS_OP_N, hs, n, r1, scale, k, ld, hs, ds16, r1, blk,
                  1.0f, dq + int64_t{r0} * ld, ld, hs, NH, op) ||
          !GemmSB(handle, CUBLAS_OP_N, CUBLAS_OP_T, hs, r1, n, scale, q_blk, ld, hs, ds16, r1, blk,
                  1.0f, dk, ld, hs, NH, op)) {
        return;
      }
    }
  }
}

}  // namespace furnace::kernels::cuda
