#include "controller/store/memory_escalation.h"

#include "gtest/gtest.h"

namespace furnace::controller {
namespace {

constexpr uint64_t kBudget = 4u << 20;

TEST(MemoryEscalationTest, WithABudgetEveryPolicyButAdaptiveGoesToAdaptive) {
  // Adaptive needs the least of all at a budget: no static rung fits a step it cannot.
  for (const char* policy : {"", "none", "selective", "full_recompute", "offload"}) {
    EXPECT_EQ(EscalatedMemoryPolicy(policy, kBudget), "adaptive") << policy;
  }
}

TEST(MemoryEscalationTest, AnAdaptiveAttemptThatRanOutHasNothingLeft) {
  EXPECT_EQ(EscalatedMemoryPolicy("adaptive", kBudget), std::nullopt);
}

TEST(MemoryEscalationTest, WithoutABudgetStaticPoliciesClimbTheLadderOneRungAtATime) {
  EXPECT_EQ(EscalatedMemoryPolicy("none", 0), "selective");
  EXPECT_EQ(EscalatedMemoryPolicy("", 0), "selective");  // an unset policy is none
  EXPECT_EQ(EscalatedMemoryPolicy("selective", 0), "full_recompute");
  EXPECT_EQ(EscalatedMemoryPolicy("offload", 0), "full_recompute");
  EXPECT_EQ(EscalatedMemoryPolicy("full_recompute", 0), std::nullopt);
}

TEST(MemoryEscalationTest, AWordTheLadderDoesNotKnowHasNoRung) {
  EXPECT_EQ(EscalatedMemoryPolicy("bogus", 0), std::nullopt);
  EXPECT_EQ(EscalatedMemoryPolicy("bogus", kBudget), std::nullopt);
}

}  // namespace
}  // namespace furnace::controller
