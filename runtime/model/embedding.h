// Token + position embedding (MODEL.md Forward 1): x = wte[tokens] + wpe[0..T).
#pragma once

#include <cstdint>

#include "absl/status/statusor.h"
#include "runtime/model/module.h"

namespace furnace::model {

struct EmbeddingSaved {
  StashHandle tokens;  // (B, T) int32, a copy of the inputs
  StashHandle out;     // (B, T, C) the residual stream entering layer 0
};

absl::StatusOr<EmbeddingSaved> EmbeddingForward(ModuleContext& ctx, const Dims& dims,
                                                const int32_t* tokens,  // (B, T) host
                                                const float* wte,       // (V, C)
                                                const float* wpe);      // (T, C)
// dres (B, T, C): gradient of the residual stream leaving the embedding.
absl::Status EmbeddingBackward(ModuleContext& ctx, const Dims& dims, const EmbeddingSaved& saved,
                               const float* dres, float* dwte, float* dwpe);

// Its declared bytes: declared_bytes.h (they mirror the allocation order here).

}  // namespace furnace::model
