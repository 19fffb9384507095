#include "runtime/train/held_out_eval.h"

#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "runtime/base/status.h"
#include "runtime/tensor/device_memory.h"

namespace furnace::train {
namespace {

// Pipeline tags of the evaluation's activations: above the training step's (trainer_parallel.cc:
// activations j, gradients 2^20 + j), one per round.
constexpr uint32_t kEvalTag = 1u << 21;

// Each batch's loss (0 where this rank does not own it) from every rank, summed per batch: one
// rank owns each batch, so the sums are exact.
absl::StatusOr<std::vector<double>> GatherLosses(comm::Communicator* world,
                                                 const std::vector<double>& mine) {
  if (world == nullptr || world->size() == 1) return mine;
  const int64_t n = static_cast<int64_t>(mine.size());
  std::vector<double> all(static_cast<size_t>(n) * world->size());
  RETURN_IF_ERROR(world->AllGather(mine.data(), all.data(), n * sizeof(double)));
  std::vector<double> sum(mine.size(), 0.0);
  for (int r = 0; r < world->size(); ++r) {
    for (int64_t i = 0; i < n; ++i) sum[i] += all[r * n + i];
  }
  return sum;
}

absl::StatusOr<std::vector<double>> LossesParallel(PipelineStage& stage,
                                                   const data::Sampler& held_out, int batches,
                                                   const ParallelRuntime& P) {
  const int B = held_out.config().batch;
  const int64_t act = stage.ActivationFloats(B);
  const int64_t act_bytes = act * static_cast<int64_t>(sizeof(float));
  // Device memory of the stage's device (the pipeline group takes device buffers).
  ASSIGN_OR_RETURN(tensor::DeviceMemory in_buffer,
                   tensor::DeviceMemory::Allocate(stage.device(), act_bytes, "eval activations"));
  ASSIGN_OR_RETURN(tensor::DeviceMemory out_buffer,
                   tensor::DeviceMemory::Allocate(stage.device(), act_bytes, "eval activations"));
  float* x_in = in_buffer.as<float>();
  float* x_out = out_buffer.as<float>();
  std::vector<double> mine(batches, 0.0);
  comm::Communicator* pipe = P.pipeline;
  const int rounds = (batches + P.dp - 1) / P.dp;
  for (int r = 0; r < rounds; ++r) {
    const int i = r * P.dp + P.dp_rank;
    const bool counted = i < batches;
    data::Batch batch;
    if (P.first_stage() || P.last_stage()) {
      ASSIGN_OR_RETURN(batch, held_out.Sample(0, 0, counted ? i : 0));
    }
    if (!P.first_stage()) {
      RETURN_IF_ERROR(pipe->Recv(x_in, act_bytes, P.stage - 1, kEvalTag + r));
    }
    ASSIGN_OR_RETURN(
        const MicroBatchResult result,
        stage.StageEvaluate(batch.inputs.data(), batch.targets.data(), x_in, B, x_out));
    if (!P.last_stage()) {
      // Each round's send is waited for before the next: an evaluation has no traffic back (no
      // backward's Recv) to post a queued send, so NCCL's (nccl_communicator.cc: posted with the
      // next Recv or WaitSends) would wait for the evaluation's end, one device copy of the
      // activations held per round, and the next stage wait out its collective timeout.
      RETURN_IF_ERROR(pipe->Send(x_out, act_bytes, P.stage + 1, kEvalTag + r));
      RETURN_IF_ERROR(pipe->WaitSends());
    }
    if (counted && P.last_stage() && P.tp_rank == 0) mine[i] = result.loss;
  }
  return GatherLosses(P.world_group, mine);
}

}  // namespace

bool EvalDue(const EvalConfig& config, int64_t steps_done, int64_t total_steps) {
  if (config.every <= 0 || steps_done <= 0) return false;
  return steps_done % config.every == 0 || steps_done == total_steps;
}

absl::StatusOr<EvalResult> EvaluateHeldOut(Trainable& model, const data::Sampler& held_out,
                                           int batches, const ParallelRuntime* parallel,
                                           const Clock& clock) {
  if (batches < 1) {
    return absl::InvalidArgumentError(absl::StrCat("eval.batches ", batches, " must be >= 1"));
  }
  const data::SamplerConfig& sc = held_out.config();
  if (sc.seq_len != model.seq_len()) {
    return absl::InvalidArgumentError(
        absl::StrCat("held-out data seq_len ", sc.seq_len, " != model seq_len ", model.seq_len()));
  }
  const double t0 = clock.MonotonicSeconds();
  std::vector<double> losses;
  if (parallel == nullptr) {
    // No step context: held-out batches get no routing spike (the next training step sets its
    // own context before its first micro-batch).
    model.SetStepContext(-1, 0);
    for (int i = 0; i < batches; ++i) {
      ASSIGN_OR_RETURN(const data::Batch batch, held_out.Sample(0, 0, i));
      ASSIGN_OR_RETURN(const MicroBatchResult r,
                       model.Evaluate(batch.inputs.data(), batch.targets.data(), batch.B));
      losses.push_back(r.loss);
    }
  } else {
    auto* stage = dynamic_cast<PipelineStage*>(&model);
    if (stage == nullptr) {
      return absl::InvalidArgumentError("evaluation on a parallel layout needs a PipelineStage");
    }
    ASSIGN_OR_RETURN(losses, LossesParallel(*stage, held_out, batches, *parallel));
  }
  EvalResult result;
  for (double l : losses) result.loss += l;
  result.loss /= batches;
  result.perplexity = std::exp(result.loss);
  result.batches = batches;
  result.tokens = int64_t{batches} * sc.batch * sc.seq_len;
  result.seconds = clock.MonotonicSeconds() - t0;
  return result;
}

}  // namespace furnace::train
