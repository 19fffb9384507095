#include "controller/store/placement.h"

#include "gtest/gtest.h"

namespace furnace::controller {
namespace {

std::vector<WorkerSlot> Workers() {
  return {{"b/1", "b", 1, "cpu", true},
          {"a/1", "a", 1, "cpu", true},
          {"a/0", "a", 0, "cpu", true},
          {"b/0", "b", 0, "cpu", false},
          {"g/0", "g", 0, "cuda", true}};
}

TEST(PlacementTest, RanksFollowHostAndSlotOrder) {
  auto p = PlaceRanks(Workers(), 3, "cpu", {});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(*p, (std::vector<std::string>{"a/0", "a/1", "b/1"}));
}

TEST(PlacementTest, GangAllOrNothing) {
  auto p = PlaceRanks(Workers(), 4, "cpu", {});
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(p.status().message().find("needs 4 free cpu workers, 3 available"),
            absl::string_view::npos);
}

TEST(PlacementTest, DeviceKindMustMatch) {
  auto p = PlaceRanks(Workers(), 1, "cuda", {});
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(*p, std::vector<std::string>{"g/0"});
}

TEST(PlacementTest, AvoidedWorkersOnlyWhenNeeded) {
  auto spare = PlaceRanks(Workers(), 2, "cpu", {"a/0"});
  ASSERT_TRUE(spare.ok());
  EXPECT_EQ(*spare, (std::vector<std::string>{"a/1", "b/1"}));
  auto all = PlaceRanks(Workers(), 3, "cpu", {"a/0"});
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(*all, (std::vector<std::string>{"a/0", "a/1", "b/1"}));
}

TEST(PlacementTest, Deterministic) {
  auto a = PlaceRanks(Workers(), 2, "cpu", {});
  auto w = Workers();
  std::reverse(w.begin(), w.end());
  auto b = PlaceRanks(w, 2, "cpu", {});
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(*a, *b);
}

// recovery.shrink: the job's own layout first, then the shrink layouts with micro_batches scaled
// so that micro_batch * micro_batches * dp stays the job's.
furnace::v1::JobSpec ShrinkingJob() {
  furnace::v1::JobSpec spec;
  auto* p = spec.mutable_parallel();
  p->set_pp(1);
  p->set_dp(4);
  p->set_tp(1);
  p->set_ep(4);
  p->set_esp(1);
  p->set_micro_batch(2);
  p->set_micro_batches(3);
  p->set_order("tp-dp-pp");
  auto* two = spec.mutable_recovery()->add_shrink();
  two->set_pp(1);
  two->set_dp(2);
  two->set_tp(1);
  two->set_ep(2);
  two->set_esp(1);
  auto* one = spec.mutable_recovery()->add_shrink();
  one->set_pp(1);
  one->set_dp(1);
  one->set_tp(1);
  one->set_ep(1);
  one->set_esp(1);
  return spec;
}

TEST(PlacementTest, AllowedLayoutsKeepTheGlobalBatch) {
  const auto layouts = AllowedLayouts(ShrinkingJob());
  ASSERT_EQ(layouts.size(), 3u);
  EXPECT_EQ(DescribeLayout(layouts[0]), "pp 1 dp 4 tp 1 ep 4 esp 1 (4 ranks)");
  EXPECT_EQ(DescribeLayout(layouts[1]), "pp 1 dp 2 tp 1 ep 2 esp 1 (2 ranks)");
  for (const auto& l : layouts) {
    EXPECT_EQ(uint64_t{l.micro_batch()} * l.micro_batches() * l.dp(), 2u * 3u * 4u)
        << DescribeLayout(l);
    EXPECT_EQ(l.order(), "tp-dp-pp");
  }
  EXPECT_EQ(layouts[1].micro_batches(), 6u);
  EXPECT_EQ(layouts[2].micro_batches(), 12u);
}

TEST(PlacementTest, FirstFittingLayoutIsTheLargestThatFits) {
  const auto layouts = AllowedLayouts(ShrinkingJob());
  EXPECT_EQ(FirstFittingLayout(layouts, 5), 0);
  EXPECT_EQ(FirstFittingLayout(layouts, 4), 0);
  EXPECT_EQ(FirstFittingLayout(layouts, 3), 1);
  EXPECT_EQ(FirstFittingLayout(layouts, 1), 2);
  EXPECT_EQ(FirstFittingLayout(layouts, 0), -1);
  EXPECT_EQ(FirstFittingLayout({layouts[0]}, 3), -1);  // no shrink allowed
}

}  // namespace
}  // namespace furnace::controller
