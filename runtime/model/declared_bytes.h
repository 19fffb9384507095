// Declared activation bytes: what each module of the GPT-MoE saves for backward and how far its
// forward and its backward rise in the activation arena, replayed by size in the module's own
// allocation order (module.h's contract), and their composition over the modules one rank runs.
// Pure arithmetic on the model's shape: no device, no kernels, no communicator, so `furnace plan`
// states a job's activation memory with the functions the model checks its arena against (the
// model tests compare them with DeviceArena::peak_bytes() byte for byte, and the adaptive planner
// projects with them). Each module's functions below mirror its forward and backward in its .cc
// file: a change of the allocation order there is a change here.
//
// Thread-safety: pure functions and value types.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include "runtime/memory/policy.h"
#include "runtime/model/config.h"
#include "runtime/model/shard.h"
#include "runtime/moe/schedule.h"

namespace furnace::model {

// tp: the tensor-parallel degree; attention holds NH / tp heads of width C / NH each.
// recompute_probs: ModelConfig::recompute_attention_probs (attention saves row statistics).
struct Dims {
  int B = 0, T = 0, C = 0, NH = 0, tp = 1;
  bool recompute_probs = false;
  int N() const { return B * T; }
  int local_C() const { return C / tp; }
  int local_NH() const { return NH / tp; }
};

struct MoeShape {
  int E = 0, k = 0, f = 0;
  double capacity_factor = 0;
  bool normalize = true;
  double alpha = 0;
  // The experts this rank holds (E / ep of them, each with f / esp hidden columns) and whether it
  // adds the output bias b2 (one ESP rank does: the partial outputs are summed over the group).
  int local_E = 0, local_f = 0;
  bool adds_b2 = true;
  // How the layer talks to its groups (runtime/moe/schedule.h); every schedule computes the same
  // outputs and gradients.
  moe::Schedule schedule = moe::Schedule::kDeepspeed;
  int El() const { return local_E > 0 ? local_E : E; }
  int fl() const { return local_f > 0 ? local_f : f; }
};

// The MoE layers' shape on `shard` (its local experts and expert width).
MoeShape MoeShapeOf(const ModelConfig& config, const ModelShard& shard);

// The rows of one MoE layer on this rank, what its declared bytes depend on:
//   S: the assignments kept after capacity that this rank routed (N * k when dropless);
//   R: the rows its experts process (= S on one rank; under EP / ESP what the exchange brought);
//   X: the dispatch scratch rows (moe::ExpertDispatcher::ScratchRows; 0 on one rank);
//   distributed: whether the rows cross ranks (then the routed input and the expert output are
//   scratch beside the saved buffers, moe_block.h).
//   gated: the tokens this rank gates (N, or N / tp under the s1 schedule; 0: N).
struct MoeRows {
  int64_t S = 0, R = 0, X = 0;
  bool distributed = false;
  int64_t gated = 0;
  static MoeRows SingleRank(int64_t S) { return {S, S, 0, false}; }
};

// Replays a module's allocations by size only.
class BytesTimeline {
 public:
  void Alloc(int64_t bytes) {
    current_ += bytes;
    if (current_ > peak_) peak_ = current_;
  }
  void Free(int64_t bytes) { current_ -= bytes; }
  int64_t current() const { return current_; }
  int64_t peak() const { return peak_; }

