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

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
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

// What one attempt may keep is bounded, scaled by its ranks: its ranks run the job's code, and
// every key stays in memory and in the store until the attempt ends.
TEST(RendezvousTest, AnAttemptsKeysAndBytesAreBounded) {
  Rendezvous r;
  r.OpenScope({"j", 1}, {"w/0", "w/1"});  // two ranks
  const Rendezvous::Limits limits = Rendezvous::LimitsFor(2);
  EXPECT_EQ(limits.value_bytes, (64u << 10) + 2 * 256);
  EXPECT_EQ(limits.keys, 1024u + 2 * 64);
  EXPECT_EQ(limits.bytes, (64u << 20) + 2 * 4 * limits.value_bytes);

  // A value: at most 64 KiB + 256 bytes a rank (a Gloo group's addresses take 136 a peer).
  EXPECT_TRUE(r.Admit({"j", 1}, "gloo/0/0", limits.value_bytes).ok());
  absl::Status big = r.Admit({"j", 1}, "gloo/0/1", limits.value_bytes + 1);
  EXPECT_TRUE(absl::IsResourceExhausted(big)) << big;
  EXPECT_THAT(std::string(big.message()),
              HasSubstr("a value of 66049 bytes for key gloo/0/1 in attempt 1 of job j (2 ranks); "
                        "a value is at most 66048 bytes"));
  absl::Status long_key = r.Admit({"j", 1}, std::string(Rendezvous::kMaxKeyBytes + 1, 'k'), 1);
  EXPECT_TRUE(absl::IsResourceExhausted(long_key)) << long_key;
  EXPECT_THAT(std::string(long_key.message()), HasSubstr("a key is at most 1 KiB"));
  EXPECT_TRUE(absl::IsFailedPrecondition(r.Admit({"j", 2}, "k", 1)));  // not open

  // Keys: at most 1,024 + 64 a rank; a key set again counts once.
  for (size_t i = 1; i < limits.keys; ++i) {
    ASSERT_TRUE(r.Admit({"j", 1}, absl::StrCat("k", i), 1).ok()) << i;
  }
  EXPECT_TRUE(r.Admit({"j", 1}, "k1", 2).ok());
  absl::Status many = r.Admit({"j", 1}, "one-more", 1);
  EXPECT_TRUE(absl::IsResourceExhausted(many)) << many;
  EXPECT_THAT(std::string(many.message()),
              HasSubstr("attempt 1 of job j (2 ranks) holds 1152 keys, the most it may"));

  // Bytes: at most 64 MiB + 4 of the largest values a rank, in all. Admit counts sizes, so no
  // value of that size is ever made here.
  r.OpenScope({"j", 3}, {"w/0", "w/1"});
  size_t admitted = 0;
  absl::Status full;
  while ((full = r.Admit({"j", 3}, absl::StrFormat("v%04d", admitted), limits.value_bytes)).ok()) {
    ++admitted;
  }
  EXPECT_EQ(admitted, limits.bytes / (limits.value_bytes + 5));
  EXPECT_TRUE(absl::IsResourceExhausted(full)) << full;
  EXPECT_THAT(std::string(full.message()), HasSubstr("bytes of keys and values, over the"));

  // A scope reloaded after a controller restart counts the keys it already holds.
  r.OpenScope({"j", 4}, {});
  for (size_t i = 0; i < Rendezvous::LimitsFor(0).keys; ++i) r.Set({"j", 4}, absl::StrCat(i), "");
  EXPECT_TRUE(absl::IsResourceExhausted(r.Admit({"j", 4}, "new", 1)));
  EXPECT_TRUE(r.Admit({"j", 4}, "0", 1).ok());  // one it holds, again
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
