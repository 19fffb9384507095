// The controller's rendezvous: scopes keep keys apart (fencing), only an opened scope is usable,
// a closed scope ends its waits and stays closed, waits are answered through their callback exactly
// once (at once, by the Set that completes them, by Close, Shutdown or their timeout), and the
// indexed arrival barrier counts canonical indices only and says who is missing.
#include "controller/service/rendezvous.h"

#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace furnace::controller {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// A wait's answer, once it comes (the test fails if it came twice: set_value throws).
template <typename T>
struct Answer {
  std::promise<T> promise;
  std::future<T> future = promise.get_future();
  std::function<void(T)> Callback() {
    return [this](T v) { promise.set_value(std::move(v)); };
  }
  bool Ready(double wait_s = 0) {
    return future.wait_for(std::chrono::duration<double>(wait_s)) == std::future_status::ready;
  }
};
using ValuesAnswer = Answer<Rendezvous::Values>;
using ArrivalsAnswer = Answer<absl::StatusOr<Rendezvous::Arrivals>>;

// A rendezvous with the scopes open.
std::unique_ptr<Rendezvous> With(std::vector<Rendezvous::Scope> scopes) {
  auto r = std::make_unique<Rendezvous>();
  for (const auto& s : scopes) r->OpenScope(s, {});
  return r;
}

TEST(RendezvousTest, AScopeNeverOpenedIsRefused) {
  Rendezvous r;
  r.Set({"j", 1}, "k", "v");  // ignored
  EXPECT_TRUE(absl::IsFailedPrecondition(r.CheckOpen({"j", 1})));
  ValuesAnswer a;
  r.Get({"j", 1}, {"k"}, 30, a.Callback());
  ASSERT_TRUE(a.Ready());
  EXPECT_THAT(std::string(a.future.get().status().message()), HasSubstr("is not running"));
  r.OpenScope({"j", 1}, {});
  EXPECT_TRUE(r.CheckOpen({"j", 1}).ok());
  EXPECT_FALSE(r.Has({"j", 1}, "k"));
}

TEST(RendezvousTest, ScopesDoNotShareKeys) {
  auto owned = With({{"j", 1}, {"j", 2}, {"other", 1}});
  Rendezvous& r = *owned;
  r.Set({"j", 1}, "k", "attempt1");
  r.Set({"j", 2}, "k", "attempt2");
  ValuesAnswer v1;
  r.Get({"j", 1}, {"k"}, 0, v1.Callback());
  ASSERT_TRUE(v1.Ready());  // answered on the calling thread
  Rendezvous::Values values = v1.future.get();
  ASSERT_TRUE(values.ok()) << values.status();
  EXPECT_THAT(*values, ElementsAre("attempt1"));
  ValuesAnswer missing;
  r.Get({"other", 1}, {"k"}, 0.05, missing.Callback());
  Rendezvous::Values m = missing.future.get();
  EXPECT_TRUE(absl::IsDeadlineExceeded(m.status())) << m.status();
  EXPECT_THAT(std::string(m.status().message()), HasSubstr("rendezvous: keys still missing"));
  EXPECT_THAT(std::string(m.status().message()), HasSubstr("[k]"));
  EXPECT_TRUE(r.Has({"j", 2}, "k"));
  EXPECT_FALSE(r.Has({"j", 3}, "k"));
}

TEST(RendezvousTest, AWaitIsAnsweredByTheSetThatCompletesItInKeyOrder) {
  auto owned = With({{"j", 1}});
  Rendezvous& r = *owned;
  ValuesAnswer a;
  r.Get({"j", 1}, {"b", "a"}, 30, a.Callback());
  EXPECT_FALSE(a.Ready());
  r.Set({"j", 1}, "a", "1");
  EXPECT_FALSE(a.Ready());  // still misses b
  r.Set({"j", 1}, "b", "2");
  ASSERT_TRUE(a.Ready());  // the Set answered it, long before its timeout
  Rendezvous::Values values = a.future.get();
  ASSERT_TRUE(values.ok()) << values.status();
  EXPECT_THAT(*values, ElementsAre("2", "1"));
}

TEST(RendezvousTest, TimeoutNamesOnlyTheMissingKeys) {
  auto owned = With({{"j", 1}});
  Rendezvous& r = *owned;
  r.Set({"j", 1}, "here", "1");
  ValuesAnswer a;
  r.Get({"j", 1}, {"here", "gone1", "gone2"}, 0.05, a.Callback());
  Rendezvous::Values v = a.future.get();
  ASSERT_TRUE(absl::IsDeadlineExceeded(v.status())) << v.status();
  EXPECT_THAT(std::string(v.status().message()), HasSubstr("[gone1, gone2]"));
}

TEST(RendezvousTest, CloseEndsWaitsAndTheScopeStaysClosed) {
  auto owned = With({{"j", 1}, {"j", 2}});
  Rendezvous& r = *owned;
  r.Set({"j", 1}, "a", "1");
  ValuesAnswer waited;
  ArrivalsAnswer barrier;
  r.Get({"j", 1}, {"a", "never"}, 30, waited.Callback());
  r.WaitIndexed({"j", 1}, "arrived/", 4, 30, barrier.Callback());
  r.Close({"j", 1});
  ASSERT_TRUE(waited.Ready());
  ASSERT_TRUE(barrier.Ready());
  EXPECT_TRUE(absl::IsFailedPrecondition(waited.future.get().status()));
  EXPECT_TRUE(absl::IsFailedPrecondition(barrier.future.get().status()));
  r.Set({"j", 1}, "a", "again");  // ignored
  ValuesAnswer later;
  r.Get({"j", 1}, {"a"}, 0, later.Callback());
  EXPECT_TRUE(absl::IsFailedPrecondition(later.future.get().status()));
  EXPECT_FALSE(r.Has({"j", 1}, "a"));
  r.OpenScope({"j", 1}, {});  // a closed scope never opens again
  EXPECT_TRUE(absl::IsFailedPrecondition(r.CheckOpen({"j", 1})));
  // The next attempt's scope is unaffected.
  r.Set({"j", 2}, "a", "2");
  ValuesAnswer next;
  r.Get({"j", 2}, {"a"}, 0, next.Callback());
  EXPECT_TRUE(next.future.get().ok());
}

