#include "runtime/model/config.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "runtime/base/decimal.h"

namespace furnace::model {
namespace {

absl::Status Bad(const std::string& field, double value, const std::string& allowed) {
  return absl::InvalidArgumentError(
      absl::StrCat("model config: ", field, " = ", value, " is invalid: ", allowed));
}

}  // namespace

absl::Status ModelConfig::Validate() const {
  if (vocab < 1) return Bad("vocab", vocab, "must be >= 1");
  if (seq_len < 1) return Bad("seq_len", seq_len, "must be >= 1");
  if (d_model < 1) return Bad("d_model", d_model, "must be >= 1");
  if (heads < 1) return Bad("heads", heads, "must be >= 1");
  if (d_model % heads != 0) {
    return Bad("heads", heads, absl::StrCat("must divide d_model (", d_model, ")"));
  }
  if (layers < 1) return Bad("layers", layers, "must be >= 1");
  if (moe_every < 1) return Bad("moe_every", moe_every, "must be >= 1");
  if (dense_ffn < 0) return Bad("dense_ffn", dense_ffn, "must be >= 0 (0 = 4 * d_model)");
  if (capacity_factor < 0)
    return Bad("capacity_factor", capacity_factor, "must be >= 0 (0 = dropless)");
  if (aux_alpha < 0) return Bad("aux_alpha", aux_alpha, "must be >= 0");
  if (num_moe_layers() > 0) {
    if (experts < 1) return Bad("experts", experts, "must be >= 1 when the model has MoE layers");
    if (top_k < 1 || top_k > experts) {
      return Bad("top_k", top_k, absl::StrCat("must be in [1, experts = ", experts, "]"));
    }
    if (expert_ffn < 1) return Bad("expert_ffn", expert_ffn, "must be >= 1");
  }
  return spikes.Validate(num_moe_layers() > 0 ? experts : 0, top_k);
}

std::map<std::string, std::string> ModelConfig::RecordedSettings() const {
  return {
      {"model.heads", absl::StrCat(heads)},
      {"moe.top_k", absl::StrCat(top_k)},
      {"moe.capacity_factor", ShortestDecimal(capacity_factor)},
      {"moe.normalize_topk", normalize_topk ? "true" : "false"},
      {"moe.aux_alpha", ShortestDecimal(aux_alpha)},
  };
}

}  // namespace furnace::model
