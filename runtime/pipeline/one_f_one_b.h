// The 1F1B pipeline schedule (PipeDream-Flush / Megatron's non-interleaved schedule) as a pure
// function: the order in which stage `stage` of `stages` runs the forward and backward passes of
// `m` micro-batches in one step.
//
//   warm-up:  min(stages - stage - 1, m) forwards;
//   steady:   (forward, backward) pairs until every forward is issued;
//   cool-down: the remaining backwards.
// Backwards run in micro-batch order, so at most min(stages - stage, m) micro-batches hold
// activations at once on stage `stage` (MaxInFlight): the memory planner's budget depends on it.
// With that order, blocking receives and buffered sends never deadlock: every receive waits on a
// send the peer issues without first waiting on this rank.
#pragma once

#include <vector>

namespace furnace::pipeline {

struct PipelineOp {
  enum Kind { kForward, kBackward };
  Kind kind;
  int micro;
  bool operator==(const PipelineOp&) const = default;
};

std::vector<PipelineOp> OneFOneB(int stage, int stages, int micro_batches);

// min(stages - stage, micro_batches).
int MaxInFlight(int stage, int stages, int micro_batches);

}  // namespace furnace::pipeline
