// The MoE layer's schedules (DESIGN.md "MoE layer schedules"; background research/parm.md) as
// data: a forward list of primitive ops, each with the group it talks to, and a backward list
// derived from it by the ops' adjoints. One executor (runtime/model/moe_block.cc with
// moe::ScheduleExecutor, executor.h) runs the lists; the cost model (cost_model.h) prices them and
// `furnace plan` prints them. Nothing here communicates: this target links only absl.
//
// The setting. The tensor-parallel (MP) peers of a rank hold the same N tokens: attention ends in
// an all-reduce, so the MoE layer's input is replicated over `tp`. Experts live on EP ranks; ESP
// ranks each hold a hidden-width slice of an expert. The schedules differ in where MP is paused:
//
//   deepspeed  every MP peer gates all N tokens and sends all its routed rows, the baseline. When
//              the ESP group is the TP group (DeepSpeed-MoE's expert tensor parallelism: its
//              `expert_tensor_parallel_world_size = mp_size`), the ESP peers receive the same rows,
//              and each shard runs the Megatron column + row parallel expert on its own copy: the
//              input is replicated over esp (copy: nothing in forward, an all-reduce of the input
//              gradient in backward) and the partial outputs are all-reduced over esp (research/
//              parm.md 1.3 (a)); every row is computed once per shard.
//                gate . order . counts . a2a(ep) . copy(esp) . expert . ar(esp) . a2a(ep) . inverse
//              Otherwise (ESP peers on other data-parallel ranks, whose tokens differ, or an ESP
//              group smaller than the TP group, whose rows are then redundant copies; slicing that
//              one would scale expert gradients by esp/tp, not built) the shards gather their
//              group's rows, so the experts see each row tp times (gradients scaled by 1/tp).
//                gate . order . counts . a2a(ep) . ag(esp) . expert . rs(esp) . a2a(ep) . inverse
//   s1         MP paused before the gate, resumed after the combine (Parm's first schedule): each
//              peer keeps its N/tp tokens, gates them (the aux-loss statistics and the capacity
//              queue positions are exchanged over tp so routing equals the whole group's), and the
//              layer's output is all-gathered over tp at the end.
//                mp_split . gate . order . counts . a2a . ag(esp) . expert . rs(esp) . a2a .
//                inverse . mp_all_gather
//   s2         MP paused after the gate, resumed before the combine (Parm's second): every peer
//              gates all N tokens, keeps its 1/tp share of every expert's routed rows, and the
//              exchanges are fused all-to-all + all-gather ops (the all-gather of step i-1's chunk
//              overlaps the all-to-all of step i): over esp into the experts, over tp on the way
//              back, so every peer ends with all rows and runs the inverse order on all N tokens.
//                gate . order . row_split . counts . fused(a2a, ag esp) . expert . rs(esp) .
//                fused(a2a, row_all_gather tp) . inverse
//
// Adjoints (backward runs the forward list reversed, each op replaced by its adjoint):
//   mp_split <-> mp_all_gather, row_split <-> row_all_gather (the gradient of a tp-replicated
//   tensor is itself replicated, so an all-gather's adjoint is the free split); a2a <-> a2a the
//   other way; ag(esp) <-> rs(esp); copy(esp) <-> ar(esp) (Megatron's f and g); gate, order,
//   expert, inverse: their own backward kernels;
//   counts: nothing (backward reuses forward's counts). A fusing schedule (s2) then fuses every
//   a2a followed by an all-gather into one op, in backward as in forward.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace furnace::moe {

enum class Schedule { kDeepspeed = 0, kS1 = 1, kS2 = 2 };
inline constexpr Schedule kAllSchedules[] = {Schedule::kDeepspeed, Schedule::kS1, Schedule::kS2};
const char* ScheduleName(Schedule s);  // "deepspeed", "s1", "s2"
std::optional<Schedule> ParseSchedule(std::string_view name);

enum class Direction { kForward, kBackward };
const char* DirectionName(Direction d);  // "forward", "backward"

// The groups an op talks to (none for compute and for local copies).
enum class OpGroup { kNone, kTp, kEp, kEsp };
const char* OpGroupName(OpGroup g);  // "", "tp", "ep", "esp"

enum class OpKind {
  kMpSplit,           // x (N, C) -> this peer's tokens (N/tp, C); local
  kMpAllGather,       // (N/tp, C) over tp -> (N, C)
  kGate,              // LN2, router, top-k, aux loss (s1: statistics over tp)
  kOrder,             // tokens -> routed rows (S, C) grouped by expert
  kRowSplit,          // routed rows (S, C) -> this peer's share of every expert's rows; local
  kRowAllGather,      // the peers' shares over tp -> (S, C)
  kCounts,            // per-expert row counts: a2a over ep, all-gather over esp
  kAllToAll,          // rows to (or back from) the expert ranks over ep
  kEspAllGather,      // the ESP peers' rows, so each shard sees every row of its experts
  kEspReduceScatter,  // the ESP shards' partial outputs summed, each peer its own rows
  kEspCopy,           // sliced experts: the rows are replicated over esp (forward: nothing)
  kEspAllReduce,      // sliced experts: the shards' partial outputs summed, every peer all rows
  kFused,             // a2a over ep pipelined with an all-gather (esp or tp) of what arrives
  kExpert,            // the local experts' GEMMs (R rows, hidden width f / esp)
  kInverseOrder,      // routed rows -> tokens, weighted by the gates
};
const char* OpKindName(OpKind k);  // "mp_split", "gate", ..., "fused"

struct Op {
  OpKind kind;
  OpGroup group = OpGroup::kNone;     // the all-to-all's group for kFused
  OpGroup ag_group = OpGroup::kNone;  // kFused: the all-gather's group (esp or tp)
  std::string Name() const;           // "a2a(ep)", "fused(a2a ep, ag esp)", "gate"
  bool communicates() const { return group != OpGroup::kNone; }
};

// Whether a layer's experts are sliced (the deepspeed schedule on a layout whose ESP group is its
// TP group, with more than one shard; the file comment): copy(esp) / ar(esp) instead of ag / rs.
bool SlicedExperts(Schedule s, bool esp_is_tp, int esp);

// Built once per schedule and form (the executor reads them for every exchange of every layer).
// `sliced`: SlicedExperts (only the deepspeed lists change).
const std::vector<Op>& ForwardOps(Schedule s, bool sliced = false);
// Derived from ForwardOps by adjoints (and fusion).
const std::vector<Op>& BackwardOps(Schedule s, bool sliced = false);
// "gate . order . counts . a2a(ep) . ..." for logs and `furnace plan`.
std::string OpListString(const std::vector<Op>& ops);

// What a schedule changes outside the layer: whether each expert row is computed once (s1, s2,
// deepspeed with sliced experts) or once per tp peer (deepspeed otherwise: expert gradients scaled
// by 1/tp), and whether the layer's norm and router see only this peer's tokens (s1: their
// gradients summed over tp instead of averaged).
bool ExpertRowsDuplicated(Schedule s, bool sliced = false);
bool GateOnTokenSlice(Schedule s);

}  // namespace furnace::moe
