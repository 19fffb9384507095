// RankLayout: one rank of a parallel layout, assembled from a Topology: its coordinates, the part
// of the model it holds (model::ModelShard), one communicator per group it belongs to, and the
// ParallelRuntime the Trainer runs with. The transport comes from a factory, so the same code
// builds Gloo groups in a worker and in-process fake groups in tests.
//
// Every rank creates its groups in the same order (world, tp, dp, pp, ep, esp, edp, embedding),
// each under the key prefix "<kind>/<first member>" so group rendezvous never collide; a factory
// that blocks until the group's members have joined (Gloo) cannot deadlock with that order.
//
// Ownership: RankLayout owns the communicators; `runtime` and model_groups() point into them.
// Errors: the factory's Status, with the group named.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "runtime/comm/communicator.h"
#include "runtime/model/config.h"
#include "runtime/model/module.h"
#include "runtime/model/shard.h"
#include "runtime/topology/topology.h"
#include "runtime/train/parallel.h"

namespace furnace::train {

// Creates the communicator of one group: `prefix` scopes its rendezvous, `name` is for messages,
// `rank` / `size` are the caller's place in it.
using CommFactory = std::function<absl::StatusOr<std::unique_ptr<comm::Communicator>>(
    const std::string& prefix, const std::string& name, int rank, int size)>;

struct RankLayout {
  int rank = 0;
  topology::Coords coords;
  model::ModelShard shard;
  std::unique_ptr<comm::Communicator> world, tp, dp, pp, ep, esp, edp, embedding;
  ParallelRuntime runtime;

  bool esp_is_tp = false;  // topology::Topology::EspGroupIsTpGroup
  model::ParallelGroups model_groups() const { return {tp.get(), ep.get(), esp.get(), esp_is_tp}; }
};

absl::StatusOr<std::unique_ptr<RankLayout>> BuildRankLayout(const topology::Topology& topology,
                                                            int rank,
                                                            const model::ModelConfig& config,
                                                            const CommFactory& factory);

// The layout's checks against a model (tp | heads, ep | experts, ...), as topology::ModelDims.
topology::ModelDims DimsOf(const model::ModelConfig& config);

}  // namespace furnace::train
