#include "controller/service/rate_limiter.h"

#include <string>

#include "controller/service/caller_identity.h"
#include "gtest/gtest.h"
#include "runtime/base/clock.h"

namespace furnace::controller {
namespace {

TEST(RateLimiterTest, BurstThenRatePerIdentity) {
  FakeClock clock;
  RateLimiter limiter(/*rate=*/2.0, /*burst=*/3.0, clock);
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(limiter.Admit("alice").ok()) << i;
  absl::Status refused = limiter.Admit("alice");
  ASSERT_TRUE(absl::IsResourceExhausted(refused)) << refused;
  EXPECT_EQ(refused.message(),
            "submission rate limit for alice: 3 at once, then 2 per second (--submit-burst, "
            "--submit-rate); retry in 0.5 s");
  // Another caller has a bucket of its own.
  EXPECT_TRUE(limiter.Admit("bob").ok());
  // Tokens come back at the rate: half a second gives one.
  clock.Advance(0.25);
  EXPECT_FALSE(limiter.Admit("alice").ok());
  clock.Advance(0.25);
  EXPECT_TRUE(limiter.Admit("alice").ok());
  EXPECT_FALSE(limiter.Admit("alice").ok());
  // A long pause refills to the burst, not beyond.
  clock.Advance(3600);
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(limiter.Admit("alice").ok()) << i;
  EXPECT_FALSE(limiter.Admit("alice").ok());
}

TEST(RateLimiterTest, ZeroRateMeansNoLimit) {
  FakeClock clock;
  RateLimiter limiter(0.0, 1.0, clock);
  for (int i = 0; i < 1000; ++i) ASSERT_TRUE(limiter.Admit("x").ok());
}

TEST(RateLimiterTest, ManyCallersDoNotGrowItWithoutBound) {
  FakeClock clock;
  RateLimiter limiter(1.0, 1.0, clock);
  // Each distinct caller spends its token; a second later all buckets are full again and can be
  // dropped, so the refusals stay correct for the callers that are still over their limit.
  for (size_t i = 0; i < RateLimiter::kMaxIdle + 10; ++i) {
    ASSERT_TRUE(limiter.Admit("peer-" + std::to_string(i)).ok());
  }
  clock.Advance(0.5);
  EXPECT_FALSE(limiter.Admit("peer-0").ok());
  clock.Advance(1.0);
  EXPECT_TRUE(limiter.Admit("peer-1").ok());
  EXPECT_FALSE(limiter.Admit("peer-1").ok());
}

TEST(CallerIdentityTest, APeerWithoutAnIdentityIsItsHostWithoutThePort) {
  EXPECT_EQ(PeerHost("ipv4:127.0.0.1:53412"), "ipv4:127.0.0.1");
  EXPECT_EQ(PeerHost("ipv6:[::1]:5000"), "ipv6:[::1]");
  EXPECT_EQ(PeerHost("ipv6:[::1]"), "ipv6:[::1]");
  EXPECT_EQ(PeerHost("unix:/run/furnace.sock"), "unix:/run/furnace.sock");
}

}  // namespace
}  // namespace furnace::controller
