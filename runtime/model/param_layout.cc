#include "runtime/model/param_layout.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"

namespace furnace::model {
namespace {

using Ranges = std::vector<std::pair<int64_t, int64_t>>;

class Builder {
 public:
  explicit Builder(ParamLayout& layout) : layout_(layout) {}

  // A parameter held whole (replicated wherever it is held).
  int64_t Whole(std::string name, std::vector<int64_t> shape, bool owner,
                train::GradSync sync = train::GradSync::kData) {
    return Add(std::move(name), std::move(shape), {}, owner, sync);
  }

  // A parameter of `global` shape of which this rank holds `ranges` along `dim`.
  int64_t Split(std::string name, std::vector<int64_t> global, int dim, Ranges ranges, bool owner,
                train::GradSync sync = train::GradSync::kData) {
    std::vector<int64_t> local = global;
    int64_t held = 0;
    for (const auto& [b, e] : ranges) held += e - b;
    local[dim] = held;
    train::ParamShard shard;
    if (held != global[dim]) shard = {std::move(global), dim, std::move(ranges)};
    return Add(std::move(name), std::move(local), std::move(shard), owner, sync);
  }

 private:
  int64_t Add(std::string name, std::vector<int64_t> shape, train::ParamShard shard, bool owner,
              train::GradSync sync) {
    train::ParamInfo p;
    p.name = std::move(name);
    p.shape = std::move(shape);
    p.offset = layout_.total;
    p.weight_decay = (shard.sharded() ? shard.global_shape.size() : p.shape.size()) == 2;
    p.shard = std::move(shard);
    p.sync = sync;
    p.norm_owner = owner;
    layout_.total += p.numel();
    layout_.params.push_back(std::move(p));
    return layout_.params.back().offset;
  }

  ParamLayout& layout_;
};

// Block `r` of `n` equal blocks of [base, base + width).
Ranges Block(int64_t base, int64_t width, int r, int n) {
  const int64_t w = width / n;
  return {{base + r * w, base + (r + 1) * w}};
}

}  // namespace

ParamLayout BuildParamLayout(const ModelConfig& c, const ModelShard& s) {
  ParamLayout layout;
  Builder b(layout);
  const int64_t V = c.vocab, T = c.seq_len, d = c.d_model;
  // Replicas are counted in the norm by one rank only: data-parallel rank 0, and tensor-parallel
  // rank 0 for what tensor parallelism does not split. Experts: expert-data-parallel rank 0.
  const bool dense_owner = s.dp_rank == 0;
  const bool replicated_owner = dense_owner && s.tp_rank == 0;
  const auto kExpert = train::GradSync::kExpertData;

  if (s.first_stage() || s.last_stage()) {
    // The tied wte: the first stage's copy is the one counted.
    layout.wte = b.Whole("wte", {V, d}, replicated_owner && s.first_stage());
  }
  if (s.first_stage()) layout.wpe = b.Whole("wpe", {T, d}, replicated_owner);
  const int tp = s.tp, r = s.tp_rank;
  for (int l = 0; l < c.layers; ++l) {
    LayerOffsets o;
    o.moe = c.IsMoeLayer(l);
    o.held = s.HoldsLayer(c, l);
    if (!o.held) {
      layout.layers.push_back(o);
      continue;
    }
    const std::string p = absl::StrCat("layers.", l, ".");
    o.ln1_w = b.Whole(p + "ln1.weight", {d}, replicated_owner);
    o.ln1_b = b.Whole(p + "ln1.bias", {d}, replicated_owner);
    // Column-parallel qkv: this rank's heads of q, of k and of v.
    Ranges qkv;
    for (int part = 0; part < 3; ++part) qkv.push_back(Block(part * d, d, r, tp)[0]);
    o.wqkv = b.Split(p + "attn.wqkv", {d, 3 * d}, 1, qkv, dense_owner);
    o.bqkv = b.Split(p + "attn.bqkv", {3 * d}, 0, qkv, dense_owner);
    o.wo = b.Split(p + "attn.wo", {d, d}, 0, Block(0, d, r, tp), dense_owner);  // row-parallel
    o.bo = b.Whole(p + "attn.bo", {d}, replicated_owner);
    o.ln2_w = b.Whole(p + "ln2.weight", {d}, replicated_owner);
    o.ln2_b = b.Whole(p + "ln2.bias", {d}, replicated_owner);
    if (o.moe) {
      const int64_t E = c.experts, f = c.expert_ffn;
      o.router = b.Whole(p + "moe.router", {d, E}, replicated_owner);
      const std::string ex = p + "moe.experts.";
      const int e0 = s.first_expert(c), ne = s.local_experts(c);
      const Ranges hidden = Block(0, f, s.esp_rank, s.esp);
      const bool owner = s.edp_rank == 0;
      for (int e = e0; e < e0 + ne; ++e) {
        const int64_t at = b.Split(absl::StrCat(ex, e, ".w1"), {d, f}, 1, hidden, owner, kExpert);
        if (e == e0) o.w1 = at;
      }
      for (int e = e0; e < e0 + ne; ++e) {
        const int64_t at = b.Split(absl::StrCat(ex, e, ".b1"), {f}, 0, hidden, owner, kExpert);
        if (e == e0) o.b1 = at;
      }
      for (int e = e0; e < e0 + ne; ++e) {
        const int64_t at = b.Split(absl::StrCat(ex, e, ".w2"), {f, d}, 0, hidden, owner, kExpert);
        if (e == e0) o.w2 = at;
      }
      for (int e = e0; e < e0 + ne; ++e) {
        const int64_t at =
            b.Whole(absl::StrCat(ex, e, ".b2"), {d}, owner && s.esp_rank == 0, kExpert);
        if (e == e0) o.b2 = at;
      }
    } else {
      const int64_t F = c.dense_width();
      const Ranges cols = Block(0, F, r, tp);
      o.w1 = b.Split(p + "mlp.w1", {d, F}, 1, cols, dense_owner);
      o.b1 = b.Split(p + "mlp.b1", {F}, 0, cols, dense_owner);
      o.w2 = b.Split(p + "mlp.w2", {F, d}, 0, cols, dense_owner);
      o.b2 = b.Whole(p + "mlp.b2", {d}, replicated_owner);
    }
    layout.layers.push_back(o);
  }
  if (s.last_stage()) {
    layout.lnf_w = b.Whole("lnf.weight", {d}, replicated_owner);
    layout.lnf_b = b.Whole("lnf.bias", {d}, replicated_owner);
  }
  return layout;
}

}  // namespace furnace::model
