#include "controller/store/backoff.h"

#include "gtest/gtest.h"

namespace furnace::controller {
namespace {

TEST(BackoffTest, ExponentialThenCapped) {
  v1::BackoffSpec spec;
  spec.set_initial_s(1.0);
  spec.set_multiplier(2.0);
  spec.set_max_s(5.0);
  EXPECT_DOUBLE_EQ(BackoffDelay(spec, 0), 0.0);
  EXPECT_DOUBLE_EQ(BackoffDelay(spec, 1), 1.0);
  EXPECT_DOUBLE_EQ(BackoffDelay(spec, 2), 2.0);
  EXPECT_DOUBLE_EQ(BackoffDelay(spec, 3), 4.0);
  EXPECT_DOUBLE_EQ(BackoffDelay(spec, 4), 5.0);
  EXPECT_DOUBLE_EQ(BackoffDelay(spec, 40), 5.0);
}

TEST(BackoffTest, MultiplierOneIsConstant) {
  v1::BackoffSpec spec;
  spec.set_initial_s(0.5);
  spec.set_multiplier(1.0);
  spec.set_max_s(30);
  for (uint32_t n = 1; n < 10; ++n) EXPECT_DOUBLE_EQ(BackoffDelay(spec, n), 0.5);
}

}  // namespace
}  // namespace furnace::controller
