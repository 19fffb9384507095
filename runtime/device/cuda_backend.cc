// The CUDA fp32 table (cuda_backend.h): each entry opens a CudaOp (device, stream, handle,
// scratch, errors: cuda_op.h) and calls the kernels::cuda launcher of its name. Launchers whose
// argument list is the CPU kernel's plus a trailing stream (and, for cuBLAS ones, a handle before
// it) go through the Streamed / Cublased adapters; the rest (host scalars, the dispatch plan,
// add_row's host row) are written out below.
#include "runtime/device/cuda_backend.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "kernels/attention.h"
#include "kernels/cast.h"
#include "kernels/cross_entropy.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/cast.h"
#include "kernels/cuda/cross_entropy.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/encoder.h"
#include "kernels/cuda/gelu.h"
#include "kernels/cuda/layernorm.h"
#include "kernels/cuda/matmul.h"
#include "kernels/cuda/optimizer.h"
#include "kernels/cuda/permute.h"
#include "kernels/cuda/router.h"
#include "kernels/elementwise.h"
#include "kernels/encoder.h"
#include "kernels/gelu.h"
#include "kernels/layernorm.h"
#include "kernels/matmul.h"
#include "kernels/optimizer.h"
#include "kernels/permute.h"
#include "kernels/router.h"
#include "runtime/device/backend_op_names.h"
#include "runtime/device/cuda_backend_ops.h"
#include "runtime/device/cuda_op.h"
#include "runtime/device/cuda_status.h"

