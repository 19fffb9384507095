// The model a train job's spec describes, as its ranks build it (worker/train_rank.cc reads the
// same fields), and what each rank of its layout holds: `furnace plan`'s memory section and
// `furnace sample`'s model. Pure arithmetic on the spec (runtime/model's furnace_model_bytes: the
// shard, the parameter layout and the declared activation bytes the model checks its arena
// against); no kernels and no device.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "furnace/v1/job.pb.h"
#include "runtime/model/config.h"
#include "runtime/moe/schedule.h"
#include "runtime/topology/topology.h"

namespace furnace::cli {

// The model of a spec's `model:` and `moe:` sections (routing spikes aside: they change no shape).
model::ModelConfig ModelConfigOf(const v1::ModelSpec& m, const v1::MoeSpec& moe);

// The activation bytes of one micro-batch (balanced dropless routing) under a static policy,
// alone and with as many micro-batches in flight as the 1F1B schedule holds on the stage, and
// those in flight under the routing that sends the rank the most (model::WorstMoeRows; nullopt
// where it is not computed: tensor parallelism with expert parallelism or sharding).
struct PolicyActivationBytes {
  std::string policy;  // none, selective, full_recompute
  int64_t one = 0;
  int64_t in_flight = 0;
  std::optional<int64_t> worst_in_flight;
};

// What every rank of one pipeline stage holds (their shards differ in which slice, not in size).
struct StageMemory {
  int stage = 0;
  int first_layer = 0, end_layer = 0;  // [first, end)
  int ranks = 0;                       // ranks of the job on this stage
  int64_t parameters = 0;              // parameters one rank of the stage holds
  // fp32 weights, gradients and the two AdamW moments (16 bytes a parameter), outside the arena.
  int64_t model_state_bytes = 0;
  int64_t bf16_mirror_bytes = 0;    // model.precision bf16: the GEMMs' bf16 copy of the weights
  int micro_batches_in_flight = 1;  // min(pp - stage, parallel.micro_batches)
  std::vector<PolicyActivationBytes> policies;
  // The least any policy needs for one micro-batch (a memory.device_budget below it is refused
  // by the ranks) and the least adaptive needs under any routing (nullopt: not computed).
  int64_t least_activation_bytes = 0;
  std::optional<int64_t> any_routing_bytes;
};

// One entry per pipeline stage. `schedule`: the MoE layers' schedule the ranks run (for auto, the
// one the cost model picks); `topology` the spec's layout (validated).
std::vector<StageMemory> PlanMemory(const v1::JobSpec& spec, const topology::Topology& topology,
                                    moe::Schedule schedule);

// The least activation memory one rank needs for one micro-batch of a layout, under any memory
// policy (model::MinimumActivationBytes of every stage's shard; a memory.device_budget below it
// is refused by the ranks before their first step), and the stage that needs it. With
// `moe.schedule: auto` the ranks pick their schedule themselves, so the floor is the least over
// the schedules the layout allows: a budget below it fails whatever they pick.
struct ActivationFloor {
  int64_t bytes = 0;
  int stage = 0;
};
ActivationFloor LayoutActivationFloor(const v1::JobSpec& spec, const topology::Topology& topology);

// The spec's layout (parallel.*) with the sizes of `layout` (a recovery.shrink entry; a size it
// leaves 0 is the job's own), as the ranks build it; an error names the sizes.
absl::StatusOr<topology::Topology> TopologyOf(const v1::JobSpec& spec,
                                              const v1::LayoutSpec* layout = nullptr);

// memory.device_budget against the floor of the job's layout and of every recovery.shrink layout
// (an attempt restarted under one runs its shards): OK, or InvalidArgument naming the field, the
// floor, the stage and the layout. Train jobs with a budget only; `path` prefixes the message.
absl::Status CheckDeviceBudgetFloor(const v1::JobSpec& spec, const std::string& path);

}  // namespace furnace::cli
