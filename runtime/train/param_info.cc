#include <cstddef>

#include "runtime/train/trainable.h"

namespace furnace::train {

int64_t ParamInfo::GlobalIndex(int64_t i) const {
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

}  // namespace furnace::train
