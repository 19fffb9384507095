// Topology: hand-computed layouts, properties over a sweep of sizes and orders (every rank in
// exactly one group of each kind, sizes, coordinates round-trip), stage splits, and every invalid
// configuration with its message.
#include "runtime/topology/topology.h"

#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace furnace::topology {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr GroupKind kAllKinds[] = {
    GroupKind::kTensor,      GroupKind::kData,       GroupKind::kPipeline, GroupKind::kExpert,
    GroupKind::kExpertShard, GroupKind::kExpertData, GroupKind::kEmbedding};

ParallelSizes Sizes(int pp, int dp, int tp, int ep = 1, int esp = 1, std::string order = "tp-dp-pp",
                    std::string moe_order = "esp-ep-edp") {
  ParallelSizes s;
  s.pp = pp, s.dp = dp, s.tp = tp, s.ep = ep, s.esp = esp;
  s.order = std::move(order);
  s.moe_order = std::move(moe_order);
  return s;
}

Topology MustCreate(const ParallelSizes& s) {
  absl::StatusOr<Topology> t = Topology::Create(s, s.world());
  EXPECT_TRUE(t.ok()) << t.status();
  return *std::move(t);
}

TEST(TopologyTest, GroupKindNames) {
  std::vector<std::string> names;
  for (GroupKind k : kAllKinds) names.push_back(GroupKindName(k));
  EXPECT_THAT(names, ElementsAre("tp", "dp", "pp", "ep", "esp", "edp", "embedding"));
}

// pp2 dp2 tp2 ep2 esp2, default orders: rank = tp + 2 dp + 4 pp; in a stage esp = tp, ep = dp.
TEST(TopologyTest, HandComputedDefaultOrder) {
  const Topology t = MustCreate(Sizes(2, 2, 2, 2, 2));
  EXPECT_EQ(t.world_size(), 8);
  EXPECT_EQ(t.edp(), 1);
  EXPECT_THAT(t.Group(GroupKind::kTensor, 0), ElementsAre(0, 1));
  EXPECT_THAT(t.Group(GroupKind::kData, 0), ElementsAre(0, 2));
  EXPECT_THAT(t.Group(GroupKind::kPipeline, 0), ElementsAre(0, 4));
  EXPECT_THAT(t.Group(GroupKind::kExpertShard, 0), ElementsAre(0, 1));
  EXPECT_THAT(t.Group(GroupKind::kExpert, 0), ElementsAre(0, 2));
  EXPECT_THAT(t.Group(GroupKind::kExpertData, 0), ElementsAre(0));
  EXPECT_THAT(t.Group(GroupKind::kEmbedding, 0), ElementsAre(0, 4));

  // Rank 5: pp 1, dp 0, tp 1.
  const Coords c = t.CoordsOf(5);
  EXPECT_EQ(c.pp, 1);
  EXPECT_EQ(c.dp, 0);
  EXPECT_EQ(c.tp, 1);
  EXPECT_EQ(c.edp, 0);
  EXPECT_EQ(c.ep, 0);
  EXPECT_EQ(c.esp, 1);
  EXPECT_EQ(t.RankOf(1, 0, 1), 5);
  EXPECT_THAT(t.Group(GroupKind::kTensor, 5), ElementsAre(4, 5));
  EXPECT_THAT(t.Group(GroupKind::kData, 5), ElementsAre(5, 7));
  EXPECT_THAT(t.Group(GroupKind::kPipeline, 5), ElementsAre(1, 5));
  EXPECT_THAT(t.Group(GroupKind::kExpert, 5), ElementsAre(5, 7));
  EXPECT_THAT(t.Group(GroupKind::kExpertShard, 5), ElementsAre(4, 5));
  EXPECT_THAT(t.Group(GroupKind::kEmbedding, 5), ElementsAre(1, 5));
  EXPECT_THAT(t.AllGroups(GroupKind::kTensor), ElementsAre(ElementsAre(0, 1), ElementsAre(2, 3),
                                                           ElementsAre(4, 5), ElementsAre(6, 7)));
  EXPECT_THAT(
      t.AllGroups(GroupKind::kEmbedding),
      ElementsAre(ElementsAre(0, 4), ElementsAre(1, 5), ElementsAre(2, 6), ElementsAre(3, 7)));
}

