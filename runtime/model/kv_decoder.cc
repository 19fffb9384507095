#include "runtime/model/kv_decoder.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "runtime/base/status.h"
#include "runtime/trainable/param_info.h"

namespace furnace::model {
namespace {

constexpr double kNormEps = 1e-5;  // MODEL.md: every LayerNorm

// out (n, OC) = in (n, C) @ w (C, OC) [+ b (OC)].
void Linear(const float* in, const float* w, const float* b, int n, int C, int OC, float* out) {
  std::vector<double> acc(OC);
  for (int i = 0; i < n; ++i) {
    std::fill(acc.begin(), acc.end(), 0.0);
    const float* row = in + int64_t{i} * C;
    for (int c = 0; c < C; ++c) {
      const double a = row[c];
      const float* wr = w + int64_t{c} * OC;
      for (int o = 0; o < OC; ++o) acc[o] += a * wr[o];
    }
    float* o_row = out + int64_t{i} * OC;
    for (int o = 0; o < OC; ++o) o_row[o] = static_cast<float>(acc[o] + (b ? b[o] : 0.0f));
  }
}

// out (n, C) = LayerNorm(in) * w + b (MODEL.md: biased variance, eps 1e-5).
void Norm(const float* in, const float* w, const float* b, int n, int C, float* out) {
  for (int i = 0; i < n; ++i) {
    const float* x = in + int64_t{i} * C;
    double mean = 0;
    for (int c = 0; c < C; ++c) mean += x[c];
    mean /= C;
    double var = 0;
    for (int c = 0; c < C; ++c) var += (x[c] - mean) * (x[c] - mean);
    var /= C;
    const double rstd = 1.0 / std::sqrt(var + kNormEps);
    float* y = out + int64_t{i} * C;
    for (int c = 0; c < C; ++c) y[c] = static_cast<float>((x[c] - mean) * rstd * w[c] + b[c]);
  }
}

float Gelu(float x) {
  const double v = x;
  return static_cast<float>(0.5 * v *
                            (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (v + 0.044715 * v * v * v))));
}

// y (n, OC) = GELU(u @ w1 + b1) @ w2 + b2, hidden width F.
void Mlp(const float* u, const float* w1, const float* b1, const float* w2, const float* b2, int n,
         int C, int F, float* y) {
  std::vector<float> h(static_cast<size_t>(n) * F);
  Linear(u, w1, b1, n, C, F, h.data());
  for (float& v : h) v = Gelu(v);
  Linear(h.data(), w2, b2, n, F, C, y);
}

}  // namespace

std::vector<std::pair<std::string, std::vector<int64_t>>> ParameterShapes(const ModelConfig& m) {
  const int64_t V = m.vocab, T = m.seq_len, d = m.d_model, E = m.experts, f = m.expert_ffn;
  const int64_t fd = m.dense_width();
  std::vector<std::pair<std::string, std::vector<int64_t>>> out = {{"wte", {V, d}},
                                                                   {"wpe", {T, d}}};
  for (int l = 0; l < m.layers; ++l) {
    const std::string p = absl::StrCat("layers.", l, ".");
    for (auto& [name, shape] :
         std::vector<std::pair<std::string, std::vector<int64_t>>>{{"ln1.weight", {d}},
                                                                   {"ln1.bias", {d}},
                                                                   {"attn.wqkv", {d, 3 * d}},
                                                                   {"attn.bqkv", {3 * d}},
                                                                   {"attn.wo", {d, d}},
                                                                   {"attn.bo", {d}},
                                                                   {"ln2.weight", {d}},
                                                                   {"ln2.bias", {d}}}) {
      out.emplace_back(p + name, shape);
    }
    if (m.IsMoeLayer(l)) {
      out.emplace_back(p + "moe.router", std::vector<int64_t>{d, E});
      for (int e = 0; e < E; ++e) {
        const std::string q = absl::StrCat(p, "moe.experts.", e, ".");
        out.emplace_back(q + "w1", std::vector<int64_t>{d, f});
        out.emplace_back(q + "b1", std::vector<int64_t>{f});
        out.emplace_back(q + "w2", std::vector<int64_t>{f, d});
        out.emplace_back(q + "b2", std::vector<int64_t>{d});
      }
    } else {
      out.emplace_back(p + "mlp.w1", std::vector<int64_t>{d, fd});
      out.emplace_back(p + "mlp.b1", std::vector<int64_t>{fd});
      out.emplace_back(p + "mlp.w2", std::vector<int64_t>{fd, d});
      out.emplace_back(p + "mlp.b2", std::vector<int64_t>{d});
    }
  }
  out.emplace_back("lnf.weight", std::vector<int64_t>{d});
  out.emplace_back("lnf.bias", std::vector<int64_t>{d});
  return out;
}

