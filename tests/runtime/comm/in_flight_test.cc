#include "runtime/comm/in_flight.h"

#include <chrono>
#include <thread>

#include "gtest/gtest.h"
#include "runtime/comm/local_communicator.h"

namespace furnace::comm {
namespace {

TEST(InFlightCollectivesTest, TheOldestCallInFlightAndHowLong) {
  FakeClock clock;
  InFlightCollectives registry(clock);
  EXPECT_FALSE(registry.Oldest().has_value());
  clock.Advance(1);
  const uint64_t first = registry.Begin("all_to_all", "ep[0,1]", 2);
  clock.Advance(2);
  const uint64_t second = registry.Begin("recv", "pp[0,1]", 2, /*peer=*/1);
  ASSERT_TRUE(registry.Oldest().has_value());
  EXPECT_EQ(registry.Oldest()->op, "all_to_all");
  EXPECT_DOUBLE_EQ(registry.Oldest()->since_s, 1);
  EXPECT_EQ(registry.count(), 2u);
  registry.End(first);
  EXPECT_EQ(registry.Oldest()->op, "recv");
  EXPECT_EQ(registry.Oldest()->peer, 1);
  registry.End(second);
  EXPECT_EQ(registry.count(), 0u);
}

// A member blocked in a collective its peer has not joined is marked in the process registry
// with the op and the group, and unmarked once the collective completes.
TEST(InFlightCollectivesTest, ACommunicatorMarksTheCallItIsBlockedIn) {
  LocalGroup group(2, {.name = "dp[0,1]", .timeout_s = 30});
  std::unique_ptr<Communicator> a = group.Member(0);
  std::unique_ptr<Communicator> b = group.Member(1);
  const size_t before = ProcessInFlight().count();
  float x = 1, y = 2;
  std::thread blocked([&] { EXPECT_TRUE(a->AllReduce(&x, 1).ok()); });
  std::optional<InFlightCall> call;
  for (int i = 0; i < 1000 && !call; ++i) {
    call = ProcessInFlight().Oldest();
    if (!call) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_TRUE(call.has_value());
  EXPECT_EQ(call->op, "all_reduce");
  EXPECT_EQ(call->group, "dp[0,1]");
  EXPECT_EQ(call->group_size, 2);
  EXPECT_EQ(ProcessInFlight().count(), before + 1);
  EXPECT_TRUE(b->AllReduce(&y, 1).ok());
  blocked.join();
  EXPECT_EQ(x, 3);
  EXPECT_EQ(ProcessInFlight().count(), before);
}

}  // namespace
}  // namespace furnace::comm