TEST(TopologyTest, DefaultOrderPutsTensorGroupsOnAdjacentRanks) {
  const Topology t = MustCreate(Sizes(3, 2, 4));
  for (const std::vector<int>& g : t.AllGroups(GroupKind::kTensor)) {
    for (size_t i = 1; i < g.size(); ++i) EXPECT_EQ(g[i], g[0] + static_cast<int>(i));
  }
}

// "dp-tp-pp": rank = dp + 2 tp.
TEST(TopologyTest, DataFastestOrder) {
  const Topology t = MustCreate(Sizes(1, 2, 2, 1, 1, "dp-tp-pp"));
  EXPECT_THAT(t.Group(GroupKind::kTensor, 0), ElementsAre(0, 2));
  EXPECT_THAT(t.Group(GroupKind::kData, 0), ElementsAre(0, 1));
  EXPECT_THAT(t.Group(GroupKind::kTensor, 1), ElementsAre(1, 3));
  EXPECT_THAT(t.Group(GroupKind::kEmbedding, 3), ElementsAre(3));
}

// "pp-dp-tp": rank = pp + 2 dp + 4 tp; in-stage index = dp + 2 tp; with ep 2, esp 1 (edp 2):
// in-stage index = ep + 2 edp, so an in-stage index i on stage p is rank p + 2 i.
TEST(TopologyTest, PipelineFastestOrder) {
  const Topology t = MustCreate(Sizes(2, 2, 2, 2, 1, "pp-dp-tp"));
  EXPECT_EQ(t.edp(), 2);
  EXPECT_THAT(t.Group(GroupKind::kTensor, 0), ElementsAre(0, 4));
  EXPECT_THAT(t.Group(GroupKind::kData, 0), ElementsAre(0, 2));
  EXPECT_THAT(t.Group(GroupKind::kPipeline, 0), ElementsAre(0, 1));
  EXPECT_THAT(t.Group(GroupKind::kEmbedding, 2), ElementsAre(2, 3));
  EXPECT_THAT(t.Group(GroupKind::kExpert, 0), ElementsAre(0, 2));
  EXPECT_THAT(t.Group(GroupKind::kExpertData, 0), ElementsAre(0, 4));
  EXPECT_THAT(t.Group(GroupKind::kExpert, 5), ElementsAre(5, 7));
  EXPECT_THAT(t.Group(GroupKind::kExpertData, 7), ElementsAre(3, 7));
  EXPECT_THAT(t.Group(GroupKind::kExpertShard, 7), ElementsAre(7));
}

// pp1 dp4 tp1 ep2: default "esp-ep-edp" gives in-stage = ep + 2 edp; "edp-ep-esp" gives
// in-stage = edp + 2 ep.
TEST(TopologyTest, MoeOrderVariants) {
  const Topology def = MustCreate(Sizes(1, 4, 1, 2, 1));
  EXPECT_THAT(def.Group(GroupKind::kExpert, 0), ElementsAre(0, 1));
  EXPECT_THAT(def.Group(GroupKind::kExpertData, 0), ElementsAre(0, 2));
  const Topology edp_first = MustCreate(Sizes(1, 4, 1, 2, 1, "tp-dp-pp", "edp-ep-esp"));
  EXPECT_THAT(edp_first.Group(GroupKind::kExpert, 0), ElementsAre(0, 2));
  EXPECT_THAT(edp_first.Group(GroupKind::kExpertData, 0), ElementsAre(0, 1));
  EXPECT_EQ(edp_first.CoordsOf(2).ep, 1);
  EXPECT_EQ(edp_first.CoordsOf(2).edp, 0);

  // dp2 tp2 ep2 esp2, "ep-esp-edp": in-stage = ep + 2 esp, so the ESP group is the DP group.
  const Topology ep_first = MustCreate(Sizes(1, 2, 2, 2, 2, "tp-dp-pp", "ep-esp-edp"));
  EXPECT_THAT(ep_first.Group(GroupKind::kExpertShard, 0), ElementsAre(0, 2));
  EXPECT_THAT(ep_first.Group(GroupKind::kExpert, 0), ElementsAre(0, 1));
  EXPECT_THAT(ep_first.Group(GroupKind::kExpertShard, 3), ElementsAre(1, 3));
}

