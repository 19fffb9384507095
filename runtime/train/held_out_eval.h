// Held-out evaluation (eval.every, eval.batches): the mean token cross-entropy of the model over
// the same `batches` held-out micro-batches, whatever the parallel layout, forward only.
//
// Held-out micro-batch i is the held-out sampler's Sample(0, 0, i) (B sequences of T tokens).
// With a parallel layout the data-parallel ranks share the work: in round r, data-parallel rank d
// evaluates batch r * dp + d through the pipeline stages (activations sent stage to stage as in a
// training step); where r * dp + d >= batches it evaluates batch 0 again and its loss is not
// counted, so every rank runs the same number of forwards (the expert all-to-all and the tensor
// all-reduces need every peer). Each batch's loss comes from one rank (the last stage, tensor
// rank 0, its data-parallel rank) and every rank sums them in batch order in double precision, so
// the result is the same on every rank and does not depend on dp. Nothing is saved for backward,
// no gradient or optimizer state is touched and no routing spike is injected: a run with
// evaluation trains exactly as one without.
#pragma once

#include <cstdint>

#include "absl/status/statusor.h"
#include "runtime/base/clock.h"
#include "runtime/data/sampler.h"
#include "runtime/train/parallel.h"
#include "runtime/trainable/trainable.h"

namespace furnace::train {

struct EvalConfig {
  int64_t every = 0;  // steps between evaluations; 0: off
  int batches = 0;    // held-out micro-batches per evaluation
};

struct EvalResult {
  double loss = 0;        // mean token cross-entropy over the batches, nats
  double perplexity = 0;  // exp(loss)
  int batches = 0;
  int64_t tokens = 0;  // batches * B * T
  double seconds = 0;  // wall time on this rank
};

// Whether an evaluation runs once `steps_done` of `total_steps` steps are done: every `every`
// steps and after the last step (never when every is 0).
bool EvalDue(const EvalConfig& config, int64_t steps_done, int64_t total_steps);

// One evaluation. Without `parallel`, `model` runs each batch whole (Trainable::Evaluate); with
// it, `model` must be a PipelineStage of that layout and every rank of the world must call this
// together. InvalidArgument for batches < 1 or a held-out sampler whose seq_len is not the
// model's; the model's and the collectives' errors otherwise.
absl::StatusOr<EvalResult> EvaluateHeldOut(Trainable& model, const data::Sampler& held_out,
                                           int batches, const ParallelRuntime* parallel,
                                           const Clock& clock);

}  // namespace furnace::train
