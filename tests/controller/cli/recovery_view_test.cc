// The recoveries section of `furnace status`.
#include "controller/cli/recovery_view.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace furnace::cli {
namespace {

using ::testing::HasSubstr;

TEST(RecoveryView, OneRowPerRecoveryWithItsPhasesAndTheLongest) {
  furnace::v1::JobDetail job;
  job.add_attempts()->set_attempt(1);
  furnace::v1::AttemptInfo* second = job.add_attempts();
  second->set_attempt(2);
  furnace::v1::RecoveryPhases* p = second->mutable_recovery();
  p->set_from_attempt(1);
  p->set_total_s(6.5);
  p->set_detection_s(0.05);
  p->set_backoff_s(1);
  p->set_setup_s(3.25);
  p->set_dominant("setup");
  const std::string text = RenderRecoverySection(job);
  EXPECT_THAT(text, HasSubstr("recoveries (failure -> first step of the next attempt"));
  EXPECT_THAT(text, HasSubstr("ATTEMPT"));
  EXPECT_THAT(text, HasSubstr("CKPT LOAD"));
  EXPECT_THAT(text, HasSubstr("1 -> 2"));
  EXPECT_THAT(text, HasSubstr("6.50 s"));
  EXPECT_THAT(text, HasSubstr("3.25 s"));
  EXPECT_THAT(text, HasSubstr("setup"));
}

TEST(RecoveryView, NothingWithoutARecovery) {
  furnace::v1::JobDetail job;
  job.add_attempts()->set_attempt(1);
  EXPECT_EQ(RenderRecoverySection(job), "");
}

}  // namespace
}  // namespace furnace::cli
