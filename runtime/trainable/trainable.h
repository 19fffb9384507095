// Trainable: what the training loop needs of a model. runtime/model's GptMoe implements it; tests
// of the loop use small models that implement it too. It lives in runtime/trainable, below both
// runtime/model and runtime/train, so the model implements it without including the loop.
//
// Parameters and their gradients are each one flat fp32 array, parameter i occupying
// [params()[i].offset, + numel) in both, so the optimizer, clipping, checkpoints and exports work
// on whole arrays. ForwardBackward ACCUMULATES into the gradient array (gradient accumulation over
// micro-batches); the loop calls ZeroGrad once per step.
//
// Memory and streams (the contract between model and loop on any device): param_data() and
// grad_data(), and the activation buffers of StageForward / StageBackward (x_in, x_out, dx_out,
// dx_in), are memory of device() (on the CPU device that is host memory; on a discrete device the
// host may not dereference them and moves bytes only through device()'s Copy). Token ids
// (inputs, targets) are host memory. The model enqueues its work on the calling thread's current
// stream (runtime/device/current_stream.h; none: the device's default stream), and so does the
// loop, so the loop's optimizer, reductions and copies are ordered after the model's kernels on
// that one stream without an event. When a call returns, its outputs are complete in the order of
// that stream (not necessarily on the host): the returned results (losses, counts) are host
// values the model has synchronised for.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/trainable/param_info.h"

namespace furnace::device {
class Device;
}  // namespace furnace::device

