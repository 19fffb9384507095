// Causal attention with cuBLAS strided-batched GEMMs over the heads of one sequence (a head's q,
// k, v are (T, hs) views of qkv with leading dimension 3C, hs apart from head to head).
// Column-major reading (see matmul.cu): with Qc = Q^T (hs, T) etc.,
//   scores^T = Kc^T Qc             -> att (T, T) row-major, scaled by 1/sqrt(hs)
//   out^T    = Vc Pc               -> out (T, hs) with leading dimension C
// backward, with dP = dout V^T and dS = softmax'(P, dP):
//   dP^T = Vc^T doutc;  dV^T += doutc Pc^T;  dQ^T += scale Kc dSc;  dK^T += scale Qc dSc^T
// The RowStats pair runs the same products on a query block [r0, r1) of n = r1 - r0 rows against
// keys [0, r1): the block's S, P, dP and dS are (n, r1) row-major (leading dimension r1, heads
// n * r1 apart), i.e. (r1, n) column-major, and Q, out, dout, dQ start at row r0:
//   S^T = Kc[:, 0:r1]^T Qc[:, r0:r1]      (m r1, n n, k hs)
//   out^T[:, r0:r1] = Vc[:, 0:r1] Pc      (m hs, n n, k r1)
//   dP^T = Vc[:, 0:r1]^T doutc[:, r0:r1]  (m r1, n n, k hs)
//   dV^T[:, 0:r1] += doutc[:, r0:r1] Pc^T (m hs, n r1, k n)
//   dQ^T[:, r0:r1] += scale Kc[:, 0:r1] dSc;  dK^T[:, 0:r1] += scale Qc[:, r0:r1] dSc^T
#include <algorithm>
#include <cmath>

#include "common.cuh"
#include "kernels/cuda/attention.h"

