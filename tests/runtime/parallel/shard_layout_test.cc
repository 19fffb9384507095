// The shards of every layout tile the model: each element of each parameter of the whole model is
// held by at least one rank, counted in the gradient norm by exactly one (norm_owner), and
// initialised on every holder to the whole model's value at that index.
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "runtime/device/device.h"
#include "runtime/model/gpt_moe.h"
#include "runtime/model/param_layout.h"
#include "runtime/tensor/arena.h"
#include "runtime/topology/topology.h"
#include "runtime/train/rank_layout.h"
#include "tests/runtime/parallel/layout_run.h"

namespace furnace::model {
namespace {

struct Case {
  const char* name;
  int pp, dp, tp, ep, esp;
};

class ShardLayoutTest : public ::testing::TestWithParam<Case> {};

TEST_P(ShardLayoutTest, ShardsTileTheModel) {
  const Case k = GetParam();
  const ModelConfig c = furnace::testing::TinyLayoutModel(/*top_k=*/2, /*capacity_factor=*/0);
  topology::ParallelSizes sizes;
  sizes.pp = k.pp;
  sizes.dp = k.dp;
  sizes.tp = k.tp;
  sizes.ep = k.ep;
  sizes.esp = k.esp;
  auto topo = topology::Topology::Create(sizes, sizes.world(), train::DimsOf(c));
  ASSERT_TRUE(topo.ok()) << topo.status();

  auto cpu = device::CreateCpuDevice();
  tensor::DeviceArena arena(*cpu, 0);
  auto whole = GptMoe::Create(c, 5, *cpu, arena);
  ASSERT_TRUE(whole.ok());
  std::map<std::string, std::vector<int>> held, owned;  // per element: holders, owners
  for (const train::ParamInfo& p : (*whole)->params()) {
    held[p.name].assign(p.numel(), 0);
    owned[p.name].assign(p.numel(), 0);
  }
  for (int rank = 0; rank < sizes.world(); ++rank) {
    const ModelShard shard = model::ShardOf(*topo, rank, c);
    auto part = GptMoe::Create(c, 5, *cpu, arena, shard);
    ASSERT_TRUE(part.ok()) << part.status();
    for (const train::ParamInfo& p : (*part)->params()) {
      const train::ParamInfo* w = (*whole)->FindParam(p.name);
      ASSERT_NE(w, nullptr) << p.name;
      for (int64_t i = 0; i < p.numel(); ++i) {
        const int64_t g = p.GlobalIndex(i);
        ASSERT_GE(g, 0);
        ASSERT_LT(g, w->numel()) << p.name;
        ++held[p.name][g];
        if (p.norm_owner) ++owned[p.name][g];
        ASSERT_EQ((*part)->param_data()[p.offset + i], (*whole)->param_data()[w->offset + g])
            << p.name << " element " << g << " on rank " << rank;
      }
    }
  }
  for (const auto& [name, counts] : held) {
    for (size_t g = 0; g < counts.size(); ++g) {
      ASSERT_GE(counts[g], 1) << name << "[" << g << "] is held by no rank";
      ASSERT_EQ(owned[name][g], 1)
          << name << "[" << g << "] is counted " << owned[name][g] << " times in the norm";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, ShardLayoutTest,
    ::testing::Values(Case{"whole", 1, 1, 1, 1, 1}, Case{"dp2", 1, 2, 1, 1, 1},
                      Case{"tp2", 1, 1, 2, 1, 1}, Case{"pp4", 4, 1, 1, 1, 1},
                      Case{"pp3", 3, 1, 1, 1, 1}, Case{"ep4", 1, 4, 1, 4, 1},
                      Case{"ep2_esp2", 1, 4, 1, 2, 2}, Case{"tp2_ep2", 1, 1, 2, 2, 1},
                      Case{"tp2_pp2_ep2_esp2", 2, 2, 2, 2, 2}, Case{"tp4_esp4", 1, 1, 4, 1, 4}),
    [](const ::testing::TestParamInfo<Case>& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace furnace::model
