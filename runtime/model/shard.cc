#include "runtime/model/shard.h"

namespace furnace::model {

ModelShard ShardOf(const topology::Topology& topology, int rank, const ModelConfig& config) {
  const topology::ParallelSizes& z = topology.sizes();
  const topology::Coords co = topology.CoordsOf(rank);
  ModelShard s;
  s.stage = co.pp;
  s.stages = z.pp;
  const auto [first, last] = topology::Topology::StageLayers(co.pp, z.pp, config.layers);
  s.first_layer = first;
  s.last_layer = last;
  s.tp = z.tp;
  s.tp_rank = co.tp;
  s.ep = z.ep;
  s.ep_rank = co.ep;
  s.esp = z.esp;
  s.esp_rank = co.esp;
  s.dp_rank = co.dp;
  s.edp_rank = co.edp;
  return s;
}

}  // namespace furnace::model
