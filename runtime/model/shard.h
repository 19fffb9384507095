// ModelShard: which part of the model one rank holds under a parallel layout, in model terms
// (runtime/topology derives it from the rank's coordinates). The default is the whole model.
//
//   pipeline:  layers [first_layer, last_layer) of stage `stage` of `stages`; the first stage holds
//              wte and wpe, the last stage lnf and its own copy of the tied wte;
//   tensor:    attention heads and dense-MLP columns/rows split over `tp` (Megatron column/row);
//   expert:    experts [ep_rank * E/ep, (ep_rank+1) * E/ep) of every MoE layer;
//   expert sharding: of each held expert, hidden columns [esp_rank * f/esp, ...) of w1/b1 and
//              the same rows of w2 (b2 whole).
// dp_rank / edp_rank only decide which replica counts a parameter in the gradient norm.
#pragma once

#include <utility>

#include "runtime/model/config.h"
#include "runtime/topology/topology.h"

namespace furnace::model {

struct ModelShard {
  int stage = 0, stages = 1;
  int first_layer = 0, last_layer = -1;  // -1: config.layers
  int tp = 1, tp_rank = 0;
  int ep = 1, ep_rank = 0;
  int esp = 1, esp_rank = 0;
  int dp_rank = 0, edp_rank = 0;

  bool first_stage() const { return stage == 0; }
  bool last_stage() const { return stage == stages - 1; }
  bool whole() const { return stages == 1 && tp == 1 && ep == 1 && esp == 1; }
  int end_layer(const ModelConfig& c) const { return last_layer < 0 ? c.layers : last_layer; }
  bool HoldsLayer(const ModelConfig& c, int layer) const {
    return layer >= first_layer && layer < end_layer(c);
  }
  int local_experts(const ModelConfig& c) const { return c.experts / ep; }
  int first_expert(const ModelConfig& c) const { return ep_rank * local_experts(c); }
  int local_expert_ffn(const ModelConfig& c) const { return c.expert_ffn / esp; }
  int local_heads(const ModelConfig& c) const { return c.heads / tp; }
  int local_width(const ModelConfig& c) const { return c.d_model / tp; }
  int local_dense_ffn(const ModelConfig& c) const { return c.dense_width() / tp; }
};

// The shard of `rank` of `topology`: its stage's layers, TP / EP / ESP slices, DP / EDP ranks.
ModelShard ShardOf(const topology::Topology& topology, int rank, const ModelConfig& config);

}  // namespace furnace::model
