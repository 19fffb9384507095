#include "runtime/model/gpt_moe.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "runtime/base/status.h"
#include "runtime/model/attention_block.h"
#include "runtime/model/embedding.h"
#include "runtime/model/head.h"
#include "runtime/model/init.h"
#include "runtime/model/mlp_block.h"
#include "runtime/model/moe_block.h"

namespace furnace::model {

struct LayerState {
  AttentionSaved attn;
  bool moe = false;
  MlpSaved mlp;
  MoeSaved moe_saved;
  StashHandle out() const { return moe ? moe_saved.out : mlp.out; }
};

struct ForwardState {
  EmbeddingSaved embedding;
  std::vector<LayerState> layers;
  HeadSaved head;
};

namespace {

// Releases every stashed tensor when a ForwardBackward / Evaluate leaves, whatever the path.
class StashGuard {
 public:
  explicit StashGuard(Stash& stash) : stash_(stash) {}
  ~StashGuard() { stash_.ReleaseAll(); }

 private:
  Stash& stash_;
};

MoeShape ShapeOf(const ModelConfig& c) {
  return {c.experts, c.top_k, c.expert_ffn, c.capacity_factor, c.normalize_topk, c.aux_alpha};
}

}  // namespace

GptMoe::GptMoe(const ModelConfig& config, device::Device& device, tensor::DeviceArena& activations)
    : config_(config),
      layout_(BuildParamLayout(config)),
      device_(device),
      arena_(activations),
      stash_(device.kind()),
      params_(layout_.total),
      grads_(layout_.total, 0.0f) {}

GptMoe::~GptMoe() { stash_.ReleaseAll(); }

absl::StatusOr<std::unique_ptr<GptMoe>> GptMoe::Create(const ModelConfig& config, uint64_t seed,
                                                       device::Device& device,
                                                       tensor::DeviceArena& activations) {
  RETURN_IF_ERROR(config.Validate());
  if (device.kind() != device::Kind::kCpu) {
    return absl::UnimplementedError(
        absl::StrCat("GptMoe runs the CPU kernels; device '", device.name(), "' is not a CPU"));
  }
  if (&activations.device() != &device) {
    return absl::InvalidArgumentError("GptMoe: the activation arena belongs to another device");
  }
  std::unique_ptr<GptMoe> model(new GptMoe(config, device, activations));
  for (const train::ParamInfo& p : model->layout_.params) {
    InitParameterRange(seed, p, config.layers, 0, p.numel(), model->params_.data() + p.offset);
  }
  return model;
}

void GptMoe::ZeroGrad() { std::fill(grads_.begin(), grads_.end(), 0.0f); }

const train::ParamInfo* GptMoe::FindParam(const std::string& name) const {
  for (const train::ParamInfo& p : layout_.params) {
    if (p.name == name) return &p;
  }
  return nullptr;
}

absl::Status GptMoe::CheckInputs(const int32_t* inputs, const int32_t* targets, int B) const {
  if (B < 1) return absl::InvalidArgumentError(absl::StrCat("micro-batch size B = ", B, " < 1"));
  const int64_t n = int64_t{B} * config_.seq_len;
  for (int64_t i = 0; i < n; ++i) {
    if (inputs[i] < 0 || inputs[i] >= config_.vocab) {
      return absl::InvalidArgumentError(absl::StrCat("input token ", i, " = ", inputs[i],
                                                     " is outside [0, ", config_.vocab, ")"));
    }
    if (targets[i] < 0 || targets[i] >= config_.vocab) {
      return absl::InvalidArgumentError(absl::StrCat("target token ", i, " = ", targets[i],
                                                     " is outside [0, ", config_.vocab, ")"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<ForwardState> GptMoe::Forward(const int32_t* inputs, const int32_t* targets, int B) {
  const Dims dims{B, config_.seq_len, config_.d_model, config_.heads};
  const MoeShape moe = ShapeOf(config_);
  ModuleContext ctx{arena_, stash_};
  const float* p = params_.data();
  ForwardState st;
  last_rows_.clear();

  ASSIGN_OR_RETURN(st.embedding,
                   EmbeddingForward(ctx, dims, inputs, p + layout_.wte, p + layout_.wpe));
  StashHandle x = st.embedding.out;
  for (int l = 0; l < config_.layers; ++l) {
    const LayerOffsets& off = layout_.layers[l];
    LayerState ls;
    ls.moe = off.moe;
    ASSIGN_OR_RETURN(ls.attn, AttentionBlockForward(ctx, dims, l, off, p, x));
    if (off.moe) {
      ASSIGN_OR_RETURN(ls.moe_saved, MoeBlockForward(ctx, dims, moe, l, off, p, ls.attn.out));
      last_rows_.push_back(ls.moe_saved.rows);
    } else {
      ASSIGN_OR_RETURN(ls.mlp,
                       MlpBlockForward(ctx, dims, config_.dense_width(), l, off, p, ls.attn.out));
    }
    x = ls.out();
    st.layers.push_back(std::move(ls));
  }
  ASSIGN_OR_RETURN(st.head, HeadForward(ctx, dims, config_.vocab, p + layout_.wte,
                                        p + layout_.lnf_w, p + layout_.lnf_b, x, targets,
                                        capture_logits_ ? &last_logits_ : nullptr));
  last_stashed_bytes_ = stash_.stashed_bytes();
  return st;
}

absl::Status GptMoe::Backward(const ForwardState& st, int B, double ce_scale, double aux_scale) {
  const Dims dims{B, config_.seq_len, config_.d_model, config_.heads};
  const MoeShape moe = ShapeOf(config_);
  ModuleContext ctx{arena_, stash_};
  const float* p = params_.data();
  float* g = grads_.data();

  // d loss / d residual stream, carried down the layers and accumulated in place.
  ASSIGN_OR_RETURN(tensor::Buffer dres_buf,
                   AllocF32(ctx, int64_t{dims.N()} * dims.C, "residual.grad", true));  // (B,T,C)
  float* dres = dres_buf.as<float>();
  const StashHandle top = st.layers.empty() ? st.embedding.out : st.layers.back().out();
  RETURN_IF_ERROR(HeadBackward(ctx, dims, config_.vocab, p + layout_.wte, p + layout_.lnf_w,
                               g + layout_.wte, g + layout_.lnf_w, g + layout_.lnf_b, st.head, top,
                               ce_scale, dres));
  for (int l = config_.layers - 1; l >= 0; --l) {
    const LayerOffsets& off = layout_.layers[l];
    const LayerState& ls = st.layers[l];
    const StashHandle x_in = l == 0 ? st.embedding.out : st.layers[l - 1].out();
    if (ls.moe) {
      RETURN_IF_ERROR(
          MoeBlockBackward(ctx, dims, moe, off, p, g, ls.moe_saved, ls.attn.out, aux_scale, dres));
    } else {
      RETURN_IF_ERROR(
          MlpBlockBackward(ctx, dims, config_.dense_width(), off, p, g, ls.mlp, ls.attn.out, dres));
    }
    RETURN_IF_ERROR(AttentionBlockBackward(ctx, dims, off, p, g, ls.attn, x_in, dres));
  }
  return EmbeddingBackward(ctx, dims, st.embedding, dres, g + layout_.wte, g + layout_.wpe);
}

train::MicroBatchResult GptMoe::Summarize(const ForwardState& st, int B) const {
  train::MicroBatchResult r;
  r.loss = st.head.ce_sum / (static_cast<double>(B) * config_.seq_len);
  for (const LayerState& ls : st.layers) {
    if (!ls.moe) continue;
    r.aux_loss += ls.moe_saved.aux;
    r.tokens_per_expert.push_back(ls.moe_saved.routed);
    r.dropped += ls.moe_saved.dropped;
  }
  return r;
}

absl::StatusOr<train::MicroBatchResult> GptMoe::ForwardBackward(const int32_t* inputs,
                                                                const int32_t* targets, int B,
                                                                double ce_scale, double aux_scale) {
  RETURN_IF_ERROR(CheckInputs(inputs, targets, B));
  StashGuard guard(stash_);
  arena_.ResetPeak();
  ASSIGN_OR_RETURN(ForwardState st, Forward(inputs, targets, B));
  RETURN_IF_ERROR(Backward(st, B, ce_scale, aux_scale));
  train::MicroBatchResult r = Summarize(st, B);
  r.activation_peak_bytes = static_cast<int64_t>(arena_.peak_bytes());
  return r;
}

absl::StatusOr<train::MicroBatchResult> GptMoe::Evaluate(const int32_t* inputs,
                                                         const int32_t* targets, int B) {
  RETURN_IF_ERROR(CheckInputs(inputs, targets, B));
  StashGuard guard(stash_);
  arena_.ResetPeak();
  ASSIGN_OR_RETURN(ForwardState st, Forward(inputs, targets, B));
  train::MicroBatchResult r = Summarize(st, B);
  r.activation_peak_bytes = static_cast<int64_t>(arena_.peak_bytes());
  return r;
}

int64_t GptMoe::ActivationBytesForRouting(int B,
                                          const std::vector<int64_t>& rows_per_moe_layer) const {
  const Dims dims{B, config_.seq_len, config_.d_model, config_.heads};
  const MoeShape moe = ShapeOf(config_);
  const int F = config_.dense_width();
  struct Module {
    int64_t saved, forward_peak, backward_peak;
  };
  std::vector<Module> modules;  // forward order
  modules.push_back({EmbeddingSavedBytes(dims), EmbeddingForwardPeakBytes(dims),
                     EmbeddingBackwardPeakBytes(dims)});
  size_t moe_index = 0;
  for (int l = 0; l < config_.layers; ++l) {
    modules.push_back({AttentionSavedBytes(dims), AttentionForwardPeakBytes(dims),
                       AttentionBackwardPeakBytes(dims)});
    if (config_.IsMoeLayer(l)) {
      const int64_t S = moe_index < rows_per_moe_layer.size() ? rows_per_moe_layer[moe_index]
                                                              : int64_t{dims.N()} * moe.k;
      ++moe_index;
      modules.push_back({MoeSavedBytes(dims, moe, S), MoeForwardPeakBytes(dims, moe, S),
                         MoeBackwardPeakBytes(dims, moe, S)});
    } else {
      modules.push_back(
          {MlpSavedBytes(dims, F), MlpForwardPeakBytes(dims, F), MlpBackwardPeakBytes(dims, F)});
    }
  }
  modules.push_back({HeadSavedBytes(dims, config_.vocab), HeadForwardPeakBytes(dims, config_.vocab),
                     HeadBackwardPeakBytes(dims, config_.vocab)});

  int64_t live = 0, peak = 0;
  for (const Module& m : modules) {
    peak = std::max(peak, live + m.forward_peak);
    live += m.saved;
  }
  const int64_t dres = F32Bytes(int64_t{dims.N()} * dims.C);
  for (auto it = modules.rbegin(); it != modules.rend(); ++it) {
    peak = std::max(peak, live + dres + it->backward_peak);
    live -= it->saved;  // a module releases its saved tensors at the end of its backward
  }
  return peak;
}

int64_t GptMoe::ActivationBytes(int B) const {
  const int64_t dropless_rows = int64_t{B} * config_.seq_len * config_.top_k;
  return ActivationBytesForRouting(B,
                                   std::vector<int64_t>(config_.num_moe_layers(), dropless_rows));
}

double GptMoe::FlopsPerToken() const {
  const ModelConfig& c = config_;
  const int64_t d = c.d_model;
  int64_t active = layout_.total - int64_t{c.seq_len} * d;  // wpe left out; tied wte once
  const int64_t per_expert = 2 * d * c.expert_ffn + c.expert_ffn + d;
  active -= int64_t{c.num_moe_layers()} * (c.experts - c.top_k) * per_expert;
  return 6.0 * static_cast<double>(active) + 12.0 * c.layers * c.seq_len * d;
}

}  // namespace furnace::model
