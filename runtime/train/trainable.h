// Trainable: what the training loop needs of a model. runtime/model's GptMoe implements it; tests
// of the loop use small models that implement it too.
//
// Parameters and their gradients are each one flat fp32 array, parameter i occupying
// [params()[i].offset, + numel) in both, so the optimizer, clipping, checkpoints and exports work
// on whole arrays. ForwardBackward ACCUMULATES into the gradient array (gradient accumulation over
// micro-batches); the loop calls ZeroGrad once per step.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
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
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
  // Element index in the whole (global) tensor of local element `i`.
  int64_t GlobalIndex(int64_t i) const;
};

struct MicroBatchResult {
  double loss = 0;      // mean token cross-entropy of this micro-batch
  double aux_loss = 0;  // sum over MoE layers of aux (MODEL.md)
  // tokens_per_expert[moe_layer][e]: routed assignments (before capacity dropping).
  std::vector<std::vector<int64_t>> tokens_per_expert;
  int64_t dropped = 0;                // assignments dropped by capacity
  int64_t activation_peak_bytes = 0;  // arena peak during this micro-batch
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

// A Trainable that runs as one stage of a pipeline (and one rank of any parallel layout): what
// the Trainer's parallel step needs beyond ForwardBackward. GptMoe implements it.
class PipelineStage : public Trainable {
 public:
  // StageForward takes the tokens (first stage) or the previous stage's activation x_in, and
  // writes x_out unless this is the last stage; StageBackward takes the next stage's gradient
  // dx_out (ignored on the last stage) and writes dx_in unless this is the first stage.
  // Micro-batch `micro` stays in flight between the two. Activations are ActivationFloats(B)
  // floats.
  virtual absl::StatusOr<MicroBatchResult> StageForward(int micro, const int32_t* inputs,
                                                        const int32_t* targets, const float* x_in,
                                                        int B, float* x_out) = 0;
  virtual absl::Status StageBackward(int micro, const float* dx_out, double ce_scale,
                                     double aux_scale, float* dx_in) = 0;
  // Drops every in-flight micro-batch (after an error: the step is given up).
  virtual void AbandonMicroBatches() = 0;
  virtual int64_t ActivationFloats(int B) const = 0;
  // The activation high-water mark since ResetActivationPeak.
  virtual void ResetActivationPeak() = 0;
  virtual int64_t ActivationPeakBytes() const = 0;
  // E of the MoE layers (0: none): tokens_per_expert vectors have this length where not empty.
  virtual int num_experts() const = 0;
};

}  // namespace furnace::train
