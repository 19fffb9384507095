// The analytical communication volume of one training step on one rank of a parallel layout, in
// the byte accounting of runtime/comm/communicator.h (what each rank hands to each collective),
// derived from the shapes, the layout and, where it matters, the routing. bench_distributed
// compares it with what the communicators counted (StepStats::comm summed over the groups);
// REPORT.md has the formulas with the code they come from.
//
// What depends on routing: with expert parallelism (ep > 1) the rows a rank RECEIVES over the EP
// all-to-all (A) and the rows its experts process (R, the ESP group's A summed) depend on where
// the other ranks' tokens went. Everything else is fixed by the shapes: a rank always routes
// S = N * k rows per MoE layer and micro-batch when dropless. So a rank's bytes are
//     fixed + per_ep_row * A + per_expert_row * R,
// A and R summed over the step (its MoE layers and micro-batches). A single rank's A is not in
// StepStats (tokens_per_expert is global), but the sum of A over the ranks of one stage that hold
// the same experts (same ep coordinate) is: tp * (global assignments to those experts in that
// stage's layers), because every tensor-parallel copy of a token is sent separately. With ep == 1,
// A = S and R = esp * S on every rank, so every count is exact per rank. Where the ESP group is the
// TP group the deepspeed schedule slices the experts (runtime/moe/schedule.h): R = A, and the ESP
// exchange is an all-reduce of the R rows (forward outputs, backward input gradients).
//
// Pure functions; no I/O. Dropless routing only (capacity_factor 0).
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "runtime/comm/communicator.h"
#include "runtime/model/config.h"
#include "runtime/topology/topology.h"

namespace furnace::bench {

using OpBytes = std::array<int64_t, comm::kNumCollectiveOps>;

struct StepShape {
  model::ModelConfig model;
  int micro_batch = 1;    // B
  int micro_batches = 1;  // m per data-parallel rank
};

struct RankBytes {
  OpBytes fixed{};           // shapes and layout only
  OpBytes per_ep_row{};      // bytes per row received over EP (A)
  OpBytes per_expert_row{};  // bytes per row processed by this rank's experts (R)
  int64_t routed_rows = 0;   // S over the step: its MoE layers x m x N x k
  int stage = 0, ep_coord = 0, esp = 1;
  // R / A: the ESP width the experts gather their rows over (esp; 1 with sliced experts).
  int gather = 1;
  // Whether A and R are known without routing (ep == 1: A = S, R = gather * S).
  bool exact_per_rank = false;
  // Where exact_per_rank: fixed + per_ep_row * S + per_expert_row * gather * S.
  int64_t ExactTotal(int op) const;
};

// Floats of this rank's gradients summed over the data-parallel group (GradSync::kData) and over
// the expert-data-parallel group (kExpertData), from the shapes (BuildParamLayout's parameters).
int64_t DenseGradFloats(const topology::Topology& topo, int rank, const model::ModelConfig& c);
// Gradient floats of what tensor parallelism replicates on this rank (averaged over `tensor`).
int64_t TpReplicatedGradFloats(const topology::Topology& topo, int rank,
                               const model::ModelConfig& c);
int64_t ExpertGradFloats(const topology::Topology& topo, int rank, const model::ModelConfig& c);

RankBytes AnalyticalRankBytes(const topology::Topology& topo, int rank, const StepShape& shape);

// Global assignments (tokens_per_expert[moe_layer][e], summed over the step) to the experts of EP
// coordinate `ep_coord`, over the MoE layers held by pipeline stage `stage`.
int64_t AssignmentsToExperts(const topology::Topology& topo, const model::ModelConfig& c,
                             const std::vector<std::vector<int64_t>>& tokens_per_expert, int stage,
                             int ep_coord);

}  // namespace furnace::bench