namespace furnace::kernels::cuda {
namespace {

constexpr int kWarpsPerBlock = 8;

// The kernels below see `total` rows of length len = r0 + n, grouped n to a matrix (a head of a
// query block [r0, r0 + n); n = T and r0 = 0 for whole (T, T) matrices): row `row` is query
// i = r0 + row % n of matrix row / n, over keys j < len, causal (j <= i < len). One warp per row.

// Softmax over j <= i in place, zeros above the diagonal. stats, where not null, is the (NH, T, 2)
// row statistics of the sequence (matrix h = row / n is head h): (max, 1 / sum) of row i.
__global__ void CausalSoftmaxKernel(float* att, float* stats, int64_t total, int n, int r0,
                                    int Tlen) {
  int64_t row = blockIdx.x * int64_t{kWarpsPerBlock} + threadIdx.x / 32;
  int lane = threadIdx.x % 32;
  if (row >= total) return;
  const int len = r0 + n;
  const int i = r0 + static_cast<int>(row % n);
  float* a = att + row * len;
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
  for (int j = lane; j < len; j += 32) a[j] = j <= i ? a[j] * inv : 0.0f;
  if (stats != nullptr && lane == 0) {
    float* st = stats + ((row / n) * Tlen + i) * 2;
    st[0] = mx;
    st[1] = inv;
  }
}

// The probabilities rebuilt in place from the scores and the row statistics (CausalSoftmaxKernel's
// own operations: expf(s - max) * (1 / sum)), zeros above the diagonal.
__global__ void CausalSoftmaxRebuildKernel(float* att, const float* stats, int64_t total, int n,
                                           int r0, int Tlen) {
  int64_t row = blockIdx.x * int64_t{kWarpsPerBlock} + threadIdx.x / 32;
  int lane = threadIdx.x % 32;
  if (row >= total) return;
  const int len = r0 + n;
  const int i = r0 + static_cast<int>(row % n);
  float* a = att + row * len;
  const float* st = stats + ((row / n) * Tlen + i) * 2;
  const float mx = st[0], inv = st[1];
  for (int j = lane; j < len; j += 32) a[j] = j <= i ? expf(a[j] - mx) * inv : 0.0f;
}

// dS = P * (dP - rowsum(P * dP)) in place in dp; zero above the diagonal.
__global__ void CausalSoftmaxBackwardKernel(float* dp, const float* att, int64_t total, int n,
                                            int r0) {
  int64_t row = blockIdx.x * int64_t{kWarpsPerBlock} + threadIdx.x / 32;
  int lane = threadIdx.x % 32;
  if (row >= total) return;
  const int len = r0 + n;
  const int i = r0 + static_cast<int>(row % n);
  float* d = dp + row * len;
  const float* p = att + row * len;
  float dot = 0.0f;
  for (int j = lane; j <= i; j += 32) dot += p[j] * d[j];
  dot = internal::WarpSum(dot);
  for (int j = lane; j < len; j += 32) d[j] = j <= i ? p[j] * (d[j] - dot) : 0.0f;
}

FURNACE_PRELOAD_KERNELS(CausalSoftmaxKernel, CausalSoftmaxRebuildKernel,
                        CausalSoftmaxBackwardKernel);

unsigned RowGrid(int64_t rows) {
  return static_cast<unsigned>(internal::CeilDiv(rows, kWarpsPerBlock));
}

// One block's scratch (NH, R, T) fp32, the most any block of the sequence needs.
int64_t ScratchFloats(int Tlen, int NH, int R) {
  return Tlen <= 0 || NH <= 0 || R <= 0 ? 0 : int64_t{NH} * R * Tlen;
}

}  // namespace

namespace internal {
void CausalSoftmax(float* att, int64_t rows, int Tlen, cudaStream_t stream, const char* op) {
  if (rows <= 0) return;
  CausalSoftmaxKernel<<<RowGrid(rows), kWarpsPerBlock * 32, 0, stream>>>(att, nullptr, rows, Tlen,
                                                                         0, Tlen);
  FURNACE_CHECK_LAUNCH(op);
}
void CausalSoftmaxBackward(float* dp, const float* att, int64_t rows, int Tlen, cudaStream_t stream,
                           const char* op) {
  if (rows <= 0) return;
  CausalSoftmaxBackwardKernel<<<RowGrid(rows), kWarpsPerBlock * 32, 0, stream>>>(dp, att, rows,
                                                                                 Tlen, 0);
  FURNACE_CHECK_LAUNCH(op);
}
int RowStatsRowBlock(int Tlen, int NH, int row_block) {
  if (Tlen <= 0) return 1;
  return row_block > 0 ? std::min(row_block, Tlen) : AttentionRowStatsRowBlock(Tlen, NH);
}
bool CausalSoftmaxRowStats(float* s, float* stats, int NH, int r0, int r1, int Tlen,
                           cudaStream_t stream, const char* op) {
  const int n = r1 - r0;
  const int64_t rows = int64_t{NH} * n;
  if (rows <= 0) return true;
  CausalSoftmaxKernel<<<RowGrid(rows), kWarpsPerBlock * 32, 0, stream>>>(s, stats, rows, n, r0,
                                                                         Tlen);
  return FURNACE_CHECK_LAUNCH(op);
}
bool CausalSoftmaxRebuild(float* s, const float* stats, int NH, int r0, int r1, int Tlen,
                          cudaStream_t stream, const char* op) {
  const int n = r1 - r0;
  const int64_t rows = int64_t{NH} * n;
  if (rows <= 0) return true;
  CausalSoftmaxRebuildKernel<<<RowGrid(rows), kWarpsPerBlock * 32, 0, stream>>>(s, stats, rows, n,
                                                                                r0, Tlen);
  return FURNACE_CHECK_LAUNCH(op);
}
bool CausalSoftmaxBackwardBlock(float* dp, const float* p, int NH, int r0, int r1,
                                cudaStream_t stream, const char* op) {
  const int n = r1 - r0;
  const int64_t rows = int64_t{NH} * n;
  if (rows <= 0) return true;
  CausalSoftmaxBackwardKernel<<<RowGrid(rows), kWarpsPerBlock * 32, 0, stream>>>(dp, p, rows, n,
                                                                                 r0);
  return FURNACE_CHECK_LAUNCH(op);
}
}  // namespace internal

namespace {
// AttentionForward's first half: per sequence the scaled scores of its heads into att, then the
// causal softmax of every row in place. False on an error (recorded).
bool ScoresAndSoftmax(float* att, const float* qkv, int B, int Tlen, int C, int NH,
                      cublasHandle_t handle, cudaStream_t stream, const char* op) {
  const int hs = C / NH;
  const int ld = 3 * C;
  const int64_t tt = int64_t{Tlen} * Tlen;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const float zero = 0.0f;
  for (int b = 0; b < B; ++b) {
    const float* q = qkv + int64_t{b} * Tlen * ld;
    const float* k = q + C;
    float* a = att + int64_t{b} * NH * tt;
    if (!FURNACE_CHECK_CUBLAS(
            op, cublasSgemmStridedBatched(handle, CUBLAS_OP_T, CUBLAS_OP_N, Tlen, Tlen, hs, &scale,
                                          k, ld, hs, q, ld, hs, &zero, a, Tlen, tt, NH))) {
      return false;
    }
  }
  int64_t rows = int64_t{B} * NH * Tlen;
  CausalSoftmaxKernel<<<RowGrid(rows), kWarpsPerBlock * 32, 0, stream>>>(att, nullptr, rows, Tlen,
                                                                         0, Tlen);
  return FURNACE_CHECK_LAUNCH(op);
}
}  // namespace

void AttentionForward(float* out, float* att, const float* qkv, int B, int Tlen, int C, int NH,
                      cublasHandle_t handle, cudaStream_t stream) {
  const char* op = "AttentionForward";
  if (!internal::BindCublas(handle, stream, op)) return;
  if (B <= 0 || Tlen <= 0 || C <= 0) return;
  const int hs = C / NH;
  const int ld = 3 * C;
  const int64_t tt = int64_t{Tlen} * Tlen;
  const float zero = 0.0f, one = 1.0f;
  if (!ScoresAndSoftmax(att, qkv, B, Tlen, C, NH, handle, stream, op)) return;
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

void AttentionProbs(float* att, const float* qkv, int B, int Tlen, int C, int NH,
                    cublasHandle_t handle, cudaStream_t stream) {
  const char* op = "AttentionProbs";
  if (!internal::BindCublas(handle, stream, op)) return;
  if (B <= 0 || Tlen <= 0 || C <= 0) return;
  ScoresAndSoftmax(att, qkv, B, Tlen, C, NH, handle, stream, op);
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
    CausalSoftmaxBackwardKernel<<<RowGrid(rows), kWarpsPerBlock * 32, 0, stream>>>(dp, p, rows,
                                                                                   Tlen, 0);
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

int AttentionRowStatsRowBlock(int Tlen, int NH) {
  if (Tlen <= 0) return 1;
  constexpr int64_t kScratchFloats = int64_t{16} << 20;  // 64 MiB of fp32
  const int64_t per_row = int64_t{std::max(NH, 1)} * Tlen;
  int64_t r = kScratchFloats / per_row / 64 * 64;
  r = std::min<int64_t>(std::max<int64_t>(r, 64), Tlen);
  return static_cast<int>(r);
}

size_t AttentionForwardRowStatsWorkspaceBytes(int /*B*/, int Tlen, int /*C*/, int NH,
                                              int row_block) {
  const int R = internal::RowStatsRowBlock(Tlen, NH, row_block);
  return internal::AlignUp(static_cast<size_t>(ScratchFloats(Tlen, NH, R)) * sizeof(float));
}

void AttentionForwardRowStats(float* out, float* stats, const float* qkv, int B, int Tlen, int C,
                              int NH, void* workspace, cublasHandle_t handle, cudaStream_t stream,
                              int row_block) {
  const char* op = "AttentionForwardRowStats";
  if (!internal::BindCublas(handle, stream, op)) return;
  if (B <= 0 || Tlen <= 0 || C <= 0) return;
  const int hs = C / NH;
  const int ld = 3 * C;
  const int R = internal::RowStatsRowBlock(Tlen, NH, row_block);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const float zero = 0.0f, one = 1.0f;
  float* s = static_cast<float*>(workspace);  // (NH, n, r1) of the current block
  for (int b = 0; b < B; ++b) {
    const float* q = qkv + int64_t{b} * Tlen * ld;
    const float* k = q + C;
    const float* v = q + 2 * C;
    float* o = out + int64_t{b} * Tlen * C;
    float* st = stats + int64_t{b} * NH * Tlen * 2;
    for (int r0 = 0, r1 = 0; r0 < Tlen; r0 = r1) {
      r1 = static_cast<int>(std::min<int64_t>(Tlen, int64_t{r0} + R));
      const int n = r1 - r0;
      const long long blk = static_cast<long long>(n) * r1;  // head stride of the block scratch
      bool ok =
          FURNACE_CHECK_CUBLAS(op, cublasSgemmStridedBatched(
                                       handle, CUBLAS_OP_T, CUBLAS_OP_N, r1, n, hs, &scale, k, ld,
                                       hs, q + int64_t{r0} * ld, ld, hs, &zero, s, r1, blk, NH)) &&
          internal::CausalSoftmaxRowStats(s, st, NH, r0, r1, Tlen, stream, op) &&
          FURNACE_CHECK_CUBLAS(op, cublasSgemmStridedBatched(
                                       handle, CUBLAS_OP_N, CUBLAS_OP_N, hs, n, r1, &one, v, ld, hs,
                                       s, r1, blk, &zero, o + int64_t{r0} * C, C, hs, NH));
      if (!ok) return;
    }
  }
}

size_t AttentionBackwardRowStatsWorkspaceBytes(int /*B*/, int Tlen, int /*C*/, int NH,
                                               int row_block) {
  const int R = internal::RowStatsRowBlock(Tlen, NH, row_block);
  return 2 * internal::AlignUp(static_cast<size_t>(ScratchFloats(Tlen, NH, R)) * sizeof(float));
}

void AttentionBackwardRowStats(float* dqkv, const float* dout, const float* qkv, const float* stats,
                               int B, int Tlen, int C, int NH, void* workspace,
                               cublasHandle_t handle, cudaStream_t stream, int row_block) {
  const char* op = "AttentionBackwardRowStats";
  if (!internal::BindCublas(handle, stream, op)) return;
  if (B <= 0 || Tlen <= 0 || C <= 0) return;
  const int hs = C / NH;
  const int ld = 3 * C;
  const int R = internal::RowStatsRowBlock(Tlen, NH, row_block);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const float zero = 0.0f, one = 1.0f;
  internal::WorkspaceCarver ws(workspace);
  float* p = ws.Take<float>(ScratchFloats(Tlen, NH, R));   // the block's S, then P
  float* dp = ws.Take<float>(ScratchFloats(Tlen, NH, R));  // the block's dP, then dS
  for (int b = 0; b < B; ++b) {
    const float* q = qkv + int64_t{b} * Tlen * ld;
    const float* k = q + C;
    const float* v = q + 2 * C;
    float* dq = dqkv + int64_t{b} * Tlen * ld;
    float* dk = dq + C;
    float* dv = dq + 2 * C;
    const float* dy = dout + int64_t{b} * Tlen * C;
    const float* st = stats + int64_t{b} * NH * Tlen * 2;
    for (int r0 = 0, r1 = 0; r0 < Tlen; r0 = r1) {
      r1 = static_cast<int>(std::min<int64_t>(Tlen, int64_t{r0} + R));
      const int n = r1 - r0;
      const long long blk = static_cast<long long>(n) * r1;
      const float* q_blk = q + int64_t{r0} * ld;
      const float* dy_blk = dy + int64_t{r0} * C;
      bool ok =
          FURNACE_CHECK_CUBLAS(
              op, cublasSgemmStridedBatched(handle, CUBLAS_OP_T, CUBLAS_OP_N, r1, n, hs, &scale, k,
                                            ld, hs, q_blk, ld, hs, &zero, p, r1, blk, NH)) &&
          internal::CausalSoftmaxRebuild(p, st, NH, r0, r1, Tlen, stream, op) &&
          FURNACE_CHECK_CUBLAS(
              op, cublasSgemmStridedBatched(handle, CUBLAS_OP_N, CUBLAS_OP_T, hs, r1, n, &one,
                                            dy_blk, C, hs, p, r1, blk, &one, dv, ld, hs, NH)) &&
          FURNACE_CHECK_CUBLAS(
              op, cublasSgemmStridedBatched(handle, CUBLAS_OP_T, CUBLAS_OP_N, r1, n, hs, &one, v,
                                            ld, hs, dy_blk, C, hs, &zero, dp, r1, blk, NH)) &&
          internal::CausalSoftmaxBackwardBlock(dp, p, NH, r0, r1, stream, op) &&
          FURNACE_CHECK_CUBLAS(op, cublasSgemmStridedBatched(
                                       handle, CUBLAS_OP_N, CUBLAS_OP_N, hs, n, r1, &scale, k, ld,
                                       hs, dp, r1, blk, &one, dq + int64_t{r0} * ld, ld, hs, NH)) &&
          FURNACE_CHECK_CUBLAS(
              op, cublasSgemmStridedBatched(handle, CUBLAS_OP_N, CUBLAS_OP_T, hs, r1, n, &scale,
                                            q_blk, ld, hs, dp, r1, blk, &one, dk, ld, hs, NH));
      if (!ok) return;
    }
  }
}

}  // namespace furnace::kernels::cuda
