// Sections describing the model and how it is laid out: model, parallel, moe, memory.
#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "controller/spec/scalars.h"
#include "controller/spec/sections.h"

namespace furnace::spec {
namespace {

constexpr char kDefaultOrder[] = "tp-dp-pp";

uint32_t U32(std::optional<uint64_t> v, uint32_t fallback) {
  return v ? static_cast<uint32_t>(*v) : fallback;
}

// True if `order` is tp, dp and pp, each once, joined by '-'.
bool IsAxisPermutation(const std::string& order) {
  std::vector<std::string> parts = absl::StrSplit(order, '-');
  if (parts.size() != 3) return false;
  for (const char* axis : {"tp", "dp", "pp"}) {
    int n = 0;
    for (const std::string& p : parts) n += p == axis;
    if (n != 1) return false;
  }
  return true;
}

}  // namespace

void ReadModel(MapReader& s, furnace::v1::ModelSpec* out) {
  out->set_vocab(U32(s.Integer("vocab", 1, kMaxVocab), 256));
  out->set_seq_len(U32(s.Integer("seq_len", 1, kMaxSeqLen), 64));
  out->set_d_model(U32(s.Integer("d_model", 1, kMaxDModel), 64));
  out->set_heads(U32(s.Integer("heads", 1, kMaxLayers), 4));
  out->set_layers(U32(s.Integer("layers", 1, kMaxLayers), 2));
  // 4 * d_model <= kMaxFfn for every d_model allowed.
  const uint32_t four_d = 4 * out->d_model();
  out->set_dense_ffn(U32(s.Integer("dense_ffn", 1, kMaxFfn), four_d));
  out->set_moe_every(U32(s.Integer("moe_every", 1, kMaxLayers), 1));
  out->set_expert_ffn(U32(s.Integer("expert_ffn", 1, kMaxFfn), four_d));
  out->set_precision(s.Enum("precision", {"fp32", "bf16"}).value_or("fp32"));
  out->set_attention_probs(s.Enum("attention_probs", {"stored", "recomputed"}).value_or("stored"));
  s.ReportUnknownKeys();
}

void ReadParallel(MapReader& s, furnace::v1::ParallelSpec* out) {
  out->set_pp(U32(s.Integer("pp", 1, kMaxCount), 1));
  out->set_dp(U32(s.Integer("dp", 1, kMaxCount), 1));
  out->set_tp(U32(s.Integer("tp", 1, kMaxCount), 1));
  out->set_ep(U32(s.Integer("ep", 1, kMaxCount), 1));
  out->set_esp(U32(s.Integer("esp", 1, kMaxCount), 1));
  out->set_micro_batch(U32(s.Integer("micro_batch", 1, kMaxCount), 1));
  out->set_micro_batches(U32(s.Integer("micro_batches", 1, kMaxCount), 1));
  // Fastest-varying axis first (runtime/topology); empty means the default.
  std::string order = s.String("order").value_or("");
  if (order.empty()) {
    order = kDefaultOrder;
  } else if (!IsAxisPermutation(order)) {
    s.Report("order",
             Problem{"must name tp, dp and pp once each, joined by '-' (a permutation of tp, dp, "
                     "pp, the fastest-varying first)",
                     "'" + order + "'",
                     "tp-dp-pp, tp-pp-dp, dp-tp-pp, dp-pp-tp, pp-tp-dp, pp-dp-tp, or empty for "
                     "the default tp-dp-pp"});
    order = kDefaultOrder;
  }
  out->set_order(order);
  s.ReportUnknownKeys();
}

void ReadMoe(MapReader& s, furnace::v1::MoeSpec* out) {
  out->set_experts(U32(s.Integer("experts", 1, kMaxLayers), 8));
  // The upper bound (experts) is a cross-field check.
  out->set_top_k(U32(s.Integer("top_k", 1, kMaxLayers), 2));
  out->set_capacity_factor(s.Number("capacity_factor", AtLeast(0)).value_or(0.0));
  out->set_schedule(s.Enum("schedule", {"deepspeed", "s1", "s2", "auto"}).value_or("deepspeed"));
  out->set_normalize_topk(s.Bool("normalize_topk").value_or(out->top_k() > 1));
  out->set_aux_alpha(s.Number("aux_alpha", AtLeast(0)).value_or(0.01));
  MapReader spikes = s.Section("spikes");
  furnace::v1::SpikeSpec* sp = out->mutable_spikes();
  sp->set_probability(spikes.Number("probability", Between(0, 1)).value_or(0.0));
  sp->set_max_ratio(spikes.Number("max_ratio", AtLeast(1)).value_or(1.0));
  sp->set_seed(spikes.Integer("seed", 0, kMaxU64).value_or(0));
  spikes.ReportUnknownKeys();
  s.ReportUnknownKeys();
}

void ReadMemory(MapReader& s, furnace::v1::MemorySpec* out) {
  out->set_policy(s.Enum("policy", {"none", "full_recompute", "selective", "offload", "adaptive"})
                      .value_or("none"));
  out->set_device_budget(s.Size("device_budget", 0, kMaxU64).value_or(0));
  // 0 would offload nothing: policy none's run under another name.
  out->set_offload_ratio(
      s.Number("offload_ratio", NumberRange{.min = 0, .min_open = true, .max = 1}).value_or(0.5));
  out->set_host_link_gbps(s.Number("host_link_gbps", AtLeast(0)).value_or(0.0));
  out->set_codec(s.Enum("codec", {"none", "bf16", "fp8"}).value_or("none"));
  s.ReportUnknownKeys();
}

}  // namespace furnace::spec
