// The bf16-operand GEMMs: cast the operands into the workspace (common.cuh ToBf16), then
// cublasGemmEx on the bf16 copies with fp32 C. The column-major reading is matmul.cu's:
//   forward:  out^T     (OC, N) = weight^T (OC, C) * inp^T (C, N)      [N, N], beta 0 or 1 (bias)
//   dinp:     dinp^T    (C, N)  += weight  (C, OC) * dout^T (OC, N)    [T, N]
//   dweight:  dweight^T (OC, C) += dout^T  (OC, N) * inp (N, C)        [N, T]
#include "common.cuh"
#include "kernels/cuda/matmul_bf16.h"

namespace furnace::kernels::cuda {
namespace {

using internal::AlignUp;

// C (m, n) = alpha * op(A) op(B) + beta * C with bf16 A, B and fp32 C, column-major.
bool GemmBf16(cublasHandle_t handle, cublasOperation_t ta, cublasOperation_t tb, int m, int n,
              int k, const __nv_bfloat16* A, int lda, const __nv_bfloat16* B, int ldb, float beta,
              float* C, int ldc, const char* op) {
  const float alpha = 1.0f;
  return FURNACE_CHECK_CUBLAS(
      op, cublasGemmEx(handle, ta, tb, m, n, k, &alpha, A, CUDA_R_16BF, lda, B, CUDA_R_16BF, ldb,
                       &beta, C, CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

// One forward GEMM of `rows` rows on bf16 operands (bias fp32 or nullptr).
bool Forward(float* out, const __nv_bfloat16* inp, const __nv_bfloat16* weight, const float* bias,
             int64_t rows, int C, int OC, cublasHandle_t handle, cudaStream_t stream,
             const char* op) {
  float beta = 0.0f;
  if (bias != nullptr) {
    internal::BroadcastBias(out, bias, rows, OC, stream, op);
    beta = 1.0f;
  }
  if (C == 0) {
    if (bias == nullptr) {
      return FURNACE_CHECK_CUDA(op, cudaMemsetAsync(out, 0, rows * OC * sizeof(float), stream));
    }
    return true;
  }
  return GemmBf16(handle, CUBLAS_OP_N, CUBLAS_OP_N, OC, static_cast<int>(rows), C, weight, OC, inp,
                  C, beta, out, OC, op);
}

bool Backward(float* dinp, float* dweight, float* dbias, const float* dout_f32,
              const __nv_bfloat16* dout, const __nv_bfloat16* inp, const __nv_bfloat16* weight,
              int64_t rows, int C, int OC, cublasHandle_t handle, cudaStream_t stream,
              const char* op) {
  const int n = static_cast<int>(rows);
  if (dinp != nullptr && C > 0 && OC > 0 &&
      !GemmBf16(handle, CUBLAS_OP_T, CUBLAS_OP_N, C, n, OC, weight, OC, dout, OC, 1.0f, dinp, C,
                op)) {
    return false;
  }
  if (dweight != nullptr && C > 0 && OC > 0 &&
      !GemmBf16(handle, CUBLAS_OP_N, CUBLAS_OP_T, OC, C, n, dout, OC, inp, C, 1.0f, dweight, OC,
                op)) {
    return false;
  }
  if (dbias != nullptr) internal::ColumnSumAccumulate(dbias, dout_f32, rows, OC, stream);
  return true;
}

size_t Bf16Bytes(int64_t n) { return AlignUp(static_cast<size_t>(n) * sizeof(__nv_bfloat16)); }

}  // namespace

size_t MatmulForwardBf16WorkspaceBytes(int N, int C, int OC, bool cast_weight) {
  return Bf16Bytes(int64_t{N} * C) + (cast_weight ? Bf16Bytes(int64_t{C} * OC) : 0);
}

void MatmulForwardBf16(float* out, const float* inp, const float* weight, const float* bias, int N,
                       int C, int OC, void* workspace, cublasHandle_t handle, cudaStream_t stream,
                       const __nv_bfloat16* weight16) {
  const char* op = "MatmulForwardBf16";
  if (!internal::BindCublas(handle, stream, op)) return;
  if (N <= 0 || OC <= 0) return;
  internal::WorkspaceCarver ws(workspace);
  auto* inp16 = ws.Take<__nv_bfloat16>(int64_t{N} * C);
  internal::ToBf16(inp16, inp, int64_t{N} * C, stream, op);
  const __nv_bfloat16* w16 = weight16;
  if (w16 == nullptr) {
    auto* cast = ws.Take<__nv_bfloat16>(int64_t{C} * OC);
    internal::ToBf16(cast, weight, int64_t{C} * OC, stream, op);
    w16 = cast;
  }
  Forward(out, inp16, w16, bias, N, C, OC, handle, stream, op);
}

size_t MatmulBackwardBf16WorkspaceBytes(int N, int C, int OC, bool with_dinp, bool cast_weight) {
  return Bf16Bytes(int64_t{N} * OC) + Bf16Bytes(int64_t{N} * C) +
         (with_dinp && cast_weight ? Bf16Bytes(int64_t{C} * OC) : 0);
}

void MatmulBackwardBf16(float* dinp, float* dweight, float* dbias, const float* dout,
                        const float* inp, const float* weight, int N, int C, int OC,
                        void* workspace, cublasHandle_t handle, cudaStream_t stream,
                        const __nv_bfloat16* weight16) {
  const char* op = "MatmulBackwardBf16";
  if (!internal::BindCublas(handle, stream, op)) return;
  if (N <= 0) return;
  internal::WorkspaceCarver ws(workspace);
  auto* dout16 = ws.Take<__nv_bfloat16>(int64_t{N} * OC);
  auto* inp16 = ws.Take<__nv_bfloat16>(int64_t{N} * C);
  internal::ToBf16(dout16, dout, int64_t{N} * OC, stream, op);
  internal::ToBf16(inp16, inp, int64_t{N} * C, stream, op);
  const __nv_bfloat16* w16 = dinp != nullptr ? weight16 : nullptr;
  if (dinp != nullptr && w16 == nullptr) {
    auto* cast = ws.Take<__nv_bfloat16>(int64_t{C} * OC);
    internal::ToBf16(cast, weight, int64_t{C} * OC, stream, op);
    w16 = cast;
  }
  Backward(dinp, dweight, dbias, dout, dout16, inp16, w16, N, C, OC, handle, stream, op);
}

size_t GroupedMatmulForwardBf16WorkspaceBytes(int64_t S, int E, int C, int OC, bool cast_weight) {
  return Bf16Bytes(S * C) + (cast_weight ? Bf16Bytes(int64_t{E} * C * OC) : 0);
}

void GroupedMatmulForwardBf16(float* out, const float* inp, const float* weight, const float* bias,
                              const int64_t* offsets, int E, int C, int OC, void* workspace,
                              cublasHandle_t handle, cudaStream_t stream,
                              const __nv_bfloat16* weight16) {
  const char* op = "GroupedMatmulForwardBf16";
  if (!internal::BindCublas(handle, stream, op)) return;
  const int64_t S = offsets[E];
  if (S <= 0 || OC <= 0) return;
  internal::WorkspaceCarver ws(workspace);
  auto* inp16 = ws.Take<__nv_bfloat16>(S * C);
  internal::ToBf16(inp16, inp, S * C, stream, op);
  const __nv_bfloat16* w16 = weight16;
  if (w16 == nullptr) {
    auto* cast = ws.Take<__nv_bfloat16>(int64_t{E} * C * OC);
    internal::ToBf16(cast, weight, int64_t{E} * C * OC, stream, op);
    w16 = cast;
  }
  for (int e = 0; e < E; ++e) {
    const int64_t begin = offsets[e], rows = offsets[e + 1] - offsets[e];
    if (rows <= 0) continue;
    if (!Forward(out + begin * OC, inp16 + begin * C, w16 + int64_t{e} * C * OC,
                 bias == nullptr ? nullptr : bias + int64_t{e} * OC, rows, C, OC, handle, stream,
                 op)) {
      return;
    }
  }
}

size_t GroupedMatmulBackwardBf16WorkspaceBytes(int64_t S, int E, int C, int OC, bool with_dinp,
                                               bool cast_weight) {
  return Bf16Bytes(S * OC) + Bf16Bytes(S * C) +
         (with_dinp && cast_weight ? Bf16Bytes(int64_t{E} * C * OC) : 0);
}

void GroupedMatmulBackwardBf16(float* dinp, float* dweight, float* dbias, const float* dout,
                               const float* inp, const float* weight, const int64_t* offsets, int E,
                               int C, int OC, void* workspace, cublasHandle_t handle,
                               cudaStream_t stream, const __nv_bfloat16* weight16) {
  const char* op = "GroupedMatmulBackwardBf16";
  if (!internal::BindCublas(handle, stream, op)) return;
  const int64_t S = offsets[E];
  if (S <= 0) return;
  internal::WorkspaceCarver ws(workspace);
  auto* dout16 = ws.Take<__nv_bfloat16>(S * OC);
  auto* inp16 = ws.Take<__nv_bfloat16>(S * C);
  internal::ToBf16(dout16, dout, S * OC, stream, op);
  internal::ToBf16(inp16, inp, S * C, stream, op);
  const __nv_bfloat16* w16 = dinp != nullptr ? weight16 : nullptr;
  if (dinp != nullptr && w16 == nullptr) {
    auto* cast = ws.Take<__nv_bfloat16>(int64_t{E} * C * OC);
    internal::ToBf16(cast, weight, int64_t{E} * C * OC, stream, op);
    w16 = cast;
  }
  for (int e = 0; e < E; ++e) {
    const int64_t begin = offsets[e], rows = offsets[e + 1] - offsets[e];
    if (rows <= 0) continue;
    const int64_t w = int64_t{e} * C * OC;
    if (!Backward(dinp == nullptr ? nullptr : dinp + begin * C, dweight + w,
                  dbias == nullptr ? nullptr : dbias + int64_t{e} * OC, dout + begin * OC,
                  dout16 + begin * OC, inp16 + begin * C, w16 == nullptr ? nullptr : w16 + w, rows,
                  C, OC, handle, stream, op)) {
      return;
    }
  }
}

}  // namespace furnace::kernels::cuda