TEST(TopologyTest, EmbeddingGroups) {
  // pp == 1: the rank alone.
  const Topology flat = MustCreate(Sizes(1, 2, 2));
  for (int r = 0; r < 4; ++r) EXPECT_THAT(flat.Group(GroupKind::kEmbedding, r), ElementsAre(r));
  // pp == 3: first and last stage of the same dp, tp; a middle stage is alone.
  const Topology deep = MustCreate(Sizes(3, 1, 2));  // rank = tp + 2 pp
  EXPECT_THAT(deep.Group(GroupKind::kEmbedding, 1), ElementsAre(1, 5));
  EXPECT_THAT(deep.Group(GroupKind::kEmbedding, 5), ElementsAre(1, 5));
  EXPECT_THAT(deep.Group(GroupKind::kEmbedding, 2), ElementsAre(2));
}

// Checks every property the header promises for one layout.
void CheckProperties(const Topology& t) {
  const ParallelSizes& s = t.sizes();
  SCOPED_TRACE(testing::Message() << "pp" << s.pp << " dp" << s.dp << " tp" << s.tp << " ep" << s.ep
                                  << " esp" << s.esp << " " << s.order << " " << s.moe_order);
  const int world = t.world_size();
  ASSERT_EQ(world, s.pp * s.dp * s.tp);
  ASSERT_EQ(t.edp() * s.ep * s.esp, s.dp * s.tp);

  // Coordinates round-trip and identify a rank, in the dense and in the MoE view.
  std::set<std::vector<int>> dense_seen, moe_seen;
  for (int r = 0; r < world; ++r) {
    const Coords c = t.CoordsOf(r);
    EXPECT_EQ(t.RankOf(c.pp, c.dp, c.tp), r);
    dense_seen.insert({c.pp, c.dp, c.tp});
    moe_seen.insert({c.pp, c.edp, c.ep, c.esp});
    EXPECT_TRUE(c.edp < t.edp() && c.ep < s.ep && c.esp < s.esp);
  }
  EXPECT_EQ(static_cast<int>(dense_seen.size()), world);
  EXPECT_EQ(static_cast<int>(moe_seen.size()), world);

  for (GroupKind kind : kAllKinds) {
    SCOPED_TRACE(GroupKindName(kind));
    std::vector<int> times_seen(world, 0);
    const std::vector<std::vector<int>> groups = t.AllGroups(kind);
    for (size_t i = 0; i < groups.size(); ++i) {
      if (i > 0) {
        EXPECT_LT(groups[i - 1].front(), groups[i].front());
      }
      for (int m : groups[i]) {
        ASSERT_TRUE(m >= 0 && m < world);
        ++times_seen[m];
        EXPECT_EQ(t.Group(kind, m), groups[i]);
      }
    }
    for (int r = 0; r < world; ++r) EXPECT_EQ(times_seen[r], 1) << "rank " << r;

    for (int r = 0; r < world; ++r) {
      const std::vector<int> g = t.Group(kind, r);
      EXPECT_NE(std::find(g.begin(), g.end(), r), g.end());
      const Coords c = t.CoordsOf(r);
      // The i-th member has coordinate i along the group's dimension, the others equal r's.
      for (size_t i = 0; i < g.size(); ++i) {
        const Coords m = t.CoordsOf(g[i]);
        const int idx = static_cast<int>(i);
        switch (kind) {
          case GroupKind::kTensor:
            EXPECT_TRUE(m.pp == c.pp && m.dp == c.dp && m.tp == idx);
            break;
          case GroupKind::kData:
            EXPECT_TRUE(m.pp == c.pp && m.tp == c.tp && m.dp == idx);
            break;
          case GroupKind::kPipeline:
            EXPECT_TRUE(m.dp == c.dp && m.tp == c.tp && m.pp == idx);
            break;
          case GroupKind::kExpert:
            EXPECT_TRUE(m.pp == c.pp && m.edp == c.edp && m.esp == c.esp && m.ep == idx);
            break;
          case GroupKind::kExpertShard:
            EXPECT_TRUE(m.pp == c.pp && m.edp == c.edp && m.ep == c.ep && m.esp == idx);
            break;
          case GroupKind::kExpertData:
            EXPECT_TRUE(m.pp == c.pp && m.ep == c.ep && m.esp == c.esp && m.edp == idx);
            break;
          case GroupKind::kEmbedding:
            EXPECT_TRUE(m.dp == c.dp && m.tp == c.tp);
            break;
        }
      }
      size_t want = 0;
      switch (kind) {
        case GroupKind::kTensor:
          want = s.tp;
          break;
        case GroupKind::kData:
          want = s.dp;
          break;
        case GroupKind::kPipeline:
          want = s.pp;
          break;
        case GroupKind::kExpert:
          want = s.ep;
          break;
        case GroupKind::kExpertShard:
          want = s.esp;
          break;
        case GroupKind::kExpertData:
          want = t.edp();
          break;
        case GroupKind::kEmbedding:
          want = (s.pp == 1 || (c.pp != 0 && c.pp != s.pp - 1)) ? 1 : 2;
          break;
      }
      EXPECT_EQ(g.size(), want);
    }
  }
}

