// The CPU backend: every entry is the kernels::cpu function of the same name (float instances), so
// a model run through this table computes exactly what calling the kernels directly computes.
#include "kernels/attention.h"
#include "kernels/cast.h"
#include "kernels/cross_entropy.h"
#include "kernels/elementwise.h"
#include "kernels/encoder.h"
#include "kernels/gelu.h"
#include "kernels/layernorm.h"
#include "kernels/matmul.h"
#include "kernels/optimizer.h"
#include "kernels/permute.h"
#include "kernels/router.h"
#include "runtime/device/backend.h"

namespace furnace::device {
namespace {

namespace k = kernels::cpu;

constexpr Backend kCpuBackend = {
    .name = "cpu",
    .precision = Precision::kFp32,
    .matmul_forward = &k::MatmulForward<float>,
    .matmul_backward = &k::MatmulBackward<float>,
    .grouped_matmul_forward = &k::GroupedMatmulForward<float>,
    .grouped_matmul_backward = &k::GroupedMatmulBackward<float>,
    .attention_forward = &k::AttentionForward<float>,
    .attention_backward = &k::AttentionBackward<float>,
    .attention_forward_row_stats = &k::AttentionForwardRowStats<float>,
    .attention_backward_row_stats = &k::AttentionBackwardRowStats<float>,
    .attention_probs = &k::AttentionProbs<float>,
    .layernorm_forward = &k::LayerNormForward<float>,
    .layernorm_backward = &k::LayerNormBackward<float>,
    .gelu_forward = &k::GeluForward<float>,
    .gelu_backward = &k::GeluBackward<float>,
    .add_inplace = &k::AddInPlace<float>,
    .bias_residual = &k::BiasResidual<float>,
    .add_row = &k::AddRow<float>,
    .transpose = &k::Transpose<float>,
    .embedding_forward = &k::EmbeddingForward<float>,
    .embedding_backward = &k::EmbeddingBackward<float>,
    .cross_entropy_forward = &k::CrossEntropyForward<float>,
    .cross_entropy_backward = &k::CrossEntropyBackward<float>,
    .softmax_forward = &k::SoftmaxForward<float>,
    .softmax_backward = &k::SoftmaxBackward<float>,
    .topk_forward = &k::TopKForward<float>,
    .topk_backward = &k::TopKBackward<float>,
    .aux_loss_forward = &k::AuxLossForward<float>,
    .aux_loss_backward = &k::AuxLossBackward<float>,
    .make_dispatch_plan = &k::MakeDispatchPlan,
    .make_dispatch_plan_slice = &k::MakeDispatchPlanSlice,
    .permute_forward = &k::PermuteForward<float>,
    .permute_backward = &k::PermuteBackward<float>,
    .unpermute_forward = &k::UnpermuteForward<float>,
    .unpermute_backward = &k::UnpermuteBackward<float>,
    .adamw_update = &k::AdamWUpdate,
    .sum_of_squares = &k::SumOfSquares,
    .sum_of_squares_ranges = &k::SumOfSquaresRanges,
    .scale = &k::Scale,
    .cast_f32_to_bf16 = &k::CastF32ToBf16,
    .cast_bf16_to_f32 = &k::CastBf16ToF32,
    .quantize_fp8_e4m3 = &k::QuantizeFp8E4M3,
    .dequantize_fp8_e4m3 = &k::DequantizeFp8E4M3,
};

}  // namespace

const Backend& CpuBackend() { return kCpuBackend; }

}  // namespace furnace::device
