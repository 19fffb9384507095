// The CUDA bf16 table (cuda_backend.h, backend.h "Precision"): the fp32 table with its GEMMs and
// attention replaced by the bf16-operand launchers of kernels/cuda/matmul_bf16.h and
// attention_bf16.h. Each takes its bf16 workspace as op scratch (CudaOp::Scratch: Device::Allocate
// on the op's stream, freed stream-ordered when the op returns, so it is reused from the pool at
// the next op and never counted in the job's activation budget, like cuBLAS's own workspace).
// A GEMM whose weight operand has a bf16 mirror (weight_mirror.h: the model's parameters) reads
// the mirror and casts only its activation operands.
#include "kernels/cuda/attention_bf16.h"
#include "kernels/cuda/matmul_bf16.h"
#include "runtime/device/cuda_backend.h"
#include "runtime/device/cuda_op.h"
#include "runtime/device/weight_mirror.h"

namespace furnace::device {
namespace {

namespace kc = kernels::cuda;
using cuda_internal::CudaOp;

// The weight operand's bf16 mirror (weight_mirror.h), or nullptr: then the launcher rounds it.
const __nv_bfloat16* Mirror(const float* weight, int64_t n) {
  return reinterpret_cast<const __nv_bfloat16*>(FindWeightMirror(weight, n));
}

void MatmulForwardBf16(float* out, const float* inp, const float* weight, const float* bias, int N,
                       int C, int OC) {
  CudaOp op("matmul_forward (bf16)", {out, inp, weight});
  cublasHandle_t handle = op.cublas();
  const __nv_bfloat16* w16 = Mirror(weight, int64_t{C} * OC);
  void* ws = op.Scratch(kc::MatmulForwardBf16WorkspaceBytes(N, C, OC, w16 == nullptr));
  if (op.ok()) {
    kc::MatmulForwardBf16(out, inp, weight, bias, N, C, OC, ws, handle, op.stream(), w16);
  }
}

void MatmulBackwardBf16(float* dinp, float* dweight, float* dbias, const float* dout,
                        const float* inp, const float* weight, int N, int C, int OC) {
  CudaOp op("matmul_backward (bf16)", {dinp, dweight, dbias, dout});
  cublasHandle_t handle = op.cublas();
  const __nv_bfloat16* w16 = Mirror(weight, int64_t{C} * OC);
  void* ws =
      op.Scratch(kc::MatmulBackwardBf16WorkspaceBytes(N, C, OC, dinp != nullptr, w16 == nullptr));
  if (op.ok()) {
    kc::MatmulBackwardBf16(dinp, dweight, dbias, dout, inp, weight, N, C, OC, ws, handle,
                           op.stream(), w16);
  }
}

void GroupedMatmulForwardBf16(float* out, const float* inp, const float* weight, const float* bias,
                              const int64_t* offsets, int E, int C, int OC) {
  CudaOp op("grouped_matmul_forward (bf16)", {out, inp, weight});
  cublasHandle_t handle = op.cublas();
  const __nv_bfloat16* w16 = Mirror(weight, int64_t{E} * C * OC);
  void* ws =
      op.Scratch(kc::GroupedMatmulForwardBf16WorkspaceBytes(offsets[E], E, C, OC, w16 == nullptr));
  if (op.ok()) {
    kc::GroupedMatmulForwardBf16(out, inp, weight, bias, offsets, E, C, OC, ws, handle, op.stream(),
                                 w16);
  }
}

void GroupedMatmulBackwardBf16(float* dinp, float* dweight, float* dbias, const float* dout,
                               const float* inp, const float* weight, const int64_t* offsets, int E,
                               int C, int OC) {
  CudaOp op("grouped_matmul_backward (bf16)", {dinp, dweight, dbias, dout});
  cublasHandle_t handle = op.cublas();
  const __nv_bfloat16* w16 = Mirror(weight, int64_t{E} * C * OC);
  void* ws = op.Scratch(kc::GroupedMatmulBackwardBf16WorkspaceBytes(
      offsets[E], E, C, OC, dinp != nullptr, w16 == nullptr));
  if (op.ok()) {
    kc::GroupedMatmulBackwardBf16(dinp, dweight, dbias, dout, inp, weight, offsets, E, C, OC, ws,
                                  handle, op.stream(), w16);
  }
}

void AttentionForwardBf16(float* out, float* att, const float* qkv, int B, int T, int C, int NH) {
  CudaOp op("attention_forward (bf16)", {out, att, qkv});
  cublasHandle_t handle = op.cublas();
  void* ws = op.Scratch(kc::AttentionForwardBf16WorkspaceBytes(B, T, C, NH));
  if (op.ok()) kc::AttentionForwardBf16(out, att, qkv, B, T, C, NH, ws, handle, op.stream());
}

void AttentionBackwardBf16(float* dqkv, const float* dout, const float* qkv, const float* att,
                           int B, int T, int C, int NH) {
  CudaOp op("attention_backward (bf16)", {dqkv, dout, qkv, att});
  cublasHandle_t handle = op.cublas();
  void* ws = op.Scratch(kc::AttentionBackwardBf16WorkspaceBytes(B, T, C, NH));
  if (op.ok()) {
    kc::AttentionBackwardBf16(dqkv, dout, qkv, att, B, T, C, NH, ws, handle, op.stream());
  }
}

void AttentionForwardRowStatsBf16(float* out, float* stats, const float* qkv, int B, int T, int C,
                                  int NH) {
  CudaOp op("attention_forward_row_stats (bf16)", {out, stats, qkv});
  cublasHandle_t handle = op.cublas();
  void* ws = op.Scratch(kc::AttentionForwardRowStatsBf16WorkspaceBytes(B, T, C, NH));
  if (op.ok()) {
    kc::AttentionForwardRowStatsBf16(out, stats, qkv, B, T, C, NH, ws, handle, op.stream());
  }
}

void AttentionBackwardRowStatsBf16(float* dqkv, const float* dout, const float* qkv,
                                   const float* stats, int B, int T, int C, int NH) {
  CudaOp op("attention_backward_row_stats (bf16)", {dqkv, dout, qkv, stats});
  cublasHandle_t handle = op.cublas();
  void* ws = op.Scratch(kc::AttentionBackwardRowStatsBf16WorkspaceBytes(B, T, C, NH));
  if (op.ok()) {
    kc::AttentionBackwardRowStatsBf16(dqkv, dout, qkv, stats, B, T, C, NH, ws, handle, op.stream());
  }
}

void AttentionProbsBf16(float* att, const float* qkv, int B, int T, int C, int NH) {
  CudaOp op("attention_probs (bf16)", {att, qkv});
  cublasHandle_t handle = op.cublas();
  void* ws = op.Scratch(kc::AttentionProbsBf16WorkspaceBytes(B, T, C, NH));
  if (op.ok()) kc::AttentionProbsBf16(att, qkv, B, T, C, NH, ws, handle, op.stream());
}

Backend MakeCudaBf16Backend() {
  Backend b = CudaBackend();
  b.name = "cuda/bf16";
  b.precision = Precision::kBf16;
  b.matmul_forward = &MatmulForwardBf16;
  b.matmul_backward = &MatmulBackwardBf16;
  b.grouped_matmul_forward = &GroupedMatmulForwardBf16;
  b.grouped_matmul_backward = &GroupedMatmulBackwardBf16;
  b.attention_forward = &AttentionForwardBf16;
  b.attention_backward = &AttentionBackwardBf16;
  b.attention_forward_row_stats = &AttentionForwardRowStatsBf16;
  b.attention_backward_row_stats = &AttentionBackwardRowStatsBf16;
  b.attention_probs = &AttentionProbsBf16;
  return b;
}

}  // namespace

const Backend& CudaBf16Backend() {
  static const Backend table = MakeCudaBf16Backend();
  return table;
}

}  // namespace furnace::device