namespace furnace::device {
namespace cuda_internal {

namespace kc = kernels::cuda;

// The dispatch plan's slot (N * k) and token (S) arrays on the device, uploaded on op.stream().
// A plan whose arrays do not match its sizes is refused (sticky error), not read out of bounds.
kc::DeviceDispatchPlan UploadPlan(CudaOp& op, const DispatchPlan& plan) {
  kc::DeviceDispatchPlan d;
  d.N = plan.N;
  d.E = plan.E;
  d.k = plan.k;
  d.rows = plan.rows();
  if (plan.slot.size() != static_cast<size_t>(plan.N) * plan.k ||
      plan.token.size() != static_cast<size_t>(d.rows)) {
    op.Fail(absl::InvalidArgumentError("dispatch plan arrays do not match N * k and rows()"));
    return d;
  }
  d.slot =
      static_cast<const int64_t*>(op.Upload(plan.slot.data(), plan.slot.size() * sizeof(int64_t)));
  d.token = static_cast<const int32_t*>(
      op.Upload(plan.token.data(), plan.token.size() * sizeof(int32_t)));
  return d;
}

void PermuteForward(float* out, const float* inp, const DispatchPlan& plan, int C) {
  CudaOp op("permute_forward", {out, inp});
  const kc::DeviceDispatchPlan d = UploadPlan(op, plan);
  if (op.ok()) kc::PermuteForward(out, inp, d, C, op.stream());
}

void PermuteBackward(float* dinp, const float* dout, const DispatchPlan& plan, int C) {
  CudaOp op("permute_backward", {dinp, dout});
  const kc::DeviceDispatchPlan d = UploadPlan(op, plan);
  if (op.ok()) kc::PermuteBackward(dinp, dout, d, C, op.stream());
}

void UnpermuteForward(float* out, const float* expert_out, const float* gates,
                      const DispatchPlan& plan, int C) {
  CudaOp op("unpermute_forward", {out, expert_out, gates});
  const kc::DeviceDispatchPlan d = UploadPlan(op, plan);
  if (op.ok()) kc::UnpermuteForward(out, expert_out, gates, d, C, op.stream());
}

void UnpermuteBackward(float* dexpert_out, float* dgates, const float* dout,
                       const float* expert_out, const float* gates, const DispatchPlan& plan,
                       int C) {
  CudaOp op("unpermute_backward", {dexpert_out, dgates, dout});
  const kc::DeviceDispatchPlan d = UploadPlan(op, plan);
  if (op.ok()) {
    kc::UnpermuteBackward(dexpert_out, dgates, dout, expert_out, gates, d, C, op.stream());
  }
}

void AddRow(float* out, const float* row, int64_t N, int C) {
  CudaOp op("add_row", {out});
  if (N <= 0 || C <= 0) return;
  const auto* d_row = static_cast<const float*>(op.Upload(row, sizeof(float) * C));
  if (op.ok()) kc::AddRow(out, d_row, N, C, op.stream());
}

float AuxLossForward(const float* probs, const int32_t* indices, int N, int E, int k, float alpha) {
  CudaOp op("aux_loss_forward", {probs, indices});
  auto* d_aux = static_cast<float*>(op.Scratch(sizeof(float) * (1 + std::max(E, 0))));
  if (!op.ok()) return std::numeric_limits<float>::quiet_NaN();
  kc::AuxLossForward(d_aux, d_aux + 1, probs, indices, N, E, k, alpha, op.stream());
  float aux = std::numeric_limits<float>::quiet_NaN();
  if (cudaMemcpyAsync(&aux, d_aux, sizeof(float), cudaMemcpyDeviceToHost, op.stream()) !=
      cudaSuccess) {
    cudaGetLastError();
    op.Fail(absl::InternalError("cudaMemcpyAsync of the aux loss failed"));
  }
  return op.Synchronize() ? aux : std::numeric_limits<float>::quiet_NaN();
}

void AttentionBackward(float* dqkv, const float* dout, const float* qkv, const float* att, int B,
                       int T, int C, int NH) {
  CudaOp op(op_names::kAttentionBackward, {dqkv, dout, qkv, att});
  cublasHandle_t handle = op.cublas();
  void* ws = op.Scratch(kc::AttentionBackwardWorkspaceBytes(B, T, C, NH));
  if (op.ok()) kc::AttentionBackward(dqkv, dout, qkv, att, B, T, C, NH, ws, handle, op.stream());
}

void AttentionForwardRowStats(float* out, float* stats, const float* qkv, int B, int T, int C,
                              int NH) {
  CudaOp op(op_names::kAttentionForwardRowStats, {out, stats, qkv});
  cublasHandle_t handle = op.cublas();
  void* ws = op.Scratch(kc::AttentionForwardRowStatsWorkspaceBytes(B, T, C, NH));
  if (op.ok()) {
    kc::AttentionForwardRowStats(out, stats, qkv, B, T, C, NH, ws, handle, op.stream());
  }
}

void AttentionBackwardRowStats(float* dqkv, const float* dout, const float* qkv, const float* stats,
                               int B, int T, int C, int NH) {
  CudaOp op(op_names::kAttentionBackwardRowStats, {dqkv, dout, qkv, stats});
  cublasHandle_t handle = op.cublas();
  void* ws = op.Scratch(kc::AttentionBackwardRowStatsWorkspaceBytes(B, T, C, NH));
  if (op.ok()) {
    kc::AttentionBackwardRowStats(dqkv, dout, qkv, stats, B, T, C, NH, ws, handle, op.stream());
  }
}

void EmbeddingBackward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B,
                       int T, int C) {
  CudaOp op(op_names::kEmbeddingBackward, {dwte, dwpe, dout, tokens});
  if (!op.ok() || int64_t{B} * T * C == 0) return;
  void* ws = op.Scratch(kc::EmbeddingBackwardWorkspaceBytes(B, T));
  if (op.ok()) kc::EmbeddingBackward(dwte, dwpe, dout, tokens, B, T, C, ws, op.stream());
}

double SumOfSquares(const float* x, int64_t n) {
  const int64_t begin = 0;
  return SumOfSquaresRanges(x, &begin, &n, 1);
}

double SumOfSquaresRanges(const float* x, const int64_t* begin, const int64_t* count, int ranges) {
  CudaOp op("sum_of_squares", {x});
  auto* d_sum = static_cast<double*>(
      op.Scratch(sizeof(double) * (1 + static_cast<size_t>(kc::kSumOfSquaresPartials))));
  if (!op.ok()) return std::numeric_limits<double>::quiet_NaN();
  // Each range's partials into the scratch, then added to the sum in order, on the stream: one
  // copy back and one synchronisation for all of them.
  for (int r = 0; r < ranges; ++r) {
    kc::SumOfSquares(d_sum, d_sum + 1, x + begin[r], count[r], /*accumulate=*/r > 0, op.stream());
  }
  if (ranges == 0 && cudaMemsetAsync(d_sum, 0, sizeof(double), op.stream()) != cudaSuccess) {
    cudaGetLastError();
    op.Fail(absl::InternalError("cudaMemsetAsync of the sum of squares failed"));
  }
  double sum = std::numeric_limits<double>::quiet_NaN();
  if (cudaMemcpyAsync(&sum, d_sum, sizeof(double), cudaMemcpyDeviceToHost, op.stream()) !=
      cudaSuccess) {
    cudaGetLastError();
    op.Fail(absl::InternalError("cudaMemcpyAsync of the sum of squares failed"));
  }
  return op.Synchronize() ? sum : std::numeric_limits<double>::quiet_NaN();
}

}  // namespace cuda_internal

