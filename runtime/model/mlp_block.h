// The dense FFN half of a non-MoE layer: u = LN2(x); x_out = x + GELU(u @ W1 + b1) @ W2 + b2.
// Tensor parallelism (dims.tp > 1): F is this rank's block of the hidden width (dense_ffn / tp);
// W1 is column-parallel, W2 row-parallel, its partial products summed over ctx.groups.tp before
// b2 and the residual are added; backward sums the input gradient over the group.
#pragma once

#include "absl/status/statusor.h"
#include "runtime/model/module.h"
#include "runtime/model/param_layout.h"

namespace furnace::model {

struct MlpSaved {
  StashHandle ln_out;   // (B, T, C)
  StashHandle ln_mean;  // (B, T)
  StashHandle ln_rstd;  // (B, T)
  StashHandle pre;      // (B, T, F) u @ W1 + b1
  StashHandle hidden;   // (B, T, F) GELU(pre)
  StashHandle out;      // (B, T, C) residual stream after the layer
};

absl::StatusOr<MlpSaved> MlpBlockForward(ModuleContext& ctx, const Dims& dims, int F, int layer,
                                         const LayerOffsets& off, const float* params,
                                         StashHandle x_in);
// dres: d loss / d out on entry, d loss / d x_in on return.
absl::Status MlpBlockBackward(ModuleContext& ctx, const Dims& dims, int F, const LayerOffsets& off,
                              const float* params, float* grads, const MlpSaved& saved,
                              StashHandle x_in, float* dres);

// Its declared bytes: declared_bytes.h (they mirror the allocation order here).

}  // namespace furnace::model
