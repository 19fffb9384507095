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

}  // namespace
}  // namespace furnace::controller