TEST(RendezvousTest, IndexedWaitCompletesWhenEveryIndexExists) {
  auto owned = With({{"j", 1}});
  Rendezvous& r = *owned;
  // Keys set before the first wait on the prefix count too.
  r.Set({"j", 1}, "arrived/0", "1");
  r.Set({"j", 1}, "arrived/2", "1");
  // Not indices of the prefix: a leading zero, a sign, another prefix, a number past the count.
  for (const char* key : {"arrived/01", "arrived/+1", "arrived/x", "other/1", "arrived/9"}) {
    r.Set({"j", 1}, key, "1");
  }
  ArrivalsAnswer now;
  r.WaitIndexed({"j", 1}, "arrived/", 4, 0, now.Callback());
  absl::StatusOr<Rendezvous::Arrivals> a = now.future.get();
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_FALSE(a->complete);
  EXPECT_EQ(a->present, 2u);
  EXPECT_THAT(a->missing, ElementsAre(1u, 3u));

  ArrivalsAnswer four, two;
  r.WaitIndexed({"j", 1}, "arrived/", 4, 30, four.Callback());
  r.WaitIndexed({"j", 1}, "arrived/", 2, 30, two.Callback());
  EXPECT_FALSE(four.Ready());
  r.Set({"j", 1}, "arrived/1", "1");
  ASSERT_TRUE(two.Ready());  // 0 and 1 exist: the smaller barrier is through
  EXPECT_TRUE(two.future.get()->complete);
  EXPECT_FALSE(four.Ready());
  r.Set({"j", 1}, "arrived/3", "1");
  ASSERT_TRUE(four.Ready());
  absl::StatusOr<Rendezvous::Arrivals> all = four.future.get();
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_TRUE(all->complete);
  EXPECT_EQ(all->present, 4u);
  EXPECT_TRUE(all->missing.empty());
}

TEST(RendezvousTest, IndexedWaitTimesOutWithTheMissingIndicesBounded) {
  auto owned = With({{"j", 1}});
  Rendezvous& r = *owned;
  constexpr uint32_t kRanks = 1000;
  for (uint32_t i = 0; i < kRanks; i += 2) r.Set({"j", 1}, "a/" + std::to_string(i), "1");
  ArrivalsAnswer a;
  r.WaitIndexed({"j", 1}, "a/", kRanks, 0.05, a.Callback());
  absl::StatusOr<Rendezvous::Arrivals> got = a.future.get();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_FALSE(got->complete);
  EXPECT_EQ(got->present, kRanks / 2);
  ASSERT_EQ(got->missing.size(), Rendezvous::kMaxMissingListed);
  EXPECT_EQ(got->missing[0], 1u);
  EXPECT_EQ(got->missing[1], 3u);
  ArrivalsAnswer too_many;
  r.WaitIndexed({"j", 1}, "a/", Rendezvous::kMaxIndexedCount + 1, 1, too_many.Callback());
  EXPECT_TRUE(absl::IsInvalidArgument(too_many.future.get().status()));
}

TEST(RendezvousTest, ShutdownAnswersEveryWaitUnavailable) {
  auto owned = With({{"j", 1}});
  Rendezvous& r = *owned;
  ValuesAnswer waiting;
  ArrivalsAnswer barrier;
  r.Get({"j", 1}, {"x"}, 30, waiting.Callback());
  r.WaitIndexed({"j", 1}, "a/", 2, 30, barrier.Callback());
  r.Shutdown();
  ASSERT_TRUE(waiting.Ready());
  ASSERT_TRUE(barrier.Ready());
  EXPECT_TRUE(absl::IsUnavailable(waiting.future.get().status()));
  EXPECT_TRUE(absl::IsUnavailable(barrier.future.get().status()));
  ValuesAnswer after;
  r.Get({"j", 1}, {"x"}, 30, after.Callback());
  ASSERT_TRUE(after.Ready());
  EXPECT_TRUE(absl::IsUnavailable(after.future.get().status()));
}

// Thousands of ranks wait at once without a thread each, and every one is answered exactly once
// when the last arrives, whichever thread sets the keys.
TEST(RendezvousTest, ThousandsOfConcurrentWaitsAreAnsweredOnce) {
  auto owned = With({{"j", 1}});
  Rendezvous& r = *owned;
  constexpr uint32_t kRanks = 4096;
  std::atomic<uint32_t> complete{0}, answers{0};
  for (uint32_t i = 0; i < kRanks; ++i) {
    r.WaitIndexed({"j", 1}, "arrived/", kRanks, 30, [&](absl::StatusOr<Rendezvous::Arrivals> a) {
      ++answers;
      if (a.ok() && a->complete) ++complete;
    });
  }
  std::vector<std::thread> setters;
  for (int t = 0; t < 4; ++t) {
    setters.emplace_back([&, t] {
      for (uint32_t i = t; i < kRanks; i += 4) r.Set({"j", 1}, "arrived/" + std::to_string(i), "1");
    });
  }
  for (auto& t : setters) t.join();
  EXPECT_EQ(complete.load(), kRanks);
  EXPECT_EQ(answers.load(), kRanks);
}

}  // namespace
}  // namespace furnace::controller
