// Topology: the parallel layout of a job and the rank groups derived from it (DESIGN.md "Parallel
// layout"). A pure function of the sizes and two order strings; nothing here talks to a network.
//
// Dense part: world = pp * dp * tp ranks. `order` lists the three dimensions from the fastest
// varying to the slowest ("tp-dp-pp", the default, puts the ranks of one TP group next to each
// other, then DP, then pipeline stages), so rank = sum coord[i] * stride[i] in that order.
//
// MoE part: inside each pipeline stage the dp * tp ranks of that stage, numbered by their in-stage
// index (the rank with its pp coordinate removed, same order), are regrouped as edp * ep * esp
// (ep * esp must divide dp * tp; edp = dp * tp / (ep * esp)). `moe_order` lists esp, ep, edp from
// fastest to slowest ("esp-ep-edp", the default: with esp == tp, and tp the fastest of the dense
// dimensions in the stage as in "tp-dp-pp", the ESP group is the TP group; with dp faster than tp,
// it is not).
//
// Groups (each a list of global ranks in group-rank order; every rank belongs to exactly one group
// of each kind):
//   kTensor: same pp, dp;   kData: same pp, tp;   kPipeline: same dp, tp (stage order);
//   kExpert: same stage, edp, esp (ep order);   kExpertShard: same stage, edp, ep (esp order);
//   kExpertData: same stage, ep, esp (edp order);
//   kEmbedding: the first and last stage of the same dp, tp (the tied wte lives on both); with
//   pp == 1, and on a middle stage (which holds no embedding), it is the rank alone.
//
// Thread-safety: immutable after Create. Errors: InvalidArgument naming the field, its value and
// what is allowed.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace furnace::topology {

struct ParallelSizes {
  int pp = 1, dp = 1, tp = 1;
  int ep = 1, esp = 1;
  std::string order = "tp-dp-pp";
  std::string moe_order = "esp-ep-edp";
  int world() const { return pp * dp * tp; }
};

// What the layout must fit (MODEL.md names). Zero fields are not checked.
struct ModelDims {
  int heads = 0, d_model = 0, layers = 0, experts = 0, expert_ffn = 0, dense_ffn = 0;
};

enum class GroupKind { kTensor, kData, kPipeline, kExpert, kExpertShard, kExpertData, kEmbedding };
const char* GroupKindName(GroupKind kind);  // "tp", "dp", "pp", "ep", "esp", "edp", "embedding"

struct Coords {
  int pp = 0, dp = 0, tp = 0;
  int edp = 0, ep = 0, esp = 0;
};

class Topology {
 public:
  // Validates sizes (>= 1), the order strings (a permutation of the names), ep * esp | dp * tp,
  // and, for each non-zero field of `dims`: tp | heads, tp | d_model, pp <= layers, ep | experts,
  // esp | expert_ffn, tp | dense_ffn. world_size: the ranks the job has (must equal pp * dp * tp).
  static absl::StatusOr<Topology> Create(const ParallelSizes& sizes, int world_size,
                                         const ModelDims& dims = {});

  const ParallelSizes& sizes() const { return sizes_; }
  int world_size() const { return sizes_.world(); }
  int edp() const { return sizes_.dp * sizes_.tp / (sizes_.ep * sizes_.esp); }

  // Arguments must lie in range (rank in [0, world_size()), each coordinate below its size).
  Coords CoordsOf(int rank) const;
  int RankOf(int pp, int dp, int tp) const;
  // The members of `rank`'s group of `kind`, in group-rank order; `rank` is among them.
  std::vector<int> Group(GroupKind kind, int rank) const;
  // Every group of `kind` (each once), ordered by their first member.
  std::vector<std::vector<int>> AllGroups(GroupKind kind) const;

  // Whether every rank's ESP group is its TP group (the same ranks; DeepSpeed-MoE's expert tensor
  // parallelism): ESP peers then hold the same tokens, and under the deepspeed schedule receive the
  // same rows, so an expert can be sliced the Megatron way (runtime/moe/schedule.h).
  bool EspGroupIsTpGroup() const;

  // Layers [first, last) of pipeline stage `stage` of a model with `layers` layers: an even split,
  // the first (layers % pp) stages taking one more.
  static std::pair<int, int> StageLayers(int stage, int pp, int layers);

 private:
  Topology() = default;
  int RankOfExpert(int pp, int edp, int ep, int esp) const;
  ParallelSizes sizes_;
  // Strides of pp, dp, tp in the dense rank; of edp, ep, esp in the in-stage index.
  int stride_pp_ = 0, stride_dp_ = 0, stride_tp_ = 0;
  int stride_edp_ = 0, stride_ep_ = 0, stride_esp_ = 0;
};

}  // namespace furnace::topology
