// One rank's MoE layer for bench_parm and the two-node test: the layer's parameters on this rank
// (LN, router, the E/ep experts' f/esp hidden columns), a fixed input and a fixed output gradient,
// and Run: MoeBlockForward + MoeBlockBackward (what GptMoe runs for each MoE layer) under a given
// schedule, timed. Every schedule computes the same outputs and gradients (moe_block.h), so one
// RankLayer serves all three, rep by rep.
//
// Replication: the input and the output gradient depend only on the rank's data-parallel index
// (tp peers hold the same tokens, as after attention's all-reduce); the router depends only on the
// seed; expert e's shard on ESP peer q only on (seed, e, q). So a layout's ranks hold one layer.
//
// Ownership: RankLayer owns its device, arena, stash and buffers; the communicators are borrowed
// and must outlive it. Thread-safety: one thread. Errors: InvalidArgument for a shape the layout
// cannot hold (ep | E, esp | f, tp | B*T); the block's errors otherwise.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/model/module.h"
#include "runtime/model/shard.h"
#include "runtime/moe/executor.h"
#include "runtime/moe/schedule.h"

namespace furnace::bench {

struct LayerConfig {
  int B = 1, T = 256;  // tokens per rank N = B * T
  int C = 64, f = 128, E = 8, k = 2;
  uint64_t seed = 1;
};

struct LayerTimes {
  double fwd_s = 0, bwd_s = 0;
};

// What one run produced on this rank, for equality checks.
struct LayerOutputs {
  std::vector<float> out;    // (N, C) the layer's output (residual stream)
  std::vector<float> dx;     // (N, C) d loss / d x
  std::vector<float> grads;  // this rank's parameter gradients (accumulated from zero)
};

class RankLayer {
 public:
  static absl::StatusOr<std::unique_ptr<RankLayer>> Create(const LayerConfig& config,
                                                           const model::ModelShard& shard,
                                                           const model::ParallelGroups& groups);
  ~RankLayer();

  // One forward and backward under `schedule`. counters: nullptr or the op counters to add to.
  // outputs: nullptr, or filled with this run's output, input gradient and gradients.
  absl::StatusOr<LayerTimes> Run(moe::Schedule schedule, moe::ExchangeCounters* counters,
                                 LayerOutputs* outputs);

 private:
  struct State;
  explicit RankLayer(std::unique_ptr<State> state);
  std::unique_ptr<State> s_;
};

}  // namespace furnace::bench