TEST(TopologyTest, PropertiesOverSizesAndOrders) {
  const std::vector<std::string> orders = {"tp-dp-pp", "tp-pp-dp", "dp-tp-pp",
                                           "dp-pp-tp", "pp-tp-dp", "pp-dp-tp"};
  const std::vector<std::string> moe_orders = {"esp-ep-edp", "esp-edp-ep", "ep-esp-edp",
                                               "ep-edp-esp", "edp-esp-ep", "edp-ep-esp"};
  int layouts = 0;
  for (int pp : {1, 2, 3}) {
    for (int dp : {1, 2, 3, 4}) {
      for (int tp : {1, 2, 4}) {
        for (int ep = 1; ep <= dp * tp; ++ep) {
          for (int esp = 1; ep * esp <= dp * tp; ++esp) {
            if ((dp * tp) % (ep * esp) != 0) continue;
            for (size_t o = 0; o < orders.size(); ++o) {
              // All moe orders on one dense order, the default moe order on the others.
              for (size_t mo = 0; mo < moe_orders.size(); ++mo) {
                if (o != 0 && mo != 0) continue;
                CheckProperties(MustCreate(Sizes(pp, dp, tp, ep, esp, orders[o], moe_orders[mo])));
                ++layouts;
                if (HasFailure()) return;
              }
            }
          }
        }
      }
    }
  }
  EXPECT_GT(layouts, 100);
}

TEST(TopologyTest, StageLayers) {
  EXPECT_EQ(Topology::StageLayers(0, 1, 4), std::make_pair(0, 4));
  EXPECT_EQ(Topology::StageLayers(0, 2, 4), std::make_pair(0, 2));
  EXPECT_EQ(Topology::StageLayers(1, 2, 4), std::make_pair(2, 4));
  // 10 layers on 4 stages: 3, 3, 2, 2.
  EXPECT_EQ(Topology::StageLayers(0, 4, 10), std::make_pair(0, 3));
  EXPECT_EQ(Topology::StageLayers(1, 4, 10), std::make_pair(3, 6));
  EXPECT_EQ(Topology::StageLayers(2, 4, 10), std::make_pair(6, 8));
  EXPECT_EQ(Topology::StageLayers(3, 4, 10), std::make_pair(8, 10));
  EXPECT_EQ(Topology::StageLayers(2, 3, 3), std::make_pair(2, 3));
  for (int layers = 1; layers <= 12; ++layers) {
    for (int pp = 1; pp <= layers; ++pp) {
      int next = 0;
      for (int stage = 0; stage < pp; ++stage) {
        const auto [first, last] = Topology::StageLayers(stage, pp, layers);
        EXPECT_EQ(first, next);
        EXPECT_GE(last - first, layers / pp);
        EXPECT_LE(last - first, layers / pp + 1);
        next = last;
      }
      EXPECT_EQ(next, layers);
    }
  }
}

// The error message of Create(sizes, world_size, dims), which must fail with InvalidArgument.
std::string CreateError(const ParallelSizes& s, int world_size, const ModelDims& dims = {}) {
  absl::StatusOr<Topology> t = Topology::Create(s, world_size, dims);
  EXPECT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(t.status().message());
}

TEST(TopologyTest, RejectsSizesBelowOne) {
  EXPECT_THAT(CreateError(Sizes(0, 1, 1), 0), HasSubstr("parallel.pp = 0"));
  EXPECT_THAT(CreateError(Sizes(1, -2, 1), -2), HasSubstr("parallel.dp = -2"));
  EXPECT_THAT(CreateError(Sizes(1, 1, 0), 0), HasSubstr("parallel.tp = 0"));
  EXPECT_THAT(CreateError(Sizes(1, 1, 1, 0), 1), HasSubstr("parallel.ep = 0"));
  const std::string msg = CreateError(Sizes(1, 1, 1, 1, 0), 1);
  EXPECT_THAT(msg, HasSubstr("parallel.esp = 0"));
  EXPECT_THAT(msg, HasSubstr("allowed: an integer >= 1"));
}

