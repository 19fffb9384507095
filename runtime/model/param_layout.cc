#include "runtime/model/param_layout.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"

namespace furnace::model {
namespace {

class Builder {
 public:
  explicit Builder(ParamLayout& layout) : layout_(layout) {}
  int64_t Add(std::string name, std::vector<int64_t> shape) {
    train::ParamInfo p;
    p.name = std::move(name);
    p.shape = std::move(shape);
    p.offset = layout_.total;
    p.weight_decay = p.shape.size() == 2;
    layout_.total += p.numel();
    layout_.params.push_back(std::move(p));
    return layout_.params.back().offset;
  }

 private:
  ParamLayout& layout_;
};

}  // namespace

ParamLayout BuildParamLayout(const ModelConfig& c) {
  ParamLayout layout;
  Builder b(layout);
  const int64_t V = c.vocab, T = c.seq_len, d = c.d_model;
  layout.wte = b.Add("wte", {V, d});
  layout.wpe = b.Add("wpe", {T, d});
  for (int l = 0; l < c.layers; ++l) {
    const std::string p = absl::StrCat("layers.", l, ".");
    LayerOffsets o;
    o.moe = c.IsMoeLayer(l);
    o.ln1_w = b.Add(p + "ln1.weight", {d});
    o.ln1_b = b.Add(p + "ln1.bias", {d});
    o.wqkv = b.Add(p + "attn.wqkv", {d, 3 * d});
    o.bqkv = b.Add(p + "attn.bqkv", {3 * d});
    o.wo = b.Add(p + "attn.wo", {d, d});
    o.bo = b.Add(p + "attn.bo", {d});
    o.ln2_w = b.Add(p + "ln2.weight", {d});
    o.ln2_b = b.Add(p + "ln2.bias", {d});
    if (o.moe) {
      const int64_t E = c.experts, f = c.expert_ffn;
      o.router = b.Add(p + "moe.router", {d, E});
      const std::string ex = p + "moe.experts.";
      for (int e = 0; e < E; ++e) {
        const int64_t at = b.Add(absl::StrCat(ex, e, ".w1"), {d, f});
        if (e == 0) o.w1 = at;
      }
      for (int e = 0; e < E; ++e) {
        const int64_t at = b.Add(absl::StrCat(ex, e, ".b1"), {f});
        if (e == 0) o.b1 = at;
      }
      for (int e = 0; e < E; ++e) {
        const int64_t at = b.Add(absl::StrCat(ex, e, ".w2"), {f, d});
        if (e == 0) o.w2 = at;
      }
      for (int e = 0; e < E; ++e) {
        const int64_t at = b.Add(absl::StrCat(ex, e, ".b2"), {d});
        if (e == 0) o.b2 = at;
      }
    } else {
      const int64_t F = c.dense_width();
      o.w1 = b.Add(p + "mlp.w1", {d, F});
      o.b1 = b.Add(p + "mlp.b1", {F});
      o.w2 = b.Add(p + "mlp.w2", {F, d});
      o.b2 = b.Add(p + "mlp.b2", {d});
    }
    layout.layers.push_back(o);
  }
  layout.lnf_w = b.Add("lnf.weight", {d});
  layout.lnf_b = b.Add("lnf.bias", {d});
  return layout;
}

}  // namespace furnace::model
