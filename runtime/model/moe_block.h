// The MoE half of an MoE layer (MODEL.md "The MoE layer"):
//   u = LN2(x); p = softmax(u @ Wg); top-k -> gates; MakeDispatchPlan (capacity) -> permute rows
//   by expert -> grouped GEMM W1 -> GELU -> grouped GEMM W2 -> unpermute weighted by the gates;
//   x_out = x + that. The Switch aux loss counts every routing choice, dropped or not.
// The expert buffers (S rows, S = kept assignments) are allocated after routing, which is where a
// memory planner will hook in; their size is the reason activation memory depends on routing.
// With expert parallelism / sharding (ctx.groups.ep or .esp of more than one rank) the permuted
// rows go to the expert ranks through moe::ExpertDispatcher and come back before the weighted
// combine; the expert buffers then hold R rows (what this rank's experts process). The declared
// bytes below follow both paths (MoeRows).
// The dispatch plan is not saved: backward rebuilds it from the top-k indices (a pure function of
// them), from the host copy forward made of them (the plan is built on the host).
// Saved tensors and their rebuilds (memory policies, runtime/memory/policy.h). One tag per shape:
//   moe.expert_input (R, C)     the rows the local experts process; rebuilt by permuting LN2's
//                               output again and, distributed, re-running the dispatch all-to-all
//                               (RecomputeCollective::kExpertDispatch);
//   moe.combined_output (S, C)  the expert outputs back in routed order; rebuilt by the second
//                               expert GEMM and, distributed, the combine all-to-all (ditto);
//   moe.routed_input (S, C), moe.expert_output (R, C): the other side of each all-to-all, scratch
//                               on a distributed layout (on one rank R = S and they are the saved
//                               buffers themselves).
// The router probabilities are rebuilt by RouterForward with the RouterInputs forward used.
// A routing spike (spikes.h), when given, is one of those inputs: RouterForward adds its bias to
// the logits of its forced tokens before the softmax, in forward and in the rebuild alike.
// Backward needs nothing more: the bias is a constant.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/model/module.h"
#include "runtime/model/param_layout.h"
#include "runtime/model/spikes.h"
#include "runtime/moe/dispatcher.h"
#include "runtime/moe/schedule.h"

namespace furnace::model {

// Everything that shapes the router's output. Forward and the router-probs rebuild both call
// RouterForward with it (the rebuild captures it whole), so a rebuild routes exactly as forward
// did; an input that modifies routing belongs here.
struct RouterInputs {
  const float* weight = nullptr;  // (C, E) Wg; must stay valid while the saved probs live
  int N = 0, C = 0, E = 0;
  std::string prefix;  // "layers.<l>.", for the arena tags
  // Added to the logits of the forced tokens (spikes.h) on a routing-spike step.
  std::optional<RoutingSpike> spike;
};
// probs (N, E) = softmax(u @ Wg), u (N, C); the logits are arena scratch.
absl::StatusOr<tensor::Buffer> RouterForward(ModuleContext& ctx, const RouterInputs& router,
                                             const float* u);

struct MoeSaved {
  StashHandle ln_out, ln_mean, ln_rstd;  // (B, T, C), (B, T), (B, T)
  StashHandle probs;                     // (G, E) router softmax of the gated tokens
  StashHandle indices;                   // (G, k) int32 chosen experts
  // The same (G, k) indices in host memory, copied once in forward: the dispatch plan of the
  // forward, of backward and of the expert-input rebuild is built from it (host memory).
  std::shared_ptr<const std::vector<int32_t>> host_indices;
  StashHandle gates;   // (G, k)
  StashHandle xin;     // (R, C) moe.expert_input (R = S on one rank)
  StashHandle pre;     // (R, fl) xin @ W1 + b1
  StashHandle hidden;  // (R, fl) GELU(pre)
  StashHandle eo;      // (S, C) moe.combined_output, in routed order
  StashHandle out;     // (B, T, C) residual stream after the layer
  // The tokens this rank gates: [gate_first, gate_first + gated) of the N (all of them, except
  // under s1 on tp > 1: this peer's slice).
  int64_t gate_first = 0;
  int gated = 0;
  // s1 on tp > 1: the group's choices per expert (E) and the choices the peers before this one
  // queued per expert (E), for the capacity cut and the aux loss's backward. Empty otherwise.
  std::vector<int64_t> group_choices, queued;
  // Routing results.
  double aux = 0;
  std::vector<int64_t> routed;  // (E) assignments before dropping (the tp group's under s1)
  int64_t rows = 0;             // S (this peer's routed rows)
  int64_t dropped = 0;          // N * k - S over the group
  // Expert parallelism / sharding only: where the rows went (reused by backward).
  bool distributed = false;
  moe::DispatchHandle dispatch;
};

absl::StatusOr<MoeSaved> MoeBlockForward(ModuleContext& ctx, const Dims& dims, const MoeShape& m,
                                         int layer, const LayerOffsets& off, const float* params,
                                         StashHandle x_in, const RoutingSpike* spike = nullptr);
// dres: d loss / d out on entry, d loss / d x_in on return. aux_scale: d loss / d aux.
absl::Status MoeBlockBackward(ModuleContext& ctx, const Dims& dims, const MoeShape& m,
                              const LayerOffsets& off, const float* params, float* grads,
                              const MoeSaved& saved, StashHandle x_in, double aux_scale,
                              float* dres);

// Its declared bytes: declared_bytes.h (they mirror the allocation order here).

}  // namespace furnace::model
