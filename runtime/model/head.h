// The head (MODEL.md Forward 3 and "Loss"): y = LNf(x); logits = y @ wte^T (tied); per-token
// cross-entropy. The forward needs wte^T as a (C, V) GEMM operand, built in arena scratch; the
// backward needs no transpose: dy = dlogits @ wte and dwte += dlogits^T @ y are plain GEMMs.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/model/module.h"

namespace furnace::model {

struct HeadSaved {
  StashHandle targets;  // (B, T) int32
  StashHandle ln_out;   // (B, T, C)
  StashHandle ln_mean;  // (B, T)
  StashHandle ln_rstd;  // (B, T)
  StashHandle probs;    // (B, T, V) softmax of the logits
  double ce_sum = 0;    // sum of the token cross-entropies
};

// logits_out: when not null, receives a host copy of the logits (B, T, V).
absl::StatusOr<HeadSaved> HeadForward(ModuleContext& ctx, const Dims& dims, int V, const float* wte,
                                      const float* lnf_w, const float* lnf_b, StashHandle x_in,
                                      const int32_t* targets, std::vector<float>* logits_out);
// dres (B, T, C) must be zero on entry; on return it holds d loss / d x_in.
absl::Status HeadBackward(ModuleContext& ctx, const Dims& dims, int V, const float* wte,
                          const float* lnf_w, float* dwte, float* dlnf_w, float* dlnf_b,
                          const HeadSaved& saved, StashHandle x_in, double ce_scale, float* dres);

// Its declared bytes: declared_bytes.h (they mirror the allocation order here).

}  // namespace furnace::model
