#include "controller/cli/job_model.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "runtime/base/status.h"
#include "runtime/memory/policy.h"
#include "runtime/model/declared_bytes.h"
#include "runtime/model/param_layout.h"
#include "runtime/model/shard.h"

namespace furnace::cli {

model::ModelConfig ModelConfigOf(const v1::ModelSpec& m, const v1::MoeSpec& moe) {
  model::ModelConfig c;
  c.vocab = static_cast<int>(m.vocab());
  c.seq_len = static_cast<int>(m.seq_len());
  c.d_model = static_cast<int>(m.d_model());
  c.heads = static_cast<int>(m.heads());
  c.layers = static_cast<int>(m.layers());
  c.dense_ffn = static_cast<int>(m.dense_ffn());
  c.moe_every = static_cast<int>(m.moe_every());
  c.expert_ffn = static_cast<int>(m.expert_ffn());
  c.recompute_attention_probs = m.attention_probs() == "recomputed";
  c.experts = static_cast<int>(moe.experts());
  c.top_k = static_cast<int>(moe.top_k());
  c.capacity_factor = moe.capacity_factor();
  c.normalize_topk = moe.normalize_topk();
  c.aux_alpha = moe.aux_alpha();
  return c;
}

std::vector<StageMemory> PlanMemory(const v1::JobSpec& spec, const topology::Topology& topology,
                                    moe::Schedule schedule) {
  using memory::MemoryPolicy;
  const model::ModelConfig config = ModelConfigOf(spec.model(), spec.moe());
  const int B = static_cast<int>(std::max<uint32_t>(1, spec.parallel().micro_batch()));
  const int micro_batches =
      static_cast<int>(std::max<uint32_t>(1, spec.parallel().micro_batches()));
  const model::MoeExchange exchange{schedule, topology.EspGroupIsTpGroup()};
  const bool bf16 = spec.model().precision() == "bf16";
  const int stages = topology.sizes().pp;

  std::vector<StageMemory> out(stages);
  for (int rank = 0; rank < topology.world_size(); ++rank) {
    const model::ModelShard shard = model::ShardOf(topology, rank, config);
    StageMemory& s = out[shard.stage];
    if (s.ranks++ > 0) continue;  // the stage's first rank speaks for all of it
    s.stage = shard.stage;
    s.first_layer = shard.first_layer;
    s.end_layer = shard.end_layer(config);
    s.parameters = model::BuildParamLayout(config, shard).total;
    s.model_state_bytes = 16 * s.parameters;
    s.bf16_mirror_bytes = bf16 ? 2 * s.parameters : 0;
    s.micro_batches_in_flight = std::min(stages - shard.stage, micro_batches);
    const model::MoeRows rows = model::BalancedMoeRows(config, shard, B, exchange);
    const std::optional<model::MoeRows> worst = model::WorstMoeRows(config, shard, B, exchange);
    const int64_t dres = model::ResidualGradBytes(config, B);
    // As the model projects it: the micro-batches already in flight hold their saved tensors
    // while the newest one runs (GptMoe's predicted peak).
    const auto in_flight = [&](const model::MoeRows& at, MemoryPolicy policy, int64_t* one) {
      const std::vector<model::ModuleBytes> modules =
          model::DeclaredModulesOf(config, shard, B, {at}, policy);
      int64_t saved = 0;
      for (const model::ModuleBytes& m : modules) saved += m.saved;
      *one = model::ComposePeak(modules, dres);
      return *one + int64_t{s.micro_batches_in_flight - 1} * saved;
    };
    for (const MemoryPolicy policy :
         {MemoryPolicy::kNone, MemoryPolicy::kSelective, MemoryPolicy::kFullRecompute}) {
      PolicyActivationBytes b;
      b.policy = memory::MemoryPolicyName(policy);
      b.in_flight = in_flight(rows, policy, &b.one);
      if (worst.has_value()) {
        int64_t one = 0;
        b.worst_in_flight = in_flight(*worst, policy, &one);
      }
      s.policies.push_back(std::move(b));
    }
    s.least_activation_bytes = model::MinimumActivationBytes(config, shard, B, exchange);
    s.any_routing_bytes = model::RoutingBoundActivationBytes(config, shard, B, exchange);
  }
  return out;
}

absl::StatusOr<topology::Topology> TopologyOf(const v1::JobSpec& spec,
                                              const v1::LayoutSpec* layout) {
  const v1::ParallelSpec& p = spec.parallel();
  const auto size = [](uint32_t shrunk, uint32_t own) {
    return static_cast<int>(std::max<uint32_t>(1, shrunk > 0 ? shrunk : own));
  };
  topology::ParallelSizes sizes;
  sizes.pp = size(layout ? layout->pp() : 0, p.pp());
  sizes.dp = size(layout ? layout->dp() : 0, p.dp());
  sizes.tp = size(layout ? layout->tp() : 0, p.tp());
  sizes.ep = size(layout ? layout->ep() : 0, p.ep());
  sizes.esp = size(layout ? layout->esp() : 0, p.esp());
  if (!p.order().empty()) sizes.order = p.order();
  return topology::Topology::Create(sizes, sizes.world());
}

ActivationFloor LayoutActivationFloor(const v1::JobSpec& spec, const topology::Topology& topology) {
  const model::ModelConfig config = ModelConfigOf(spec.model(), spec.moe());
  const int B = static_cast<int>(std::max<uint32_t>(1, spec.parallel().micro_batch()));
  const int tp = topology.sizes().tp;
  // The schedules the ranks may run: the one named, or for auto every one the layout allows
  // (tensor parallelism 1: deepspeed; s1 only where the tokens split evenly over tp).
  std::vector<moe::Schedule> schedules;
  if (const std::optional<moe::Schedule> named = moe::ParseSchedule(spec.moe().schedule());
      named.has_value()) {
    schedules.push_back(tp > 1 ? *named : moe::Schedule::kDeepspeed);
  } else {
    schedules.push_back(moe::Schedule::kDeepspeed);
    if (tp > 1) {
      schedules.push_back(moe::Schedule::kS2);
      if ((int64_t{B} * config.seq_len) % tp == 0) schedules.push_back(moe::Schedule::kS1);
    }
  }
  ActivationFloor least{-1, 0};
  for (const moe::Schedule schedule : schedules) {
    const model::MoeExchange exchange{schedule, topology.EspGroupIsTpGroup()};
    ActivationFloor most{0, 0};
    std::vector<bool> seen(static_cast<size_t>(topology.sizes().pp), false);
    for (int rank = 0; rank < topology.world_size(); ++rank) {
      const model::ModelShard shard = model::ShardOf(topology, rank, config);
      if (seen[static_cast<size_t>(shard.stage)]) continue;  // a stage's ranks need the same
      seen[static_cast<size_t>(shard.stage)] = true;
      const int64_t bytes = model::MinimumActivationBytes(config, shard, B, exchange);
      if (bytes > most.bytes) most = {bytes, shard.stage};
    }
    if (least.bytes < 0 || most.bytes < least.bytes) least = most;
  }
  return least;
}

absl::Status CheckDeviceBudgetFloor(const v1::JobSpec& spec, const std::string& path) {
  const uint64_t budget = spec.memory().device_budget();
  if (spec.kind() != "train" || budget == 0) return absl::OkStatus();
  // A layout whose topology is not valid is refused by the controller's validation, which says
  // why: not checked here.
  const auto check = [&](const topology::Topology& topology,
                         const std::string& which) -> absl::Status {
    const ActivationFloor floor = LayoutActivationFloor(spec, topology);
    if (static_cast<int64_t>(budget) >= floor.bytes) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": memory.device_budget: ", budget, " bytes is below ", floor.bytes,
        " bytes, the least any memory policy needs on a rank of pipeline stage ", floor.stage,
        which, " for one micro-batch of ", std::max<uint32_t>(1, spec.parallel().micro_batch()),
        " sequences (one module's forward, or its backward with all its saved tensors back): ",
        which.empty() ? "every rank would refuse it at start"
                      : "an attempt restarted under that layout would be refused at start",
        " (allowed: >= ", floor.bytes, ", or a smaller parallel.micro_batch",
        which.empty() ? "" : ", or leave that layout out", "; `furnace plan ", path,
        "` shows each stage's bytes)"));
  };
  if (absl::StatusOr<topology::Topology> main = TopologyOf(spec, nullptr); main.ok()) {
    RETURN_IF_ERROR(check(*main, ""));
  }
  for (int i = 0; i < spec.recovery().shrink_size(); ++i) {
    absl::StatusOr<topology::Topology> t = TopologyOf(spec, &spec.recovery().shrink(i));
    if (!t.ok()) continue;
    RETURN_IF_ERROR(check(*t, absl::StrCat(" of recovery.shrink[", i, "] (pp ", t->sizes().pp,
                                           " dp ", t->sizes().dp, " tp ", t->sizes().tp, " ep ",
                                           t->sizes().ep, " esp ", t->sizes().esp, ")")));
  }
  return absl::OkStatus();
}

}  // namespace furnace::cli
