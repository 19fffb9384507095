// Trainable: what the training loop needs of a model. runtime/model's GptMoe implements it; tests
// of the loop use small models that implement it too.
//
// Parameters and their gradients are each one flat fp32 array, parameter i occupying
// [params()[i].offset, + numel) in both, so the optimizer, clipping, checkpoints and exports work
// on whole arrays. ForwardBackward ACCUMULATES into the gradient array (gradient accumulation over
// micro-batches); the loop calls ZeroGrad once per step.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace furnace::train {

struct ParamInfo {
  std::string name;             // MODEL.md names: "wte", "layers.0.attn.wqkv", ...
  std::vector<int64_t> shape;   // MODEL.md layout ([in, out] for matrices)
  int64_t offset = 0;           // element offset into the flat arrays
  bool weight_decay = false;    // every 2-D parameter (MODEL.md, AdamW)
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
};

struct MicroBatchResult {
  double loss = 0;      // mean token cross-entropy of this micro-batch
  double aux_loss = 0;  // sum over MoE layers of aux (MODEL.md)
  // tokens_per_expert[moe_layer][e]: routed assignments (before capacity dropping).
  std::vector<std::vector<int64_t>> tokens_per_expert;
  int64_t dropped = 0;                  // assignments dropped by capacity
  int64_t activation_peak_bytes = 0;    // arena peak during this micro-batch
};

class Trainable {
 public:
  virtual ~Trainable() = default;
  virtual const std::vector<ParamInfo>& params() const = 0;
  virtual int64_t num_params() const = 0;
  virtual float* param_data() = 0;
  virtual float* grad_data() = 0;
  virtual void ZeroGrad() = 0;
  // inputs, targets: (B, T) token ids. Gradients accumulated: d(ce_scale * sum of token
  // cross-entropies + aux_scale * aux_loss) / d params. The loop passes ce_scale =
  // 1 / tokens_in_global_batch and aux_scale = 1 / micro_batches (MODEL.md "Loss and step").
  virtual absl::StatusOr<MicroBatchResult> ForwardBackward(const int32_t* inputs,
                                                           const int32_t* targets, int B,
                                                           double ce_scale, double aux_scale) = 0;
  // Forward only (evaluation): mean cross-entropy and aux of the batch.
  virtual absl::StatusOr<MicroBatchResult> Evaluate(const int32_t* inputs, const int32_t* targets,
                                                    int B) = 0;
  virtual int seq_len() const = 0;
  virtual int vocab() const = 0;
  // Model FLOPs per token of a training step (MODEL.md "FLOPs and MFU").
  virtual double FlopsPerToken() const = 0;
};

}  // namespace furnace::train
