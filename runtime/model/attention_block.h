// The attention half of a transformer layer (MODEL.md Forward 2, first bullet):
//   a = LN1(x); qkv = a @ Wqkv + bqkv; y = causal attention(qkv); x_out = x + y @ Wo + bo.
// Tensor parallelism (dims.tp > 1): this rank holds NH/tp heads (its column blocks of q, k and v
// in Wqkv) and the matching rows of Wo; the partial projections are summed over ctx.groups.tp
// before bo and the residual are added, and backward sums the LN1 input gradient over the group.
#pragma once

#include "absl/status/statusor.h"
#include "runtime/model/module.h"
#include "runtime/model/param_layout.h"

namespace furnace::model {

struct AttentionSaved {
  StashHandle ln_out;   // (B, T, C)
  StashHandle ln_mean;  // (B, T)
  StashHandle ln_rstd;  // (B, T)
  StashHandle qkv;      // (B, T, 3C)
  StashHandle att;      // (B, NH, T, T) softmax probabilities, or (B, NH, T, 2) row statistics
                        // under dims.recompute_probs (kernels/attention.h RowStats)
  StashHandle y;        // (B, T, C) attention output before the projection
  StashHandle out;      // (B, T, C) residual stream after the block
};

// x_in: the residual stream entering the layer (saved by the module before).
absl::StatusOr<AttentionSaved> AttentionBlockForward(ModuleContext& ctx, const Dims& dims,
                                                     int layer, const LayerOffsets& off,
                                                     const float* params, StashHandle x_in);
// dres (B, T, C): on entry d loss / d out; on return d loss / d x_in (accumulated in place).
absl::Status AttentionBlockBackward(ModuleContext& ctx, const Dims& dims, const LayerOffsets& off,
                                    const float* params, float* grads, const AttentionSaved& saved,
                                    StashHandle x_in, float* dres);

// Its declared bytes: declared_bytes.h (they mirror the allocation order here).

}  // namespace furnace::model
