// The formulas, op by op, with where each term comes from (REPORT.md "Analytical bytes").
#include "bench/distributed/layout_bytes.h"

namespace furnace::bench {
namespace {

using comm::CollectiveOp;

constexpr int64_t kF32 = 4;    // bytes per float
constexpr int64_t kCount = 8;  // bytes per int64 routing count

int Op(CollectiveOp op) { return static_cast<int>(op); }

struct StageLayers {
  int first = 0, last = 0;  // [first, last)
  int moe = 0, dense = 0;
};

StageLayers LayersOf(const topology::Topology& topo, int stage, const model::ModelConfig& c) {
  StageLayers s;
  const auto [first, last] = topology::Topology::StageLayers(stage, topo.sizes().pp, c.layers);
  s.first = first;
  s.last = last;
  for (int l = first; l < last; ++l) (c.IsMoeLayer(l) ? s.moe : s.dense)++;
  return s;
}

}  // namespace

int64_t RankBytes::ExactTotal(int op) const {
  return fixed[op] + per_ep_row[op] * routed_rows + per_expert_row[op] * gather * routed_rows;
}

int64_t DenseGradFloats(const topology::Topology& topo, int rank, const model::ModelConfig& c) {
  const topology::ParallelSizes& z = topo.sizes();
  const topology::Coords co = topo.CoordsOf(rank);
  const int64_t V = c.vocab, T = c.seq_len, d = c.d_model, tp = z.tp, E = c.experts;
  const int64_t F = c.dense_width();
  const bool first = co.pp == 0, last = co.pp == z.pp - 1;
  int64_t n = 0;
  if (first || last) n += V * d;  // the tied wte (one copy per end stage)
  if (first) n += T * d;          // wpe
  if (last) n += 2 * d;           // lnf
  const StageLayers s = LayersOf(topo, co.pp, c);
  // Per layer: ln1 + ln2 (whole), column-parallel qkv and its bias, row-parallel wo, bo (whole).
  const int64_t attention = 2 * d + d * 3 * d / tp + 3 * d / tp + (d / tp) * d + d + 2 * d;
  const int64_t router = d * E;
  const int64_t mlp = d * (F / tp) + F / tp + (F / tp) * d + d;  // w1 b1 split, w2 rows, b2 whole
  n += (s.moe + s.dense) * attention + s.moe * router + s.dense * mlp;
  return n;
}

int64_t TpReplicatedGradFloats(const topology::Topology& topo, int rank,
                               const model::ModelConfig& c) {
  const topology::ParallelSizes& z = topo.sizes();
  const topology::Coords co = topo.CoordsOf(rank);
  const int64_t V = c.vocab, T = c.seq_len, d = c.d_model, E = c.experts;
  const bool first = co.pp == 0, last = co.pp == z.pp - 1;
  int64_t n = 0;
  if (first || last) n += V * d;  // wte
  if (first) n += T * d;          // wpe
  if (last) n += 2 * d;           // lnf
  const StageLayers s = LayersOf(topo, co.pp, c);
  // Per layer: ln1, bo, ln2 (5d); MoE: the router; dense: mlp.b2.
  n += (s.moe + s.dense) * 5 * d + s.moe * d * E + s.dense * d;
  return n;
}

int64_t ExpertGradFloats(const topology::Topology& topo, int rank, const model::ModelConfig& c) {
  const topology::ParallelSizes& z = topo.sizes();
  const StageLayers s = LayersOf(topo, topo.CoordsOf(rank).pp, c);
  const int64_t d = c.d_model, El = c.experts / z.ep, fl = c.expert_ffn / z.esp;
  return s.moe * El * (d * fl + fl + fl * d + d);  // w1, b1 (hidden slice), w2 (rows), b2 whole
}

RankBytes AnalyticalRankBytes(const topology::Topology& topo, int rank, const StepShape& shape) {
  const topology::ParallelSizes& z = topo.sizes();
  const topology::Coords co = topo.CoordsOf(rank);
  const model::ModelConfig& c = shape.model;
  const int64_t B = shape.micro_batch, m = shape.micro_batches, T = c.seq_len, C = c.d_model;
  const int64_t N = B * T, E = c.experts, k = c.top_k, V = c.vocab;
  const int64_t NC = N * C;
  const bool first = co.pp == 0, last = co.pp == z.pp - 1;
  const StageLayers s = LayersOf(topo, co.pp, c);
  const int edp = topo.edp();

  RankBytes r;
  r.stage = co.pp;
  r.ep_coord = co.ep;
  r.esp = z.esp;
  // The deepspeed schedule (every MoE layer, the model's default) slices the experts where the
  // ESP group is the TP group.
  const bool sliced = z.esp > 1 && topo.EspGroupIsTpGroup();
  r.gather = sliced ? 1 : z.esp;
  r.exact_per_rank = z.ep == 1;
  r.routed_rows = s.moe * m * N * k;
  OpBytes& f = r.fixed;

  // all_reduce.
  //  * TP (attention_block.cc, mlp_block.cc): the row-parallel output in forward
  //    (RowParallelFinish) and the column-parallel input gradient in backward
  //    (ColumnParallelInputGrad), (N, C) each, for every attention block and dense MLP.
  //    MoE blocks do none over tp (the deepspeed schedule sends each TP copy of a token instead);
  //    sliced experts all-reduce over esp, below.
  if (z.tp > 1) f[Op(CollectiveOp::kAllReduce)] += m * 2 * (s.moe + 2 * s.dense) * NC * kF32;
  //  * SyncGradients (trainer_parallel.cc): dense gradients over `data`, experts over
  //    `expert_data` (bucketing splits the calls, not the bytes); the tied wte over `embedding`
  //    on the two end stages of a pipeline.
  //    What TP replicates is averaged over `tensor` first (its replicas stay bit-identical).
  if (z.tp > 1) {
    f[Op(CollectiveOp::kAllReduce)] += TpReplicatedGradFloats(topo, rank, c) * kF32;
  }
  if (z.dp > 1) f[Op(CollectiveOp::kAllReduce)] += DenseGradFloats(topo, rank, c) * kF32;
  if (edp > 1) f[Op(CollectiveOp::kAllReduce)] += ExpertGradFloats(topo, rank, c) * kF32;
  if (z.pp > 1 && (first || last)) f[Op(CollectiveOp::kAllReduce)] += V * C * kF32;
  //  * ClipParallel: the squared norm, the asynchronous checkpoint's three flags, the
  //    checkpointed-stop flag and the memory planner's vote for agreeing on collective drops, six
  //    floats over `world`; ReduceStats: loss, aux, dropped and tokens per expert of every MoE
  //    layer of the model, over `world`.
  if (z.world() > 1) {
    // loss, aux, then dropped and each token count as three floats (its 8-bit digits above 16,
    // 8-15, 0-7: Trainer::ReduceStats).
    f[Op(CollectiveOp::kAllReduce)] +=
        6 * kF32 + (2 + 3 * (1 + int64_t{c.num_moe_layers()} * E)) * kF32;
  }

  // The MoE dispatcher (dispatcher.cc), per MoE layer of this stage and micro-batch, when the
  // layer is distributed (ep > 1 or esp > 1). Prepare (forward only; backward reuses the handle):
  // the per-expert counts, E int64 split over EP (all-to-all) and the EP-received counts, again E
  // int64, gathered over ESP (not with sliced experts: the ESP peers' counts are the same).
  // ToExperts runs in forward (the rows) and backward (the output gradient); FromExperts in
  // forward (the outputs) and backward (the input gradient):
  //   ToExperts:   all-to-all over EP sends the S routed rows; all-gather over ESP contributes
  //                the A rows received over EP (sliced: nothing, copy(esp));
  //   FromExperts: reduce-scatter over ESP hands in all R gathered rows (sliced: an all-reduce of
  //                the R = A rows, ar(esp)); all-to-all over EP sends the A rows back.
  const int64_t layer_mb = s.moe * m;
  if (z.ep > 1) {
    f[Op(CollectiveOp::kAllToAll)] += layer_mb * (E * kCount + 2 * N * k * C * kF32);
    r.per_ep_row[Op(CollectiveOp::kAllToAll)] = 2 * C * kF32;
  }
  if (z.esp > 1 && sliced) {
    r.per_expert_row[Op(CollectiveOp::kAllReduce)] = 2 * C * kF32;
  } else if (z.esp > 1) {
    f[Op(CollectiveOp::kAllGather)] += layer_mb * E * kCount;
    r.per_ep_row[Op(CollectiveOp::kAllGather)] = 2 * C * kF32;
    r.per_expert_row[Op(CollectiveOp::kReduceScatter)] = 2 * C * kF32;
  }

  // 1F1B (trainer_parallel.cc RunSchedule): each micro-batch's (B, T, C) activation goes to the
  // next stage and its gradient to the previous one.
  if (z.pp > 1) {
    const int64_t act = NC * kF32;
    f[Op(CollectiveOp::kSend)] += m * act * ((last ? 0 : 1) + (first ? 0 : 1));
    f[Op(CollectiveOp::kRecv)] += m * act * ((first ? 0 : 1) + (last ? 0 : 1));
  }
  return r;
}

int64_t AssignmentsToExperts(const topology::Topology& topo, const model::ModelConfig& c,
                             const std::vector<std::vector<int64_t>>& tokens_per_expert, int stage,
                             int ep_coord) {
  const StageLayers s = LayersOf(topo, stage, c);
  const int El = c.experts / topo.sizes().ep;
  int64_t n = 0;
  int moe_index = 0;
  for (int l = 0; l < c.layers; ++l) {
    if (!c.IsMoeLayer(l)) continue;
    if (l >= s.first && l < s.last && moe_index < static_cast<int>(tokens_per_expert.size())) {
      const std::vector<int64_t>& counts = tokens_per_expert[moe_index];
      for (int e = ep_coord * El; e < (ep_coord + 1) * El && e < static_cast<int>(counts.size());
           ++e) {
        n += counts[e];
      }
    }
    ++moe_index;
  }
  return n;
}

}  // namespace furnace::bench
