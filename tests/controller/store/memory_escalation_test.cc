#include "controller/store/memory_escalation.h"

#include "gtest/gtest.h"

namespace furnace::controller {
namespace {

TEST(MemoryEscalationTest, StaticPoliciesClimbTheLadderOneRungAtATime) {
  EXPECT_EQ(EscalatedMemoryPolicy("none"), "selective");
  EXPECT_EQ(EscalatedMemoryPolicy(""), "selective");  // an unset policy is none
  EXPECT_EQ(EscalatedMemoryPolicy("selective"), "full_recompute");
}

TEST(MemoryEscalationTest, OffloadAndAdaptiveFallBackToFullRecompute) {
  EXPECT_EQ(EscalatedMemoryPolicy("offload"), "full_recompute");
  EXPECT_EQ(EscalatedMemoryPolicy("adaptive"), "full_recompute");
}

TEST(MemoryEscalationTest, NothingIsLeftAfterFullRecompute) {
  EXPECT_EQ(EscalatedMemoryPolicy("full_recompute"), std::nullopt);
  EXPECT_EQ(EscalatedMemoryPolicy("bogus"), std::nullopt);
}

}  // namespace
}  // namespace furnace::controller