TEST(TopologyTest, RejectsTooManyRanks) {
  EXPECT_THAT(CreateError(Sizes(65536, 65536, 1), 0), HasSubstr("is too large"));
}

TEST(TopologyTest, RejectsBadOrders) {
  for (const std::string bad :
       {"", "tp-dp", "tp-dp-pp-tp", "tp-tp-pp", "tp-dp-ep", "TP-DP-PP", "tp_dp_pp", "tp-dp-pp-"}) {
    const std::string msg = CreateError(Sizes(1, 1, 1, 1, 1, bad), 1);
    EXPECT_THAT(msg, HasSubstr("parallel.order = '" + bad + "' is invalid"));
    EXPECT_THAT(msg, HasSubstr("allowed: tp, dp and pp once each"));
  }
  for (const std::string bad : {"esp-ep", "tp-dp-pp", "esp-esp-edp", "ep-esp-edp-"}) {
    const std::string msg = CreateError(Sizes(1, 1, 1, 1, 1, "tp-dp-pp", bad), 1);
    EXPECT_THAT(msg, HasSubstr("parallel.moe_order = '" + bad + "' is invalid"));
    EXPECT_THAT(msg, HasSubstr("allowed: esp, ep and edp once each"));
  }
}

TEST(TopologyTest, RejectsExpertGroupsThatDoNotTile) {
  EXPECT_EQ(CreateError(Sizes(1, 2, 1, 2, 2), 2),
            "parallel.ep * parallel.esp = 4 must divide parallel.dp * parallel.tp = 2; "
            "allowed: ep * esp in {1, 2}");
  EXPECT_THAT(CreateError(Sizes(2, 3, 2, 4, 1), 12),
              HasSubstr("parallel.ep * parallel.esp = 4 must divide parallel.dp * parallel.tp = 6; "
                        "allowed: ep * esp in {1, 2, 3, 6}"));
}

TEST(TopologyTest, RejectsWorldSizeMismatch) {
  EXPECT_EQ(CreateError(Sizes(2, 2, 2), 6),
            "world_size = 6 must equal parallel.pp * parallel.dp * parallel.tp = 2 * 2 * 2 = 8; "
            "allowed: 8");
}

TEST(TopologyTest, RejectsModelThatDoesNotFit) {
  ModelDims dims;
  dims.heads = 4, dims.d_model = 64, dims.layers = 4, dims.experts = 8, dims.expert_ffn = 96;
  dims.dense_ffn = 256;
  EXPECT_TRUE(Topology::Create(Sizes(4, 1, 4, 1, 4), 16, dims).ok());

  EXPECT_EQ(CreateError(Sizes(1, 1, 3), 3, dims),
            "parallel.tp = 3 must divide model.heads = 4; allowed: tp in {1, 2, 4}");
  ModelDims wide = dims;
  wide.heads = 0;  // not checked
  EXPECT_THAT(CreateError(Sizes(1, 1, 3), 3, wide),
              HasSubstr("parallel.tp = 3 must divide model.d_model = 64"));
  ModelDims odd_ffn = dims;
  odd_ffn.heads = 8, odd_ffn.dense_ffn = 100;
  EXPECT_THAT(CreateError(Sizes(1, 1, 8), 8, odd_ffn),
              HasSubstr("parallel.tp = 8 must divide model.dense_ffn = 100"));
  EXPECT_EQ(CreateError(Sizes(5, 1, 1), 5, dims),
            "parallel.pp = 5 must be <= model.layers = 4; allowed: pp in 1..4");
  EXPECT_EQ(CreateError(Sizes(1, 3, 1, 3), 3, dims),
            "parallel.ep = 3 must divide moe.experts = 8; allowed: ep in {1, 2, 4, 8}");
  EXPECT_THAT(CreateError(Sizes(1, 1, 4, 1, 4), 4, {.expert_ffn = 6}),
              HasSubstr("parallel.esp = 4 must divide model.expert_ffn = 6; allowed: esp in "
                        "{1, 2, 3, 6}"));
  // Zero fields are not checked.
  EXPECT_TRUE(Topology::Create(Sizes(7, 1, 3, 1, 3), 21, ModelDims{}).ok());
}

}  // namespace
}  // namespace furnace::topology
