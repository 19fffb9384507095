// fault.mean_steps: the number of computed steps after which an attempt fails (fault_schedule.h).
#include "worker/fault_schedule.h"

#include <gtest/gtest.h>

#include <set>

namespace furnace::worker {
namespace {

TEST(FaultAfterSteps, IsAPureFunctionOfMeanSeedAndAttempt) {
  EXPECT_EQ(FaultAfterSteps(200, 3, 1), FaultAfterSteps(200, 3, 1));
  std::set<uint64_t> draws;
  for (uint32_t attempt = 1; attempt <= 20; ++attempt)
    draws.insert(FaultAfterSteps(200, 3, attempt));
  EXPECT_GT(draws.size(), 15u);  // attempts draw apart
  EXPECT_NE(FaultAfterSteps(200, 3, 1), FaultAfterSteps(200, 4, 1));
  EXPECT_EQ(FaultAfterSteps(1, 3, 1), 1u);
}

TEST(FaultAfterSteps, IsGeometricWithTheGivenMean) {
  constexpr int kDraws = 20000;
  double sum = 0;
  int first_step = 0;
  for (int i = 0; i < kDraws; ++i) {
    const uint64_t k = FaultAfterSteps(50, 1000 + i, 1);
    ASSERT_GE(k, 1u);
    sum += static_cast<double>(k);
    if (k == 1) ++first_step;
  }
  // Mean 50 (standard error 50 / sqrt(20000) = 0.35); P(K = 1) = 1/50.
  EXPECT_NEAR(sum / kDraws, 50.0, 2.0);
  EXPECT_NEAR(static_cast<double>(first_step) / kDraws, 0.02, 0.004);
}

}  // namespace
}  // namespace furnace::worker
