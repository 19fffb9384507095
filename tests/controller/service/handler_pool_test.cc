// The controller's small concurrency parts: the HandlerPool runs what is posted and refuses more
// than its bound (load shedding), draining what is queued when destroyed; the DeadlineTimer runs
// callbacks in deadline order on its thread, also callbacks that add more.
#include "controller/service/handler_pool.h"

#include <atomic>
#include <chrono>
#include <future>
#include <mutex>
#include <vector>

#include "controller/service/deadline_timer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace furnace::controller {
namespace {

using ::testing::ElementsAre;

TEST(HandlerPoolTest, RefusesPastItsBoundAndDrainsWhenDestroyed) {
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  std::atomic<int> ran{0};
  uint64_t refused = 0;
  {
    HandlerPool pool(1, 3);
    std::promise<void> started;
    ASSERT_TRUE(pool.TryPost([&] {
      started.set_value();
      released.wait();
      ++ran;
    }));
    started.get_future().wait();  // the thread is busy: what follows queues
    for (int i = 0; i < 3; ++i) EXPECT_TRUE(pool.TryPost([&] { ++ran; }));
    EXPECT_EQ(pool.queued(), 3u);
    EXPECT_FALSE(pool.TryPost([&] { ran += 100; }));  // full: refused, never run
    refused = pool.refused();
    release.set_value();
  }
  EXPECT_EQ(ran.load(), 4);
  EXPECT_EQ(refused, 1u);
}

TEST(DeadlineTimerTest, RunsCallbacksInDeadlineOrder) {
  DeadlineTimer timer;
  std::mutex mu;
  std::vector<int> order;
  std::promise<void> done;
  timer.After(0.06, [&] {
    std::lock_guard<std::mutex> lock(mu);
    order.push_back(3);
    done.set_value();
  });
  timer.After(0.02, [&] {
    std::lock_guard<std::mutex> lock(mu);
    order.push_back(1);
    // A callback may schedule another (the timer's lock is not held while it runs).
    timer.After(0.01, [&] {
      std::lock_guard<std::mutex> lock(mu);
      order.push_back(2);
    });
  });
  timer.After(-1, [&] {
    std::lock_guard<std::mutex> lock(mu);
    order.push_back(0);
  });
  ASSERT_EQ(done.get_future().wait_for(std::chrono::seconds(10)), std::future_status::ready);
  std::lock_guard<std::mutex> lock(mu);
  EXPECT_THAT(order, ElementsAre(0, 1, 2, 3));
  EXPECT_EQ(timer.pending(), 0u);
}

TEST(DeadlineTimerTest, DropsWhatIsNotDueWhenDestroyed) {
  std::atomic<bool> ran{false};
  {
    DeadlineTimer timer;
    timer.After(60, [&] { ran = true; });
    EXPECT_EQ(timer.pending(), 1u);
  }
  EXPECT_FALSE(ran.load());
}

}  // namespace
}  // namespace furnace::controller
