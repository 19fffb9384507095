#include "controller/cli/job_model.h"

#include <algorithm>
#include <utility>

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

}  // namespace furnace::cli
