// ParallelRuntime: what the training loop needs to run one rank of a parallel layout: its place
// (pipeline stage, data-parallel rank, tensor-parallel rank) and the groups it synchronises with
// after the micro-batches. The model talks to its own groups (TP, EP, ESP) inside its modules; the
// loop talks to these. Borrowed pointers; a nullptr group is a group of one. Every group takes
// buffers of the model's device (Trainable::device(): comm::ForDevice over a host transport on a
// discrete device), as the loop hands it device memory (gradient buckets, pipeline activations)
// and host memory only for its small agreements (norms, statistics, records).
//
// Step (Trainer with a ParallelRuntime):
//   1. the 1F1B schedule of this stage (runtime/pipeline), activations and their gradients sent
//      to the next / previous stage over `pipeline` (group rank == stage), buffered sends;
//   2. expert gradients scaled by 1 / tp where the `deepspeed` schedule gathers its ESP group's
//      rows (every token sent once per tensor-parallel peer, so each expert saw it tp times; not
//      with sliced experts, ParamInfo::tp_partial), then summed over `expert_data`;
//      the gradients of what tensor parallelism replicates (norms, biases added after a
//      row-parallel sum, the router, the embeddings) averaged over `tensor`: equal in exact
//      arithmetic, they differ in the last bits once tokens take different paths through the
//      experts on each peer, and the replicas must stay bit-identical; dense gradients summed
//      over `data` in buckets of bucket_bytes; the tied wte's two copies (first and last stage)
//      summed over `embedding`;
//   3. the global gradient norm: each rank's owned elements (ParamInfo::norm_owner), summed over
//      `world`, so every element of the model counts exactly once;
//   4. AdamW on every local parameter (replicas stay identical: same gradients, same update);
//   5. loss, aux loss and tokens per expert summed over `world` from the ranks that own them, so
//      every rank reports the same global numbers.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/comm/communicator.h"

namespace furnace::train {

// A group this rank belongs to and its role: "world" or a topology::GroupKindName ("tp", ...).
struct RankGroup {
  std::string kind;
  comm::Communicator* comm = nullptr;
};

struct ParallelRuntime {
  int world = 1, world_rank = 0;
  int stages = 1, stage = 0;
  int dp = 1, dp_rank = 0;
  int tp = 1, tp_rank = 0;
  comm::Communicator* world_group = nullptr;
  comm::Communicator* tensor = nullptr;
  comm::Communicator* data = nullptr;
  comm::Communicator* expert_data = nullptr;
  comm::Communicator* pipeline = nullptr;
  comm::Communicator* embedding = nullptr;
  // Every group this rank uses, the model's included: their counters feed the telemetry.
  std::vector<RankGroup> all_groups;
  int64_t bucket_bytes = int64_t{4} << 20;

  bool first_stage() const { return stage == 0; }
  bool last_stage() const { return stage == stages - 1; }
};

}  // namespace furnace::train
