// The flat parameter layout of GptMoe (or of the shard of it one rank holds): MODEL.md names and
// [in, out] shapes, one offset per parameter into the flat fp32 parameter and gradient arrays. The
// experts of one MoE layer are laid out so that all their w1 form one [E, d, f] block, then b1
// [E, f], w2 [E, f, d], b2 [E, d]: the grouped GEMM reads them in place. On a shard, E is the
// local expert count, f the local hidden width, and the tensor-parallel blocks have their local
// shapes; each ParamInfo says which part of the global tensor it is (ParamInfo::shard).
#pragma once

#include <cstdint>
#include <vector>

#include "runtime/model/config.h"
#include "runtime/model/shard.h"
#include "runtime/trainable/param_info.h"

namespace furnace::model {

// Element offsets into the flat arrays; -1 where a layer does not have the parameter (or the
// shard does not hold the layer: `held` false).
struct LayerOffsets {
  bool held = true;
  bool moe = false;
  int64_t ln1_w = -1, ln1_b = -1, wqkv = -1, bqkv = -1, wo = -1, bo = -1, ln2_w = -1, ln2_b = -1;
  // Dense layers: mlp.w1 [d,F], mlp.b1 [F], mlp.w2 [F,d], mlp.b2 [d].
  // MoE layers: the expert blocks w1 [E,d,f], b1 [E,f], w2 [E,f,d], b2 [E,d].
  int64_t w1 = -1, b1 = -1, w2 = -1, b2 = -1;
  int64_t router = -1;  // [d, E]
};

struct ParamLayout {
  std::vector<train::ParamInfo> params;  // in offset order
  int64_t total = 0;
  int64_t wte = -1, wpe = -1, lnf_w = -1, lnf_b = -1;
  std::vector<LayerOffsets> layers;  // every layer of the model; held only on the shard's stage
};

// `config` must be valid and `shard` must fit it (runtime/topology validates both).
ParamLayout BuildParamLayout(const ModelConfig& config, const ModelShard& shard = {});

}  // namespace furnace::model