absl::StatusOr<std::unique_ptr<KvDecoder>> KvDecoder::Create(const ModelConfig& config,
                                                             Weights weights) {
  RETURN_IF_ERROR(config.Validate());
  const auto shapes = ParameterShapes(config);
  for (const auto& [name, shape] : shapes) {
    auto it = weights.find(name);
    if (it == weights.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("weights: tensor ", name, " ", train::ShapeText(shape), " is missing"));
    }
    int64_t numel = 1;
    for (int64_t s : shape) numel *= s;
    if (it->second.shape != shape || static_cast<int64_t>(it->second.data.size()) != numel) {
      return absl::InvalidArgumentError(absl::StrCat("weights: tensor ", name, " has shape ",
                                                     train::ShapeText(it->second.shape),
                                                     ", the model's is ", train::ShapeText(shape)));
    }
  }
  if (weights.size() != shapes.size()) {
    for (const auto& [name, tensor] : weights) {
      if (std::none_of(shapes.begin(), shapes.end(),
                       [&name](const auto& s) { return s.first == name; })) {
        return absl::InvalidArgumentError(
            absl::StrCat("weights: tensor ", name, " is not a parameter of this model"));
      }
    }
  }
  return std::unique_ptr<KvDecoder>(new KvDecoder(config, std::move(weights)));
}

KvDecoder::KvDecoder(const ModelConfig& config, Weights weights)
    : config_(config), weights_(std::move(weights)) {
  const size_t cache = static_cast<size_t>(config_.seq_len) * config_.d_model;
  keys_.assign(config_.layers, std::vector<float>(cache));
  values_.assign(config_.layers, std::vector<float>(cache));
}

void KvDecoder::AddFfn(int l, const std::vector<float>& u, int n, std::vector<float>& x) const {
  const int C = config_.d_model;
  const std::string p = absl::StrCat("layers.", l, ".");
  std::vector<float> y(static_cast<size_t>(n) * C);
  if (!config_.IsMoeLayer(l)) {
    Mlp(u.data(), W(p + "mlp.w1"), W(p + "mlp.b1"), W(p + "mlp.w2"), W(p + "mlp.b2"), n, C,
        config_.dense_width(), y.data());
    for (size_t i = 0; i < y.size(); ++i) x[i] += y[i];
    return;
  }
  const int E = config_.experts, k = config_.top_k, F = config_.expert_ffn;
  std::vector<float> logits(static_cast<size_t>(n) * E);
  Linear(u.data(), W(p + "moe.router"), nullptr, n, C, E, logits.data());
  std::vector<float> out(C);
  for (int i = 0; i < n; ++i) {
    // p = softmax(router logits), the logits in fp32 as the router's, the probabilities in double
    // (the router's are fp32: two experts within fp32 round-off of each other may be ordered the
    // other way here), then the k largest (ties to the lower index), renormalised when
    // normalize_topk.
    const float* lg = logits.data() + int64_t{i} * E;
    const float mx = *std::max_element(lg, lg + E);
    std::vector<double> prob(E);
    double sum = 0;
    for (int e = 0; e < E; ++e) sum += prob[e] = std::exp(static_cast<double>(lg[e]) - mx);
    for (double& v : prob) v /= sum;
    std::vector<int> chosen;
    std::vector<bool> taken(E, false);
    for (int j = 0; j < k; ++j) {
      int best = -1;
      for (int e = 0; e < E; ++e) {
        if (!taken[e] && (best < 0 || prob[e] > prob[best])) best = e;
      }
      taken[best] = true;
      chosen.push_back(best);
    }
    double gate_sum = 0;
    for (int e : chosen) gate_sum += prob[e];
    std::fill(out.begin(), out.end(), 0.0f);
    const float* ui = u.data() + int64_t{i} * C;
    for (int e : chosen) {
      const std::string q = absl::StrCat(p, "moe.experts.", e, ".");
      Mlp(ui, W(q + "w1"), W(q + "b1"), W(q + "w2"), W(q + "b2"), 1, C, F, y.data());
      const double gate = config_.normalize_topk ? prob[e] / gate_sum : prob[e];
      for (int c = 0; c < C; ++c) out[c] += static_cast<float>(gate * y[c]);
    }
    float* xi = x.data() + int64_t{i} * C;
    for (int c = 0; c < C; ++c) xi[c] += out[c];
  }
}