namespace {

namespace k = kernels::cpu;
namespace kc = kernels::cuda;
using cuda_internal::Cublased;
using cuda_internal::Streamed;

namespace op = op_names;

constexpr Backend kCudaBackend = {
    .name = "cuda",
    .precision = Precision::kFp32,
    .matmul_forward =
        &Cublased<op::kMatmulForward, &k::MatmulForward<float>, &kc::MatmulForward>::Run,
    .matmul_backward =
        &Cublased<op::kMatmulBackward, &k::MatmulBackward<float>, &kc::MatmulBackward>::Run,
    .grouped_matmul_forward = &Cublased<op::kGroupedMatmulForward, &k::GroupedMatmulForward<float>,
                                        &kc::GroupedMatmulForward>::Run,
    .grouped_matmul_backward =
        &Cublased<op::kGroupedMatmulBackward, &k::GroupedMatmulBackward<float>,
                  &kc::GroupedMatmulBackward>::Run,
    .attention_forward =
        &Cublased<op::kAttentionForward, &k::AttentionForward<float>, &kc::AttentionForward>::Run,
    .attention_backward = &cuda_internal::AttentionBackward,
    .attention_forward_row_stats = &cuda_internal::AttentionForwardRowStats,
    .attention_backward_row_stats = &cuda_internal::AttentionBackwardRowStats,
    .attention_probs =
        &Cublased<op::kAttentionProbs, &k::AttentionProbs<float>, &kc::AttentionProbs>::Run,
    .layernorm_forward =
        &Streamed<op::kLayernormForward, &k::LayerNormForward<float>, &kc::LayerNormForward>::Run,
    .layernorm_backward = &Streamed<op::kLayernormBackward, &k::LayerNormBackward<float>,
                                    &kc::LayerNormBackward>::Run,
    .gelu_forward = &Streamed<op::kGeluForward, &k::GeluForward<float>, &kc::GeluForward>::Run,
    .gelu_backward = &Streamed<op::kGeluBackward, &k::GeluBackward<float>, &kc::GeluBackward>::Run,
    .add_inplace = &Streamed<op::kAddInPlace, &k::AddInPlace<float>, &kc::AddInPlace>::Run,
    .bias_residual = &Streamed<op::kBiasResidual, &k::BiasResidual<float>, &kc::BiasResidual>::Run,
    .add_row = &cuda_internal::AddRow,
    .transpose = &Streamed<op::kTranspose, &k::Transpose<float>, &kc::Transpose>::Run,
    .embedding_forward =
        &Streamed<op::kEmbeddingForward, &k::EmbeddingForward<float>, &kc::EmbeddingForward>::Run,
    .embedding_backward = &cuda_internal::EmbeddingBackward,
    .cross_entropy_forward = &Streamed<op::kCrossEntropyForward, &k::CrossEntropyForward<float>,
                                       &kc::CrossEntropyForward>::Run,
    .cross_entropy_backward = &Streamed<op::kCrossEntropyBackward, &k::CrossEntropyBackward<float>,
                                        &kc::CrossEntropyBackward>::Run,
    .softmax_forward =
        &Streamed<op::kSoftmaxForward, &k::SoftmaxForward<float>, &kc::SoftmaxForward>::Run,
    .softmax_backward =
        &Streamed<op::kSoftmaxBackward, &k::SoftmaxBackward<float>, &kc::SoftmaxBackward>::Run,
    .topk_forward = &Streamed<op::kTopkForward, &k::TopKForward<float>, &kc::TopKForward>::Run,
    .topk_backward = &Streamed<op::kTopkBackward, &k::TopKBackward<float>, &kc::TopKBackward>::Run,
    .aux_loss_forward = &cuda_internal::AuxLossForward,
    .aux_loss_backward =
        &Streamed<op::kAuxLossBackward, &k::AuxLossBackward<float>, &kc::AuxLossBackward>::Run,
    .make_dispatch_plan = &k::MakeDispatchPlan,  // host: built from host routing indices
    .make_dispatch_plan_slice = &k::MakeDispatchPlanSlice,
    .permute_forward = &cuda_internal::PermuteForward,
    .permute_backward = &cuda_internal::PermuteBackward,
    .unpermute_forward = &cuda_internal::UnpermuteForward,
    .unpermute_backward = &cuda_internal::UnpermuteBackward,
    .adamw_update = &Streamed<op::kAdamwUpdate, &k::AdamWUpdate, &kc::AdamWUpdate>::Run,
    .sum_of_squares = &cuda_internal::SumOfSquares,
    .sum_of_squares_ranges = &cuda_internal::SumOfSquaresRanges,
    .scale = &Streamed<op::kScale, &k::Scale, &kc::Scale>::Run,
    .cast_f32_to_bf16 = &Streamed<op::kCastF32ToBf16, &k::CastF32ToBf16, &kc::CastF32ToBf16>::Run,
    .cast_bf16_to_f32 = &Streamed<op::kCastBf16ToF32, &k::CastBf16ToF32, &kc::CastBf16ToF32>::Run,
    .quantize_fp8_e4m3 =
        &Streamed<op::kQuantizeFp8, &k::QuantizeFp8E4M3, &kc::QuantizeFp8E4M3>::Run,
    .dequantize_fp8_e4m3 =
        &Streamed<op::kDequantizeFp8, &k::DequantizeFp8E4M3, &kc::DequantizeFp8E4M3>::Run,
};

}  // namespace

const Backend& CudaBackend() { return kCudaBackend; }

absl::Status LoadCudaKernels(const Device& device) {
  const auto* cuda = dynamic_cast<const CudaDevice*>(&device);
  if (cuda == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("device '", device.name(), "' is not a CUDA device"));
  }
  int previous = -1;
  if (cudaGetDevice(&previous) != cudaSuccess) previous = -1;
  cudaGetLastError();
  if (previous != cuda->ordinal()) {
    FURNACE_CUDA_RETURN_IF_ERROR(cudaSetDevice(cuda->ordinal()));
  }
  absl::Status loaded = cuda_internal::LoadKernelsOnce(cuda->ordinal());
  if (previous >= 0 && previous != cuda->ordinal()) {
    cudaSetDevice(previous);
    cudaGetLastError();
  }
  if (!loaded.ok()) {
    return absl::Status(loaded.code(),
                        absl::StrCat("device '", device.name(), "': ", loaded.message()));
  }
  return absl::OkStatus();
}

}  // namespace furnace::device