 private:
  int64_t current_ = 0;
  int64_t peak_ = 0;
};

constexpr int64_t F32Bytes(int64_t n) { return 4 * n; }
constexpr int64_t I32Bytes(int64_t n) { return 4 * n; }

// One saved tensor as its module declares it, in the order its backward acquires it: its tag
// (memory::TensorTag of its producer), its bytes, and the scratch its rebuild holds together with
// the rebuilt tensor (0 where it has no rebuild; only tags with a rebuild may be dropped).
struct SavedTensorBytes {
  std::string_view tag;
  int64_t bytes = 0;
  int64_t rebuild_scratch = 0;
};
int64_t TotalBytes(const std::vector<SavedTensorBytes>& saved);

// A module's declared bytes under a memory policy:
//   saved:         what stays in the stash after its forward (the kept tensors);
//   forward_peak:  from its entry, during its forward (drops come after it);
//   backward_peak: from its entry, during its backward: the dropped tensors rebuilt in acquire
//                  order (each with its scratch), then the backward scratch on top of them.
struct ModuleBytes {
  int64_t saved = 0, forward_peak = 0, backward_peak = 0;
};
ModuleBytes DeclareModule(const std::vector<SavedTensorBytes>& saved, int64_t forward_peak,
                          int64_t backward_scratch_peak, memory::MemoryPolicy policy);

// ---- Each module's declaration (saved tensors in acquire order; peaks from its entry) ----

// A pre-norm's saved output, mean and rstd (module.h NormForward), under the tags given (literals
// such as "ln2.out"); the output's rebuild holds a fresh mean and rstd as scratch.
std::vector<SavedTensorBytes> NormSaved(const Dims& dims, std::string_view out_tag,
                                        std::string_view mean_tag, std::string_view rstd_tag);

// embedding.cc
std::vector<SavedTensorBytes> EmbeddingSavedTensors(const Dims& dims);
int64_t EmbeddingSavedBytes(const Dims& dims);
int64_t EmbeddingForwardPeakBytes(const Dims& dims);
int64_t EmbeddingBackwardPeakBytes(const Dims& dims);

// attention_block.cc (attn.probs: its (B, NH / tp, T, T) softmax)
int64_t AttentionProbsBytes(const Dims& dims);
// attn.stats under recompute_probs: (B, NH / tp, T, 2), each query row's max and 1 / sum.
int64_t AttentionRowStatsBytes(const Dims& dims);
std::vector<SavedTensorBytes> AttentionSavedTensors(const Dims& dims);
int64_t AttentionSavedBytes(const Dims& dims);
int64_t AttentionForwardPeakBytes(const Dims& dims);
int64_t AttentionBackwardPeakBytes(const Dims& dims);

// mlp_block.cc (F: this rank's dense hidden width)
std::vector<SavedTensorBytes> MlpSavedTensors(const Dims& dims, int F);
int64_t MlpSavedBytes(const Dims& dims, int F);
int64_t MlpForwardPeakBytes(const Dims& dims, int F);
int64_t MlpBackwardPeakBytes(const Dims& dims, int F);

// moe_block.cc (MoeBlockForward and MoeBlockBackward)
std::vector<SavedTensorBytes> MoeSavedTensors(const Dims& dims, const MoeShape& m,
                                              const MoeRows& rows);
int64_t MoeSavedBytes(const Dims& dims, const MoeShape& m, const MoeRows& rows);
int64_t MoeForwardPeakBytes(const Dims& dims, const MoeShape& m, const MoeRows& rows);
int64_t MoeBackwardPeakBytes(const Dims& dims, const MoeShape& m, const MoeRows& rows);
// The forward seen from the point where the expert buffers are about to be allocated (after the
// token counts are known, where the adaptive planner decides): the bytes the block holds then
// (its norm, router and top-k tensors) and how far its forward rises above that.
struct MoeExpertPoint {
  int64_t level = 0;      // live at the point, from the block's entry
  int64_t rest_peak = 0;  // above `level`, for the rest of the forward
};
MoeExpertPoint MoeExpertPointBytes(const Dims& dims, const MoeShape& m, const MoeRows& rows);

// head.cc
std::vector<SavedTensorBytes> HeadSavedTensors(const Dims& dims, int V);
int64_t HeadSavedBytes(const Dims& dims, int V);
int64_t HeadForwardPeakBytes(const Dims& dims, int V);
int64_t HeadBackwardPeakBytes(const Dims& dims, int V);

// ---- One rank: its stage's modules ----

// The declared bytes of one micro-batch of B sequences through `shard`'s modules in forward order:
// the embedding on the first stage or the received activation elsewhere, per layer its attention
// and its MoE block (at rows[i] for the i-th MoE layer of the stage; a missing entry repeats the
// last, none given: dropless single-rank rows, S = R = N k) or dense MLP, the head on the last
// stage; what stays saved under `policy` (offload and adaptive keep everything up front).
std::vector<ModuleBytes> DeclaredModulesOf(const ModelConfig& config, const ModelShard& shard,
                                           int B, const std::vector<MoeRows>& rows,
                                           memory::MemoryPolicy policy);

// The residual-stream gradient every backward runs beside: (B, T, C) floats.
int64_t ResidualGradBytes(const ModelConfig& config, int B);

// The arena peak of one micro-batch through `modules` (forward order) on an empty arena: each
// module's forward on top of the saved tensors of those before it, then the backward in reverse
// beside the residual-stream gradient `dres`, each module releasing its saved tensors when done.
int64_t ComposePeak(const std::vector<ModuleBytes>& modules, int64_t dres);

// The least bytes one micro-batch of B needs on `shard` with its MoE layers at `rows`, whatever
// a memory policy drops or moves: the largest of its modules' forward peak and of its backward
// (all its own saved tensors back, its scratch, the residual-stream gradient), each beside the
// module's input (the module before's output).
int64_t LeastActivationBytesAt(const ModelConfig& config, const ModelShard& shard, int B,
                               const MoeRows& rows);

// How a rank's MoE layers exchange rows: the schedule of its MoE layers (tp 1: deepspeed) and
// whether the ESP group is the TP group (topology::Topology::EspGroupIsTpGroup).
struct MoeExchange {
  moe::Schedule schedule = moe::Schedule::kDeepspeed;
  bool esp_is_tp = false;
};

// The rows of each MoE layer of `shard` under balanced dropless routing (S = N k; R = S times the
// ESP width, S with sliced experts) under the exchange's schedule: s1 routes this peer's N / tp
// tokens, s2 keeps 1 / tp of the rows it routes.
MoeRows BalancedMoeRows(const ModelConfig& config, const ModelShard& shard, int B,
                        const MoeExchange& exchange);

// A floor no memory policy goes below for one micro-batch of B sequences on `shard`:
// LeastActivationBytesAt at BalancedMoeRows. A memory.device_budget below it cannot train.
int64_t MinimumActivationBytes(const ModelConfig& config, const ModelShard& shard, int B,
                               const MoeExchange& exchange);

// The rows of each MoE layer of `shard` under the routing that sends the rank the most (expert
// parallelism, tp 1; see RoutingBoundActivationBytes): with expert parallelism or sharding and
// tp 1, the most a capacity allows or, dropless, every token of every source to this rank's
// experts; without either, BalancedMoeRows (a rank's rows are at most N k); nullopt with both
// tensor parallelism and expert parallelism or sharding (not computed).
std::optional<MoeRows> WorstMoeRows(const ModelConfig& config, const ModelShard& shard, int B,
                                    const MoeExchange& exchange);

// The same floor for the most rows routing can send the rank (expert parallelism, tp 1): with a
// capacity_factor, each source rank gives each expert at most its capacity; dropless, each
// source's every token sends one row to each of its k experts that lives here (at most
// min(k, local experts) rows a token: every token routed to this rank). A budget at or above it
// leaves room for any routing. The floor itself on one rank (whose rows are at most N k);
// nullopt with tp > 1 (not computed).
std::optional<int64_t> RoutingBoundActivationBytes(const ModelConfig& config,
                                                   const ModelShard& shard, int B,
                                                   const MoeExchange& exchange);

}  // namespace furnace::model
