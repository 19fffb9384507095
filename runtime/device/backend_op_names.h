// The backend tables' op names, shared by the CUDA (cuda_backend.cc) and emulated
// (emulated_backend.cc) tables, which name an op in the errors they report. Objects with static
// storage, so they can be template arguments of the adapters that open an op.
#pragma once

namespace furnace::device::op_names {

inline constexpr char kAdamwUpdate[] = "adamw_update";
inline constexpr char kAddInPlace[] = "add_inplace";
inline constexpr char kAttentionBackward[] = "attention_backward";
inline constexpr char kAttentionBackwardBf16[] = "attention_backward (bf16)";
inline constexpr char kAttentionForward[] = "attention_forward";
inline constexpr char kAttentionForwardBf16[] = "attention_forward (bf16)";
inline constexpr char kAttentionBackwardRowStats[] = "attention_backward_row_stats";
inline constexpr char kAttentionBackwardRowStatsBf16[] = "attention_backward_row_stats (bf16)";
inline constexpr char kAttentionForwardRowStats[] = "attention_forward_row_stats";
inline constexpr char kAttentionForwardRowStatsBf16[] = "attention_forward_row_stats (bf16)";
inline constexpr char kAttentionProbs[] = "attention_probs";
inline constexpr char kAttentionProbsBf16[] = "attention_probs (bf16)";
inline constexpr char kAuxLossBackward[] = "aux_loss_backward";
inline constexpr char kBiasResidual[] = "bias_residual";
inline constexpr char kCastBf16ToF32[] = "cast_bf16_to_f32";
inline constexpr char kCastF32ToBf16[] = "cast_f32_to_bf16";
inline constexpr char kCrossEntropyBackward[] = "cross_entropy_backward";
inline constexpr char kCrossEntropyForward[] = "cross_entropy_forward";
inline constexpr char kDequantizeFp8[] = "dequantize_fp8_e4m3";
inline constexpr char kEmbeddingBackward[] = "embedding_backward";
inline constexpr char kEmbeddingForward[] = "embedding_forward";
inline constexpr char kGeluBackward[] = "gelu_backward";
inline constexpr char kGeluForward[] = "gelu_forward";
inline constexpr char kGroupedMatmulBackward[] = "grouped_matmul_backward";
inline constexpr char kGroupedMatmulForward[] = "grouped_matmul_forward";
inline constexpr char kLayernormBackward[] = "layernorm_backward";
inline constexpr char kLayernormForward[] = "layernorm_forward";
inline constexpr char kMatmulBackward[] = "matmul_backward";
inline constexpr char kMatmulForward[] = "matmul_forward";
inline constexpr char kPermuteBackward[] = "permute_backward";
inline constexpr char kPermuteForward[] = "permute_forward";
inline constexpr char kQuantizeFp8[] = "quantize_fp8_e4m3";
inline constexpr char kScale[] = "scale";
inline constexpr char kSoftmaxBackward[] = "softmax_backward";
inline constexpr char kSoftmaxForward[] = "softmax_forward";
inline constexpr char kTopkBackward[] = "topk_backward";
inline constexpr char kTopkForward[] = "topk_forward";
inline constexpr char kTranspose[] = "transpose";
inline constexpr char kUnpermuteBackward[] = "unpermute_backward";
inline constexpr char kUnpermuteForward[] = "unpermute_forward";

}  // namespace furnace::device::op_names