namespace furnace::train {

struct MicroBatchResult {
  double loss = 0;      // mean token cross-entropy of this micro-batch
  double aux_loss = 0;  // sum over MoE layers of aux (MODEL.md)
  // tokens_per_expert[moe_layer][e]: routed assignments (before capacity dropping).
  std::vector<std::vector<int64_t>> tokens_per_expert;
  int64_t dropped = 0;                // assignments dropped by capacity
  int64_t activation_peak_bytes = 0;  // arena peak during this micro-batch
  // What the model's memory model predicted for it (0: the model has none).
  int64_t predicted_peak_bytes = 0;
  // A routing-spike step (runtime/model/spikes.h): each MoE layer pushed tokens onto one expert.
  bool routing_spike = false;
};

// What a model's memory policy did with saved activations, as running totals since the model was
// made (the loop reports a step's difference). recomputed = fp32 bytes rebuilt after a drop,
// offloaded = bytes sent to the host (each comes back once; an encoding at its own size),
// compressed = fp32 bytes stored in reduced precision.
struct MemoryActionTotals {
  uint64_t recomputed_bytes = 0;
  uint64_t offloaded_bytes = 0;
  uint64_t compressed_bytes = 0;
  int64_t late_reloads = 0;  // reloads that had not landed when backward needed them
  // The adaptive planner (memory.policy adaptive).
  double planner_seconds = 0;      // projecting and planning
  int64_t planner_decisions = 0;   // MoE layers where it acted
  int64_t emergency_offloads = 0;  // allocations it rescued after the arena refused them
  int64_t agreements = 0;          // times the ranks agreed on collective drops (GptMoe)
  int64_t agreed_drops = 0;        // buffers dropped by those agreements
  double agreement_seconds = 0;    // in the agreements' all-gathers (waiting for the peers)
};

// What one op of the MoE layers' schedules (runtime/moe/schedule.h) moved on this rank: running
// totals since the model was made, per op name ("a2a(ep)", "fused(a2a ep, ag tp)", "counts(ep)").
struct MoeOpTotal {
  std::string op;
  int64_t bytes = 0, calls = 0;
  double seconds = 0;
};

class Trainable {
 public:
  virtual ~Trainable() = default;
  virtual const std::vector<ParamInfo>& params() const = 0;
  virtual int64_t num_params() const = 0;
  // The device whose memory holds the parameters, the gradients and the stage activations, and
  // which the loop's optimizer and reductions run on (see the file comment). Outlives the model.
  virtual device::Device& device() = 0;
  // num_params() floats each, memory of device().
  virtual float* param_data() = 0;
  virtual float* grad_data() = 0;
  virtual void ZeroGrad() = 0;
  // inputs, targets: (B, T) token ids. Gradients accumulated: d(ce_scale * sum of token
  // cross-entropies + aux_scale * aux_loss) / d params. The loop passes ce_scale =
  // 1 / tokens_in_global_batch and aux_scale = 1 / micro_batches (MODEL.md "Loss and step").
  virtual absl::StatusOr<MicroBatchResult> ForwardBackward(const int32_t* inputs,
                                                           const int32_t* targets, int B,
                                                           double ce_scale, double aux_scale) = 0;
  // Forward only: mean cross-entropy and aux of the batch, as the training step set by
  // SetStepContext computes them (routing spikes included: the objective ForwardBackward
  // differentiates). Held-out evaluation clears the step context first (a step < 0: none).
  virtual absl::StatusOr<MicroBatchResult> Evaluate(const int32_t* inputs, const int32_t* targets,
                                                    int B) = 0;
  virtual int seq_len() const = 0;
  virtual int vocab() const = 0;
  // Model FLOPs per token of a training step (MODEL.md "FLOPs and MFU").
  virtual double FlopsPerToken() const = 0;
  // Where the next micro-batches sit in the run: training step `step` (0-based), and sequence b of
  // the batch is sequence first_global_sequence + b of the step's global batch, the global batch
  // ordered by data-parallel rank, then micro-batch ((dp_rank * m + j) * B for micro-batch j, as
  // the loop samples it). The loop calls it before every micro-batch's ForwardBackward or
  // StageForward; it holds until the next call. A model whose forward depends on neither (all but
  // one with routing spikes, runtime/model/spikes.h) ignores it.
  // A step < 0 is no step: no spike.
  virtual void SetStepContext(int64_t /*step*/, int64_t /*first_global_sequence*/) {}
  // Running totals of the memory policy's actions (a model without one: all zero).
  virtual MemoryActionTotals MemoryActions() const { return {}; }
  // The MoE schedules' ops (none: a model without MoE exchanges) and the schedule each MoE layer
  // of the model runs ("deepspeed", "s1", "s2"), in layer order.
  virtual std::vector<MoeOpTotal> MoeOps() const { return {}; }
  virtual std::vector<std::string> MoeScheduleNames() const { return {}; }
  // A memory planner's collective drops (GptMoe "Collective drops"): whether this rank votes for
  // the ranks to agree on drops whose rebuild needs each other during the next step (GptMoe: its
  // memory ran short since the last SetAgreeCollectiveDrops), and the trainer's answer after each
  // step (whether any rank voted, from the step's world all-reduce). A model without such a
  // planner ignores both.
  virtual bool CollectiveDropVote() const { return false; }
  virtual void SetAgreeCollectiveDrops(bool /*on*/) {}
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
  // Forward only (held-out evaluation): the same inputs and outputs as StageForward, but nothing
  // stays in flight, no routing spike is injected and no memory planner acts. Only between steps
  // (FailedPrecondition while a micro-batch is in flight).
  virtual absl::StatusOr<MicroBatchResult> StageEvaluate(const int32_t* inputs,
                                                         const int32_t* targets, const float* x_in,
                                                         int B, float* x_out) = 0;
  // Drops every in-flight micro-batch (after an error: the step is given up).
  virtual void AbandonMicroBatches() = 0;
  virtual int64_t ActivationFloats(int B) const = 0;
  // The activation high-water mark since ResetActivationPeak.
  virtual void ResetActivationPeak() = 0;
  virtual int64_t ActivationPeakBytes() const = 0;
  // What the model's memory model predicts for the same span (0: none).
  virtual int64_t PredictedPeakBytes() const { return 0; }
  // The most micro-batches this stage holds at once under the schedule (1F1B: min(pp - stage,
  // m)), told before each step so that a memory planner can reserve for those not started yet.
  virtual void SetInFlightLimit(int /*micro_batches*/) {}
  // E of the MoE layers (0: none): tokens_per_expert vectors have this length where not empty.
  virtual int num_experts() const = 0;
};

}  // namespace furnace::train
