#include "runtime/model/declared_bytes.h"

#include <algorithm>

#include "kernels/permute.h"

namespace furnace::model {

MoeShape MoeShapeOf(const ModelConfig& c, const ModelShard& s) {
  MoeShape m{c.experts, c.top_k, c.expert_ffn, c.capacity_factor, c.normalize_topk, c.aux_alpha};
  m.local_E = s.local_experts(c);
  m.local_f = s.local_expert_ffn(c);
  m.adds_b2 = s.esp_rank == 0;
  return m;
}

std::vector<SavedTensorBytes> NormSaved(const Dims& d, std::string_view out_tag,
                                        std::string_view mean_tag, std::string_view rstd_tag) {
  const int64_t N = d.N();
  return {{out_tag, F32Bytes(N * d.C), 2 * F32Bytes(N)},
          {mean_tag, F32Bytes(N), 0},
          {rstd_tag, F32Bytes(N), 0}};
}

int64_t TotalBytes(const std::vector<SavedTensorBytes>& saved) {
  int64_t total = 0;
  for (const SavedTensorBytes& s : saved) total += s.bytes;
  return total;
}

ModuleBytes DeclareModule(const std::vector<SavedTensorBytes>& saved, int64_t forward_peak,
                          int64_t backward_scratch_peak, memory::MemoryPolicy policy) {
  ModuleBytes m;
  m.forward_peak = forward_peak;
  BytesTimeline rebuilt;  // the acquire phase of the backward
  for (const SavedTensorBytes& s : saved) {
    if (memory::StaticSaveAction(policy, s.tag) == memory::SaveAction::kKeep) {
      m.saved += s.bytes;
    } else {
      rebuilt.Alloc(s.bytes + s.rebuild_scratch);
      rebuilt.Free(s.rebuild_scratch);
    }
  }
  m.backward_peak = std::max(rebuilt.peak(), rebuilt.current() + backward_scratch_peak);
  return m;
}

std::vector<SavedTensorBytes> EmbeddingSavedTensors(const Dims& dims) {
  return {{"embedding.tokens", I32Bytes(dims.N()), 0},
          {"embedding.out", F32Bytes(int64_t{dims.N()} * dims.C), 0}};
}

int64_t EmbeddingSavedBytes(const Dims& dims) { return TotalBytes(EmbeddingSavedTensors(dims)); }
int64_t EmbeddingForwardPeakBytes(const Dims& dims) { return EmbeddingSavedBytes(dims); }
int64_t EmbeddingBackwardPeakBytes(const Dims&) { return 0; }

int64_t AttentionProbsBytes(const Dims& d) {
  return F32Bytes(int64_t{d.B} * d.local_NH() * d.T * d.T);
}

int64_t AttentionRowStatsBytes(const Dims& d) {
  return F32Bytes(int64_t{d.B} * d.local_NH() * d.T * 2);
}

std::vector<SavedTensorBytes> AttentionSavedTensors(const Dims& d) {
  const int64_t NC = int64_t{d.N()} * d.C, NCl = int64_t{d.N()} * d.local_C();
  std::vector<SavedTensorBytes> saved = NormSaved(d, "ln1.out", "ln1.mean", "ln1.rstd");
  saved.push_back({"attn.qkv", F32Bytes(3 * NCl), 0});
  if (d.recompute_probs) {
    saved.push_back({"attn.stats", AttentionRowStatsBytes(d), 0});
  } else {
    saved.push_back({"attn.probs", AttentionProbsBytes(d), 0});
  }
  saved.push_back({"attn.y", F32Bytes(NCl), 0});
  saved.push_back({"attn.residual", F32Bytes(NC), 0});
  return saved;
}

int64_t AttentionSavedBytes(const Dims& d) { return TotalBytes(AttentionSavedTensors(d)); }

int64_t AttentionForwardPeakBytes(const Dims& d) { return AttentionSavedBytes(d); }

int64_t AttentionBackwardPeakBytes(const Dims& d) {
  const int64_t NC = int64_t{d.N()} * d.C, NCl = int64_t{d.N()} * d.local_C();
  BytesTimeline t;
  t.Alloc(F32Bytes(NCl));      // dy
  t.Alloc(F32Bytes(3 * NCl));  // dqkv
  t.Free(F32Bytes(NCl));       // dy
  t.Alloc(F32Bytes(NC));       // da
  return t.peak();
}

std::vector<SavedTensorBytes> MlpSavedTensors(const Dims& d, int F) {
  const int64_t NC = int64_t{d.N()} * d.C, NF = int64_t{d.N()} * F;
  std::vector<SavedTensorBytes> saved = NormSaved(d, "ln2.out", "ln2.mean", "ln2.rstd");
  saved.push_back({"mlp.pre", F32Bytes(NF), 0});
  saved.push_back({"mlp.hidden", F32Bytes(NF), 0});  // rebuilt from mlp.pre, no scratch
  saved.push_back({"mlp.residual", F32Bytes(NC), 0});
  return saved;
}

int64_t MlpSavedBytes(const Dims& d, int F) { return TotalBytes(MlpSavedTensors(d, F)); }

int64_t MlpForwardPeakBytes(const Dims& d, int F) { return MlpSavedBytes(d, F); }

int64_t MlpBackwardPeakBytes(const Dims& d, int F) {
  const int64_t NC = int64_t{d.N()} * d.C, NF = int64_t{d.N()} * F;
  BytesTimeline t;
  t.Alloc(F32Bytes(NF));  // dhidden
  t.Alloc(F32Bytes(NF));  // dpre
  t.Free(F32Bytes(NF));   // dhidden
  t.Alloc(F32Bytes(NC));  // ln2.dout
  return t.peak();
}

std::vector<SavedTensorBytes> MoeSavedTensors(const Dims& d, const MoeShape& m, const MoeRows& r) {
  const int64_t N = d.N(), NC = N * d.C, C = d.C, fl = m.fl();
  const int64_t G = r.gated > 0 ? r.gated : N;  // gated tokens
  // The rebuilds of the expert input and the combined output run the dispatch again: routed (S, C)
  // or expert output (R, C) beside the dispatch scratch.
  const int64_t xin_scratch = r.distributed ? F32Bytes(r.S * C + r.X * C) : 0;
  const int64_t eo_scratch = r.distributed ? F32Bytes(r.R * C + r.X * C) : 0;
  std::vector<SavedTensorBytes> saved = NormSaved(d, "ln2.out", "ln2.mean", "ln2.rstd");
  saved.push_back({"moe.router_probs", F32Bytes(G * m.E), F32Bytes(G * m.E)});  // logits scratch
  saved.push_back({"moe.topk_indices", I32Bytes(G * m.k), F32Bytes(G * m.k)});  // gates scratch
  saved.push_back({"moe.gates", F32Bytes(G * m.k), I32Bytes(G * m.k)});         // indices scratch
  saved.push_back({"moe.expert_input", F32Bytes(r.R * C), xin_scratch});
  saved.push_back({"moe.expert_pre", F32Bytes(r.R * fl), 0});
  saved.push_back({"moe.expert_hidden", F32Bytes(r.R * fl), 0});
  saved.push_back({"moe.combined_output", F32Bytes(r.S * C), eo_scratch});
  saved.push_back({"moe.residual", F32Bytes(NC), 0});
  return saved;
}

int64_t MoeSavedBytes(const Dims& d, const MoeShape& m, const MoeRows& r) {
  return TotalBytes(MoeSavedTensors(d, m, r));
}

namespace {

// MoeBlockForward's allocations up to the point where the expert buffers are allocated.
void RouterTimeline(const Dims& d, const MoeShape& m, const MoeRows& r, BytesTimeline& t) {
  const int64_t N = d.N(), NC = N * d.C;
  const int64_t G = r.gated > 0 ? r.gated : N;
  t.Alloc(F32Bytes(NC) + 2 * F32Bytes(N));         // ln2 out, mean, rstd
  t.Alloc(F32Bytes(G * m.E));                      // router logits
  t.Alloc(F32Bytes(G * m.E));                      // router probs
  t.Free(F32Bytes(G * m.E));                       // router logits
  t.Alloc(I32Bytes(G * m.k) + F32Bytes(G * m.k));  // indices, gates
}

// One of the executor's exchanges (ToExperts, FromExperts) as the code allocates it: the
// destination rows, the scratch, the scratch freed, then the source rows (the destination takes
// their place). Rows of C floats.
void ExchangeTimeline(BytesTimeline& t, int64_t from_rows, int64_t to_rows, int64_t scratch_rows,
                      int64_t C) {
  t.Alloc(F32Bytes(to_rows * C));
  t.Alloc(F32Bytes(scratch_rows * C));
  t.Free(F32Bytes(scratch_rows * C));
  t.Free(F32Bytes(from_rows * C));
}

// The rest of it: the expert buffers (ExpertInput, CombinedOutput) and the residual (under s1
// this peer's slice of it beside the gathered whole). On one rank R = S and nothing is exchanged.
void ExpertTimeline(const Dims& d, const MoeShape& m, const MoeRows& r, BytesTimeline& t) {
  const int64_t N = d.N(), NC = N * d.C, C = d.C, fl = m.fl();
  const int64_t G = r.gated > 0 ? r.gated : N;
  t.Alloc(F32Bytes(r.S * C));  // routed rows (the expert input on one rank)
  if (r.distributed) ExchangeTimeline(t, r.S, r.R, r.X, C);  // -> expert input
  t.Alloc(2 * F32Bytes(r.R * fl));                           // expert pre, hidden
  t.Alloc(F32Bytes(r.R * C));  // expert output (the combined output on one rank)
  if (r.distributed) ExchangeTimeline(t, r.R, r.S, r.X, C);  // -> combined output
  t.Alloc(F32Bytes(NC));                                     // residual
  if (G < N) {
    t.Alloc(F32Bytes(G * C));  // this peer's slice, gathered into the residual
    t.Free(F32Bytes(G * C));
  }
}

}  // namespace

int64_t MoeForwardPeakBytes(const Dims& d, const MoeShape& m, const MoeRows& r) {
  BytesTimeline t;
  RouterTimeline(d, m, r, t);
  ExpertTimeline(d, m, r, t);
  return t.peak();
}

MoeExpertPoint MoeExpertPointBytes(const Dims& d, const MoeShape& m, const MoeRows& r) {
  BytesTimeline before;
  RouterTimeline(d, m, r, before);
  BytesTimeline rest;
  ExpertTimeline(d, m, r, rest);
  return {before.current(), rest.peak()};
}

int64_t MoeBackwardPeakBytes(const Dims& d, const MoeShape& m, const MoeRows& r) {
  const int64_t N = d.N(), NC = N * d.C, C = d.C, fl = m.fl();
  const int64_t G = r.gated > 0 ? r.gated : N;
  BytesTimeline t;
  t.Alloc(F32Bytes(r.S * C));                                // dexpert_output
  t.Alloc(F32Bytes(G * m.k));                                // dgates
  if (r.distributed) ExchangeTimeline(t, r.S, r.R, r.X, C);  // to the experts
  t.Alloc(F32Bytes(r.R * fl));                               // dexpert_hidden
  t.Free(F32Bytes(r.R * C));                                 // dexpert_output
  t.Alloc(F32Bytes(r.R * fl));                               // dexpert_pre
  t.Free(F32Bytes(r.R * fl));                                // dexpert_hidden
  t.Alloc(F32Bytes(r.R * C));                                // dexpert_input
  t.Free(F32Bytes(r.R * fl));                                // dexpert_pre
  if (r.distributed) ExchangeTimeline(t, r.R, r.S, r.X, C);  // back from the experts
  t.Alloc(F32Bytes(G * C));                                  // ln2.dout (this peer's tokens)
  t.Free(F32Bytes(r.S * C));                                 // dexpert_input
  t.Alloc(F32Bytes(G * m.E));                                // dprobs
  t.Free(F32Bytes(G * m.k));                                 // dgates
  t.Alloc(F32Bytes(G * m.E));                                // dlogits
  if (G < N) {
    t.Free(2 * F32Bytes(G * m.E));  // dprobs, dlogits
    t.Alloc(F32Bytes(NC));          // ln2.dout gathered over tp
  }
  return t.peak();
}

std::vector<SavedTensorBytes> HeadSavedTensors(const Dims& d, int V) {
  std::vector<SavedTensorBytes> saved = {{"head.targets", I32Bytes(d.N()), 0}};
  for (const SavedTensorBytes& s : NormSaved(d, "lnf.out", "lnf.mean", "lnf.rstd")) {
    saved.push_back(s);
  }
  saved.push_back({"head.probs", F32Bytes(int64_t{d.N()} * V), 0});
  return saved;
}

int64_t HeadSavedBytes(const Dims& d, int V) { return TotalBytes(HeadSavedTensors(d, V)); }

int64_t HeadForwardPeakBytes(const Dims& d, int V) {
  const int64_t N = d.N(), NC = N * d.C, NV = N * V;
  BytesTimeline t;
  t.Alloc(I32Bytes(N));                     // targets
  t.Alloc(F32Bytes(NC) + 2 * F32Bytes(N));  // lnf out, mean, rstd
  t.Alloc(F32Bytes(int64_t{d.C} * V));      // wte^T
  t.Alloc(F32Bytes(NV));                    // logits
  t.Free(F32Bytes(int64_t{d.C} * V));       // wte^T
  t.Alloc(F32Bytes(NV));                    // probs
  t.Alloc(F32Bytes(N));                     // losses
  return t.peak();
}

int64_t HeadBackwardPeakBytes(const Dims& d, int V) {
  const int64_t N = d.N();
  return F32Bytes(N * V) + F32Bytes(N * d.C);  // dlogits + lnf.dout
}

// ---- One rank ----

std::vector<ModuleBytes> DeclaredModulesOf(const ModelConfig& config, const ModelShard& shard,
                                           int B, const std::vector<MoeRows>& rows,
                                           memory::MemoryPolicy policy) {
  const Dims dims{
      B, config.seq_len, config.d_model, config.heads, shard.tp, config.recompute_attention_probs};
  const MoeShape moe = MoeShapeOf(config, shard);
  const int F = shard.local_dense_ffn(config);
  const int64_t NC = int64_t{dims.N()} * dims.C;
  std::vector<ModuleBytes> modules;
  if (shard.first_stage()) {
    modules.push_back(DeclareModule(EmbeddingSavedTensors(dims), EmbeddingForwardPeakBytes(dims),
                                    EmbeddingBackwardPeakBytes(dims), policy));
  } else {
    modules.push_back({F32Bytes(NC), F32Bytes(NC), 0});  // stage.input
  }
  size_t moe_index = 0;
  for (int l = shard.first_layer; l < shard.end_layer(config); ++l) {
    modules.push_back(DeclareModule(AttentionSavedTensors(dims), AttentionForwardPeakBytes(dims),
                                    AttentionBackwardPeakBytes(dims), policy));
    if (config.IsMoeLayer(l)) {
      const MoeRows r = moe_index < rows.size() ? rows[moe_index]
                        : rows.empty()          ? MoeRows::SingleRank(int64_t{dims.N()} * moe.k)
                                                : rows.back();
      ++moe_index;
      modules.push_back(DeclareModule(MoeSavedTensors(dims, moe, r),
                                      MoeForwardPeakBytes(dims, moe, r),
                                      MoeBackwardPeakBytes(dims, moe, r), policy));
    } else {
      modules.push_back(DeclareModule(MlpSavedTensors(dims, F), MlpForwardPeakBytes(dims, F),
                                      MlpBackwardPeakBytes(dims, F), policy));
    }
  }
  if (shard.last_stage()) {
    const int V = config.vocab;
    modules.push_back(DeclareModule(HeadSavedTensors(dims, V), HeadForwardPeakBytes(dims, V),
                                    HeadBackwardPeakBytes(dims, V), policy));
  }
  return modules;
}

int64_t ResidualGradBytes(const ModelConfig& config, int B) {
  return F32Bytes(int64_t{B} * config.seq_len * config.d_model);
}

int64_t ComposePeak(const std::vector<ModuleBytes>& modules, int64_t dres) {
  int64_t live = 0, peak = 0;
  for (const ModuleBytes& m : modules) {
    peak = std::max(peak, live + m.forward_peak);
    live += m.saved;
  }
  for (auto it = modules.rbegin(); it != modules.rend(); ++it) {
    peak = std::max(peak, live + dres + it->backward_peak);
    live -= it->saved;  // a module releases its saved tensors at the end of its backward
  }
  return peak;
}

int64_t LeastActivationBytesAt(const ModelConfig& config, const ModelShard& shard, int B,
                               const MoeRows& rows) {
  // Every tensor kept: a module's backward needs all of its own saved tensors back at once, and
  // its input, the module before's output (the residual stream, which the forward reads and the
  // backward's layer norm and rebuilds read), stays beside it in both directions.
  const int64_t dres = ResidualGradBytes(config, B);
  int64_t floor = 0;
  int j = 0;
  for (const ModuleBytes& m :
       DeclaredModulesOf(config, shard, B, {rows}, memory::MemoryPolicy::kNone)) {
    const int64_t input = j++ == 0 ? 0 : dres;  // module 0 reads tokens or saves its stage input
    floor = std::max({floor, input + m.forward_peak, input + m.saved + dres + m.backward_peak});
  }
  return floor;
}

MoeRows BalancedMoeRows(const ModelConfig& config, const ModelShard& shard, int B,
                        const MoeExchange& exchange) {
  const int64_t N = int64_t{B} * config.seq_len, S = N * config.top_k;
  const int esp = shard.esp, ep = shard.ep, tp = shard.tp;
  const moe::Schedule schedule = tp == 1 ? moe::Schedule::kDeepspeed : exchange.schedule;
  // Sliced experts compute the rows they received (R = A), not their group's (R = esp A).
  const int gather = moe::SlicedExperts(schedule, exchange.esp_is_tp, esp) ? 1 : esp;
  MoeRows rows =
      esp > 1 || ep > 1 ? MoeRows{S, S * gather, S * (1 + gather), true} : MoeRows::SingleRank(S);
  if (schedule == moe::Schedule::kS1 && N % tp == 0) {
    const int64_t s = S / tp;
    rows = esp > 1 || ep > 1 ? MoeRows{s, s * esp, s * (1 + esp), true} : MoeRows::SingleRank(s);
    rows.gated = N / tp;
  } else if (schedule == moe::Schedule::kS2) {
    const int64_t share = S / tp;  // received over ep: share; gathered over esp: esp * share
    rows = MoeRows{S, share * esp, share + share * esp + S, true};
  }
  return rows;
}

int64_t MinimumActivationBytes(const ModelConfig& config, const ModelShard& shard, int B,
                               const MoeExchange& exchange) {
  return LeastActivationBytesAt(config, shard, B, BalancedMoeRows(config, shard, B, exchange));
}

std::optional<MoeRows> WorstMoeRows(const ModelConfig& config, const ModelShard& shard, int B,
                                    const MoeExchange& exchange) {
  const int esp = shard.esp, ep = shard.ep, tp = shard.tp;
  if (ep == 1 && esp == 1) return BalancedMoeRows(config, shard, B, exchange);
  if (tp > 1) return std::nullopt;
  const int64_t N = int64_t{B} * config.seq_len, k = config.top_k, E = config.experts;
  const int64_t El = MoeShapeOf(config, shard).El();
  // S rows sent by this rank, A received over ep by its El experts, R = esp A gathered.
  int64_t S = N * k, A = ep * N * std::min(k, El);
  if (config.capacity_factor > 0) {
    // Each source rank sends each expert at most its capacity (of the source's N tokens, as
    // its dispatch plan computes it: kernels/permute.h ExpertCapacity).
    const int64_t c =
        kernels::cpu::ExpertCapacity(config.capacity_factor, config.top_k, N, config.experts);
    S = std::min(S, E * c);
    A = std::min(A, ep * El * c);
  }
  return MoeRows{S, A * esp, A + A * esp, true};
}

std::optional<int64_t> RoutingBoundActivationBytes(const ModelConfig& config,
                                                   const ModelShard& shard, int B,
                                                   const MoeExchange& exchange) {
  const int64_t least = MinimumActivationBytes(config, shard, B, exchange);
  if (shard.ep == 1 && shard.esp == 1) return least;  // a rank's rows are at most N k
  const std::optional<MoeRows> worst = WorstMoeRows(config, shard, B, exchange);
  if (!worst.has_value()) return std::nullopt;
  return std::max(least, LeastActivationBytesAt(config, shard, B, *worst));
}

}  // namespace furnace::model
