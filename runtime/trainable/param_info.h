// ParamInfo: how one parameter lies in a model's flat parameter and gradient arrays, and which
// part of the global tensor a rank holds under a parallel layout. The model writes these, the
// training loop, checkpoints and exports read them; they sit below all of them (runtime/model,
// runtime/checkpoint, runtime/train) so that none has to include another for them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace furnace::train {

// "[4, 8]": a tensor shape in error messages.
inline std::string ShapeText(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

// The part of a parameter one rank holds when a parallel layout splits it (tensor parallelism
// splits columns or rows, expert sharding splits the expert's hidden width): along dimension `dim`
// of the global tensor, the index ranges `ranges` concatenated in order. Every other dimension is
// whole. An empty global_shape means the rank holds the whole tensor.
struct ParamShard {
  std::vector<int64_t> global_shape;
  int dim = 0;
  std::vector<std::pair<int64_t, int64_t>> ranges;  // [begin, end) along dim
  bool sharded() const { return !global_shape.empty(); }
};

// Which group sums a parameter's gradient after the micro-batches (the data-parallel replicas of
// it): the data-parallel group for the dense part, the expert-data-parallel group for experts.
enum class GradSync { kData, kExpertData };

struct ParamInfo {
  std::string name;            // MODEL.md names: "wte", "layers.0.attn.wqkv", ...
  std::vector<int64_t> shape;  // MODEL.md layout ([in, out] for matrices); local when sharded
  int64_t offset = 0;          // element offset into the flat arrays
  bool weight_decay = false;   // every 2-D parameter (MODEL.md, AdamW)
  ParamShard shard = {};       // parallel layouts only
  GradSync sync = GradSync::kData;
  // This rank's copy is the one counted in the global gradient norm (each element of the model
  // is counted exactly once over all ranks; replicas are not).
  bool norm_owner = true;
  // Tensor parallelism: this rank's gradient covers only its share of the work its tp peers
  // split (an MoE layer's experts under the s1 / s2 schedules and under deepspeed with sliced
  // experts, the router under s1; runtime/moe/schedule.h): summed over the tp group as it is,
  // where otherwise an expert gradient is scaled by 1 / tp (every peer sent every row and the
  // shards gathered them) and a replicated one averaged.
  bool tp_partial = false;
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
  // Element index in the whole (global) tensor of local element `i`.
  int64_t GlobalIndex(int64_t i) const;
  // The inverse: the local element holding element `g` of the whole tensor, or -1 when this
  // rank's part does not hold it.
  int64_t LocalIndex(int64_t g) const;
};

inline int64_t ParamInfo::GlobalIndex(int64_t i) const {
  if (!shard.sharded()) return i;
  // Split i into (outer, coordinate along dim, inner) with the local shape, map the coordinate
  // through the ranges, and recompose with the global shape.
  int64_t inner = 1;
  for (size_t d = shard.dim + 1; d < shape.size(); ++d) inner *= shape[d];
  const int64_t local_dim = shape[shard.dim];
  const int64_t in = i % inner;
  const int64_t coord = (i / inner) % local_dim;
  const int64_t outer = i / (inner * local_dim);
  int64_t global_coord = coord;
  int64_t seen = 0;
  for (const auto& [begin, end] : shard.ranges) {
    if (coord < seen + (end - begin)) {
      global_coord = begin + (coord - seen);
      break;
    }
    seen += end - begin;
  }
  return (outer * shard.global_shape[shard.dim] + global_coord) * inner + in;
}

inline int64_t ParamInfo::LocalIndex(int64_t g) const {
  if (!shard.sharded()) return g;
  int64_t inner = 1;
  for (size_t d = shard.dim + 1; d < shape.size(); ++d) inner *= shape[d];
  const int64_t global_dim = shard.global_shape[shard.dim];
  const int64_t in = g % inner;
  const int64_t coord = (g / inner) % global_dim;
  const int64_t outer = g / (inner * global_dim);
  int64_t seen = 0;
  for (const auto& [begin, end] : shard.ranges) {
    if (coord >= begin && coord < end) {
      return (outer * shape[shard.dim] + seen + (coord - begin)) * inner + in;
    }
    seen += end - begin;
  }
  return -1;
}

}  // namespace furnace::train
