// Test helper: trains the tiny model of the layout tests for a few steps on one parallel layout,
// one fork()ed process per rank talking Gloo over 127.0.0.1 (rendezvous through a FileKvStore),
// and returns what the ranks reported: per-step loss and gradient norm, the 1F1B in-flight peak
// per rank, bytes per collective per rank, whether each step was a routing-spike step and its
// global tokens per expert (every rank must report the same), and the final parameters reassembled
// by name from the shards (each element from every rank that holds it, so replicas are checked
// against each other). RunSingle trains the same model in this process with micro_batches * dp
// micro-batches, the single-process run every layout must reproduce.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/device/device.h"
#include "runtime/memory/codec.h"
#include "runtime/memory/policy.h"
#include "runtime/model/config.h"
#include "runtime/model/stash.h"
#include "runtime/moe/trial.h"
#include "runtime/topology/topology.h"

namespace furnace::testing {

struct LayoutCase {
  model::ModelConfig model;
  topology::ParallelSizes sizes;
  int micro_batch = 2;    // B
  int micro_batches = 2;  // m per data-parallel rank
  int steps = 5;
  double lr = 3e-3;
  uint64_t seed = 7;
  memory::MemoryPolicy policy = memory::MemoryPolicy::kNone;  // on every rank
  // Stash actions: the static offload policy's share (0: policy none) through a copy engine paced
  // to host_link_gbps, and reduced-precision storage of the expert buffers.
  double offload_ratio = 0;
  double host_link_gbps = 0;
  std::optional<memory::Codec> compress;
  // The activation arena's budget on every rank (0: unlimited). Under policy adaptive the planner
  // works against it, offloading through a copy engine paced to host_link_gbps.
  uint64_t device_budget = 0;
  // Under policy adaptive: whether it may offload (a copy engine), and whether the ranks agree on
  // dropping the expert buffers whose rebuild re-runs the all-to-all (the world as its drop group,
  // as a worker does; GptMoe::AdaptiveOptions::drop_group).
  bool adaptive_offload = true;
  bool agree_drops = true;
  // Instead: each rank's budget is its model's RoutingBoundActivationBytes(micro_batch), the
  // floor for the most rows routing can send it (the run fails where there is no such bound).
  bool budget_at_routing_bound = false;
  // moe.schedule on every rank: "deepspeed", "s1", "s2" (every MoE layer), or "auto".
  std::string schedule = "deepspeed";
  // auto: the trial's settings (runtime/moe/trial.h; a wide window makes every schedule tried).
  moe::TrialOptions trial;
  // Held-out evaluation (eval.every, eval.batches; 0: off) on an independent Markov stream.
  int eval_every = 0;
  int eval_batches = 0;
  // Where every rank trains: the CPU device, or an emulated discrete device of its own (its
  // communicators wrapped by comm::ForDevice, a compute stream current on the training thread).
  device::Kind device = device::Kind::kCpu;
  // On the emulated device: each group a StreamCommunicator over the emulated transport (Gloo run
  // on a communication stream of its own, ordered by events, under one watchdog per rank:
  // comm::CreateEmulatedStreamCommunicator), the way a CUDA rank runs NCCL, instead of Gloo staged
  // through the host (comm::ForDevice).
  bool stream_comms = false;
  // This rank's training and held-out data come from another Markov chain (-1: none): every rank
  // must then refuse before training (Trainer::CheckSameData).
  int other_data_rank = -1;
};

struct RunResult {
  std::vector<double> loss, aux_loss, grad_norm;  // per step
  std::vector<bool> routing_spike;                // per step
  std::vector<double> eval_loss;  // per evaluation (every rank must report the same)
  std::vector<std::vector<int64_t>> tokens_per_expert;  // per step: global, MoE layers x E
  std::vector<int> in_flight_peak;                      // per rank
  std::vector<std::vector<int64_t>> comm_bytes;         // [rank][op], summed over the steps
  std::map<std::string, std::vector<float>> params;     // whole tensors by name
  // Largest |a - b| / (max |b| of the tensor) between two ranks' copies of one element.
  double replica_spread = 0;
  std::vector<model::StashActionStats> stash_actions;  // per rank, summed over the steps
  // Per rank, over the run: the expert buffers the adaptive planner dropped by the ranks'
  // agreement (GptMoe::PlannerStats::agreed_drops).
  std::vector<int64_t> agreed_drops;
  // [rank]: the MoE schedules' bytes per op ("a2a(ep)", "counts", ...; executor.h), summed over
  // the steps, and the schedule each MoE layer ran.
  std::vector<std::map<std::string, int64_t>> moe_op_bytes;
  std::vector<std::vector<std::string>> moe_schedules;
  // [rank][step]: the arena's peak, the memory model's prediction for the same step, and the
  // adaptive planner's decisions and emergency offloads.
  std::vector<std::vector<int64_t>> activation_peak, predicted_peak;
  std::vector<std::vector<int64_t>> planner_decisions, emergency_offloads;
  // [rank][step]: the ranks' agreements on collective drops (GptMoe "Collective drops").
  std::vector<std::vector<int64_t>> agreements;
};

// The layout tests' tiny MoE: 4 layers, 1 and 3 MoE and 0 and 2 dense (both FFN kinds run in
// every layout), d_model 16, 4 experts of 16 hidden; top-k normalized when k > 1.
model::ModelConfig TinyLayoutModel(int top_k, double capacity_factor);

// A rank whose training ended Aborted (a step refused as not finite) exits with kRankAborted, one
// refused as InvalidArgument with kRankInvalidArgument, one out of memory (ResourceExhausted: its
// activation arena's budget refused an allocation) with kRankResourceExhausted, any other failure
// with 1. A failed run is an error naming each rank's exit ("rank 2 exited with 5; ...").
inline constexpr int kRankAborted = 3;
inline constexpr int kRankInvalidArgument = 4;
inline constexpr int kRankResourceExhausted = 5;
absl::StatusOr<RunResult> RunLayout(const LayoutCase& c, const std::string& dir);
absl::StatusOr<RunResult> RunSingle(const LayoutCase& c);

}  // namespace furnace::testing
