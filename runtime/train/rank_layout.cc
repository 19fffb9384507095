#include "runtime/train/rank_layout.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "runtime/base/status.h"

namespace furnace::train {

using topology::GroupKind;

topology::ModelDims DimsOf(const model::ModelConfig& c) {
  topology::ModelDims d;
  d.heads = c.heads;
  d.d_model = c.d_model;
  d.layers = c.layers;
  d.experts = c.experts;
  d.expert_ffn = c.expert_ffn;
  // Only checked when some layer is dense.
  d.dense_ffn = c.moe_every > 1 ? c.dense_width() : 0;
  return d;
}

absl::StatusOr<std::unique_ptr<RankLayout>> BuildRankLayout(const topology::Topology& topo,
                                                            int rank,
                                                            const model::ModelConfig& config,
                                                            const CommFactory& factory) {
  auto layout = std::make_unique<RankLayout>();
  layout->rank = rank;
  layout->coords = topo.CoordsOf(rank);
  layout->shard = model::ShardOf(topo, rank, config);
  layout->esp_is_tp = topo.EspGroupIsTpGroup();

  auto make =
      [&](const std::string& kind,
          const std::vector<int>& members) -> absl::StatusOr<std::unique_ptr<comm::Communicator>> {
    const int at =
        static_cast<int>(std::find(members.begin(), members.end(), rank) - members.begin());
    const std::string name = absl::StrCat(kind, "[", absl::StrJoin(members, ","), "]");
    auto made = factory(absl::StrCat(kind, "/", members.front()), name, at,
                        static_cast<int>(members.size()));
    if (!made.ok()) {
      return absl::Status(made.status().code(),
                          absl::StrCat("group ", name, ": ", made.status().message()));
    }
    return made;
  };
  std::vector<int> everyone(topo.world_size());
  for (int r = 0; r < topo.world_size(); ++r) everyone[r] = r;
  ASSIGN_OR_RETURN(layout->world, make("world", everyone));
  ASSIGN_OR_RETURN(layout->tp, make("tp", topo.Group(GroupKind::kTensor, rank)));
  ASSIGN_OR_RETURN(layout->dp, make("dp", topo.Group(GroupKind::kData, rank)));
  ASSIGN_OR_RETURN(layout->pp, make("pp", topo.Group(GroupKind::kPipeline, rank)));
  ASSIGN_OR_RETURN(layout->ep, make("ep", topo.Group(GroupKind::kExpert, rank)));
  ASSIGN_OR_RETURN(layout->esp, make("esp", topo.Group(GroupKind::kExpertShard, rank)));
  ASSIGN_OR_RETURN(layout->edp, make("edp", topo.Group(GroupKind::kExpertData, rank)));
  ASSIGN_OR_RETURN(layout->embedding, make("embedding", topo.Group(GroupKind::kEmbedding, rank)));

  ParallelRuntime& p = layout->runtime;
  const topology::ParallelSizes& z = topo.sizes();
  p.world = topo.world_size();
  p.world_rank = rank;
  p.stages = z.pp;
  p.stage = layout->coords.pp;
  p.dp = z.dp;
  p.dp_rank = layout->coords.dp;
  p.tp = z.tp;
  p.tp_rank = layout->coords.tp;
  p.world_group = layout->world.get();
  p.tensor = layout->tp.get();
  p.data = layout->dp.get();
  p.expert_data = layout->edp.get();
  p.pipeline = layout->pp.get();
  p.embedding = layout->embedding.get();
  p.all_groups = {{"world", layout->world.get()},
                  {GroupKindName(GroupKind::kTensor), layout->tp.get()},
                  {GroupKindName(GroupKind::kData), layout->dp.get()},
                  {GroupKindName(GroupKind::kPipeline), layout->pp.get()},
                  {GroupKindName(GroupKind::kExpert), layout->ep.get()},
                  {GroupKindName(GroupKind::kExpertShard), layout->esp.get()},
                  {GroupKindName(GroupKind::kExpertData), layout->edp.get()},
                  {GroupKindName(GroupKind::kEmbedding), layout->embedding.get()}};
  return layout;
}

}  // namespace furnace::train