absl::StatusOr<std::vector<float>> KvDecoder::Append(absl::Span<const int32_t> tokens) {
  const int n = static_cast<int>(tokens.size());
  const int V = config_.vocab, C = config_.d_model, NH = config_.heads, hs = C / NH;
  if (length_ + n > config_.seq_len) {
    return absl::OutOfRangeError(absl::StrCat("the context would hold ", length_ + n,
                                              " tokens; the model's seq_len is ", config_.seq_len));
  }
  for (int i = 0; i < n; ++i) {
    if (tokens[i] < 0 || tokens[i] >= V) {
      return absl::InvalidArgumentError(
          absl::StrCat("token ", tokens[i], " is outside the model's vocabulary [0, ", V, ")"));
    }
  }
  const int p0 = length_;
  std::vector<float> x(static_cast<size_t>(n) * C);  // (n, C) residual stream
  for (int i = 0; i < n; ++i) {
    const float* te = W("wte") + int64_t{tokens[i]} * C;
    const float* pe = W("wpe") + int64_t{p0 + i} * C;
    for (int c = 0; c < C; ++c) x[int64_t{i} * C + c] = te[c] + pe[c];
  }
  std::vector<float> a(x.size()), qkv(static_cast<size_t>(n) * 3 * C), y(x.size()), o(x.size());
  const double scale = 1.0 / std::sqrt(static_cast<double>(hs));
  std::vector<double> score(config_.seq_len);
  for (int l = 0; l < config_.layers; ++l) {
    const std::string p = absl::StrCat("layers.", l, ".");
    Norm(x.data(), W(p + "ln1.weight"), W(p + "ln1.bias"), n, C, a.data());
    Linear(a.data(), W(p + "attn.wqkv"), W(p + "attn.bqkv"), n, C, 3 * C, qkv.data());
    float* K = keys_[l].data();
    float* Vc = values_[l].data();
    for (int i = 0; i < n; ++i) {
      const float* row = qkv.data() + int64_t{i} * 3 * C;
      std::copy(row + C, row + 2 * C, K + int64_t{p0 + i} * C);
      std::copy(row + 2 * C, row + 3 * C, Vc + int64_t{p0 + i} * C);
    }
    // Causal attention: token i (position p0 + i) attends to positions 0 .. p0 + i.
    for (int i = 0; i < n; ++i) {
      const int t = p0 + i;
      for (int h = 0; h < NH; ++h) {
        const float* q = qkv.data() + int64_t{i} * 3 * C + h * hs;
        double mx = -INFINITY;
        for (int j = 0; j <= t; ++j) {
          const float* kj = K + int64_t{j} * C + h * hs;
          double dot = 0;
          for (int c = 0; c < hs; ++c) dot += static_cast<double>(q[c]) * kj[c];
          score[j] = dot * scale;
          mx = std::max(mx, score[j]);
        }
        double sum = 0;
        for (int j = 0; j <= t; ++j) sum += score[j] = std::exp(score[j] - mx);
        float* out = y.data() + int64_t{i} * C + h * hs;
        for (int c = 0; c < hs; ++c) {
          double acc = 0;
          for (int j = 0; j <= t; ++j) acc += score[j] * Vc[int64_t{j} * C + h * hs + c];
          out[c] = static_cast<float>(acc / sum);
        }
      }
    }
    Linear(y.data(), W(p + "attn.wo"), W(p + "attn.bo"), n, C, C, o.data());
    for (size_t i = 0; i < x.size(); ++i) x[i] += o[i];
    Norm(x.data(), W(p + "ln2.weight"), W(p + "ln2.bias"), n, C, a.data());
    AddFfn(l, a, n, x);
  }
  Norm(x.data(), W("lnf.weight"), W("lnf.bias"), n, C, a.data());
  // logits (n, V) = y @ wte^T (the tied head).
  std::vector<float> logits(static_cast<size_t>(n) * V);
  const float* wte = W("wte");
  for (int i = 0; i < n; ++i) {
    const float* yi = a.data() + int64_t{i} * C;
    for (int v = 0; v < V; ++v) {
      const float* wv = wte + int64_t{v} * C;
      double dot = 0;
      for (int c = 0; c < C; ++c) dot += static_cast<double>(yi[c]) * wv[c];
      logits[int64_t{i} * V + v] = static_cast<float>(dot);
    }
  }
  length_ += n;
  return logits;
}

}  // namespace furnace::model
