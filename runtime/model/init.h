// Seeded, layout-independent initialisation (MODEL.md "Initialisation"). Element i of parameter
// `name` is a pure function of (seed, name, i): a splitmix64 counter keyed by hash(seed, name)
// feeds one Box-Muller draw per element, so a shard of a parameter computes exactly the values the
// single-process model holds, whatever else the model contains.
#pragma once

#include <cstdint>
#include <string>

#include "runtime/trainable/param_info.h"

namespace furnace::model {

enum class InitKind { kNormal, kZeros, kOnes };

struct InitRule {
  InitKind kind = InitKind::kNormal;
  double std = 0;  // kNormal only
};

// Normal(0, 0.02) for weight matrices and embeddings; attn.wo and every w2: 0.02 / sqrt(2L);
// biases 0; LayerNorm weight 1, bias 0.
InitRule InitRuleFor(const std::string& name, int layers);

// A standard-normal draw for element `index` of parameter `name`.
double StandardNormal(uint64_t seed, const std::string& name, int64_t index);

// Fills the param.numel() elements this rank holds of `param` into out: local element i gets the
// value of element param.GlobalIndex(i) of the whole tensor (a shard holds exactly what the whole
// model holds at those indices).
void InitParameter(uint64_t seed, const train::ParamInfo& param, int layers, float* out);
// Elements [begin, end) of the same (out points at element 0 of the parameter): a pure function of
// each element's global index, so ranges filled on several threads give InitParameter's values.
void InitParameterRange(uint64_t seed, const train::ParamInfo& param, int layers, float* out,
                        int64_t begin, int64_t end);

}  // namespace furnace::model
