// GroupCommit: writes queued from many threads land in few transactions, each caller is answered
// once its transaction is committed, a failed write fails (and rolls back) exactly the writes of
// its transaction, and destruction commits what is still queued.
#include "controller/store/group_commit.h"

#include <atomic>
#include <filesystem>
#include <future>
#include <thread>

#include "gtest/gtest.h"
#include "tests/testing/test_dir.h"

namespace furnace::controller {
namespace {

std::unique_ptr<JobStore> OpenStore() {
  const std::filesystem::path dir = testing_util::RemovedAtExit("furnace-group-commit-test");
  auto store = JobStore::Open((dir / "furnace.db").string());
  EXPECT_TRUE(store.ok()) << store.status();
  return std::move(*store);
}

size_t Keys(JobStore& store) {
  auto kv = store.KvLoad("j", 1);
  EXPECT_TRUE(kv.ok()) << kv.status();
  return kv.ok() ? kv->size() : 0;
}

TEST(GroupCommitTest, ConcurrentWritesShareTransactionsAndAreDurableWhenAnswered) {
  std::unique_ptr<JobStore> store = OpenStore();
  GroupCommit commit(*store);
  constexpr int kThreads = 8, kPerThread = 100;
  std::atomic<int> answered{0}, visible_when_answered{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i) {
        const std::string key = std::to_string(t) + "/" + std::to_string(i);
        ASSERT_TRUE(commit.Run([&] { return store->KvPut("j", 1, key, "v"); }).ok());
        ++answered;
        // Answered: the row is committed (a read on the same connection sees it).
        auto kv = store->KvLoad("j", 1);
        ASSERT_TRUE(kv.ok());
        for (const auto& [k, v] : *kv) {
          if (k == key) ++visible_when_answered;
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(answered.load(), kThreads * kPerThread);
  EXPECT_EQ(visible_when_answered.load(), kThreads * kPerThread);
  EXPECT_EQ(Keys(*store), static_cast<size_t>(kThreads * kPerThread));
  EXPECT_LE(commit.commits(), static_cast<uint64_t>(kThreads * kPerThread));
}

TEST(GroupCommitTest, AFailedWriteFailsItsWholeTransaction) {
  std::unique_ptr<JobStore> store = OpenStore();
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  GroupCommit commit(*store);
  // The first write holds the committer until the next three are queued behind it: they share
  // the next transaction, in which the second fails.
  std::promise<absl::Status> first, a, b, c;
  std::promise<void> started;
  commit.Submit(
      [&] {
        started.set_value();
        released.wait();
        return store->KvPut("j", 1, "first", "v");
      },
      [&](absl::Status s) { first.set_value(s); });
  started.get_future().wait();  // the committer holds "first" alone
  commit.Submit([&] { return store->KvPut("j", 1, "a", "v"); },
                [&](absl::Status s) { a.set_value(s); });
  commit.Submit([] { return absl::InternalError("disk full"); },
                [&](absl::Status s) { b.set_value(s); });
  commit.Submit([&] { return store->KvPut("j", 1, "c", "v"); },
                [&](absl::Status s) { c.set_value(s); });
  release.set_value();
  EXPECT_TRUE(first.get_future().get().ok());
  const absl::Status sa = a.get_future().get(), sb = b.get_future().get(),
                     sc = c.get_future().get();
  // Every write of the failed transaction failed with its error and none of its rows landed.
  EXPECT_EQ(sb.message(), "disk full");
  EXPECT_EQ(sa, sb);
  EXPECT_EQ(sc, sb);
  auto kv = store->KvLoad("j", 1);
  ASSERT_TRUE(kv.ok());
  for (const auto& [k, v] : *kv) EXPECT_NE(k, "a");
  // The committer goes on after a failure.
  EXPECT_TRUE(commit.Run([&] { return store->KvPut("j", 1, "after", "v"); }).ok());
}

TEST(GroupCommitTest, DestructionCommitsWhatIsQueued) {
  std::unique_ptr<JobStore> store = OpenStore();
  std::atomic<int> done{0};
  {
    GroupCommit commit(*store);
    for (int i = 0; i < 50; ++i) {
      commit.Submit([&store, i] { return store->KvPut("j", 1, std::to_string(i), "v"); },
                    [&](absl::Status s) {
                      EXPECT_TRUE(s.ok()) << s;
                      ++done;
                    });
    }
  }
  EXPECT_EQ(done.load(), 50);
  EXPECT_EQ(Keys(*store), 50u);
}

}  // namespace
}  // namespace furnace::controller
