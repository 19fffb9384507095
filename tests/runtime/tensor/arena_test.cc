#include "runtime/tensor/arena.h"

#include <cstring>
#include <memory>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace furnace::tensor {
namespace {

using ::testing::HasSubstr;

class ArenaTest : public ::testing::Test {
 protected:
  std::unique_ptr<device::Device> device_ = device::CreateCpuDevice();
};

TEST_F(ArenaTest, CountsCurrentAndPeakAndReleasesOnDestruction) {
  DeviceArena arena(*device_, 0);
  EXPECT_EQ(arena.budget(), 0u);
  {
    absl::StatusOr<Buffer> a = arena.Allocate(100, "a");
    ASSERT_TRUE(a.ok()) << a.status();
    std::memset(a->data(), 1, 100);
    absl::StatusOr<Buffer> b = arena.Allocate(50, "b");
    ASSERT_TRUE(b.ok());
    EXPECT_EQ(arena.current_bytes(), 150u);
    EXPECT_EQ(arena.peak_bytes(), 150u);
    a->Reset();
    EXPECT_FALSE(a->valid());
    EXPECT_EQ(arena.current_bytes(), 50u);
    EXPECT_EQ(arena.peak_bytes(), 150u);
  }
  EXPECT_EQ(arena.current_bytes(), 0u);
  EXPECT_EQ(arena.peak_bytes(), 150u);
  arena.ResetPeak();
  EXPECT_EQ(arena.peak_bytes(), 0u);
}

TEST_F(ArenaTest, MoveTransfersOwnership) {
  DeviceArena arena(*device_, 0);
  absl::StatusOr<Buffer> a = arena.Allocate(64, "moved");
  ASSERT_TRUE(a.ok());
  Buffer b = std::move(*a);
  EXPECT_FALSE(a->valid());
  EXPECT_TRUE(b.valid());
  EXPECT_EQ(b.bytes(), 64u);
  EXPECT_EQ(b.tag(), "moved");
  EXPECT_EQ(arena.current_bytes(), 64u);
  std::vector<Buffer> held;
  held.push_back(std::move(b));
  EXPECT_EQ(arena.current_bytes(), 64u);
  held.clear();
  EXPECT_EQ(arena.current_bytes(), 0u);
}

TEST_F(ArenaTest, BudgetExactFitSucceedsOneByteMoreFailsWithSizes) {
  DeviceArena arena(*device_, 1000);
  absl::StatusOr<Buffer> a = arena.Allocate(600, "first");
  ASSERT_TRUE(a.ok());
  absl::StatusOr<Buffer> too_big = arena.Allocate(401, "layers.1.moe.expert_hidden");
  ASSERT_FALSE(too_big.ok());
  EXPECT_EQ(too_big.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(too_big.status().message(), HasSubstr("401 bytes"));
  EXPECT_THAT(too_big.status().message(), HasSubstr("layers.1.moe.expert_hidden"));
  EXPECT_THAT(too_big.status().message(), HasSubstr("600 bytes in use"));
  EXPECT_THAT(too_big.status().message(), HasSubstr("budget of 1000"));
  EXPECT_EQ(arena.current_bytes(), 600u);  // a failed request holds nothing
  absl::StatusOr<Buffer> fits = arena.Allocate(400, "exact");
  EXPECT_TRUE(fits.ok());
  EXPECT_EQ(arena.current_bytes(), 1000u);
}

TEST_F(ArenaTest, ZeroBytesIsFreeAndNull) {
  DeviceArena arena(*device_, 1);
  absl::StatusOr<Buffer> a = arena.Allocate(0, "empty");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->data(), nullptr);
  EXPECT_EQ(arena.current_bytes(), 0u);
}

TEST_F(ArenaTest, SetBudgetAppliesToLaterRequests) {
  DeviceArena arena(*device_, 0);
  absl::StatusOr<Buffer> a = arena.Allocate(100, "a");
  ASSERT_TRUE(a.ok());
  arena.set_budget(150);
  EXPECT_FALSE(arena.Allocate(51, "b").ok());
  EXPECT_TRUE(arena.Allocate(50, "c").ok());
}

}  // namespace
}  // namespace furnace::tensor
