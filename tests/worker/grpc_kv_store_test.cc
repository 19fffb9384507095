#include "worker/grpc_kv_store.h"

#include <chrono>
#include <thread>

#include "fake_agent_service.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace furnace::worker {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

furnace::v1::KvScope Scope(uint32_t attempt) {
  furnace::v1::KvScope scope;
  scope.set_job_id("job-1");
  scope.set_attempt(attempt);
  return scope;
}

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

TEST(GrpcKvStoreTest, SetThenGet) {
  testing::FakeController controller;
  GrpcKvStore store(controller.NewStub(), Scope(1));
  ASSERT_TRUE(store.Set("a", "1").ok());
  ASSERT_TRUE(store.Set("b", std::string("\0bin", 4)).ok());
  absl::StatusOr<std::vector<std::string>> values = store.Get({"b", "a"}, 1.0);
  ASSERT_TRUE(values.ok()) << values.status();
  EXPECT_THAT(*values, ElementsAre(std::string("\0bin", 4), "1"));
  EXPECT_GT(controller.service.last_get_timeout_s, 0.5);
  EXPECT_LE(controller.service.last_get_timeout_s, 1.0);
}

TEST(GrpcKvStoreTest, ScopesAreSeparate) {
  testing::FakeController controller;
  GrpcKvStore attempt1(controller.NewStub(), Scope(1));
  GrpcKvStore attempt2(controller.NewStub(), Scope(2));
  ASSERT_TRUE(attempt1.Set("a", "old").ok());
  EXPECT_EQ(attempt2.Get({"a"}, 0.2).status().code(), absl::StatusCode::kDeadlineExceeded);
}

TEST(GrpcKvStoreTest, GetWaitsForALaterSet) {
  testing::FakeController controller;
  GrpcKvStore store(controller.NewStub(), Scope(1));
  std::thread setter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    EXPECT_TRUE(store.Set("late", "x").ok());
  });
  absl::StatusOr<std::vector<std::string>> values = store.Get({"late"}, 5.0);
  setter.join();
  ASSERT_TRUE(values.ok()) << values.status();
  EXPECT_THAT(*values, ElementsAre("x"));
}

TEST(GrpcKvStoreTest, GetTimesOutNamingTheMissingKeys) {
  testing::FakeController controller;
  GrpcKvStore store(controller.NewStub(), Scope(1));
  const double start = Now();
  absl::StatusOr<std::vector<std::string>> values = store.Get({"never"}, 0.3);
  EXPECT_EQ(values.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(std::string(values.status().message()), HasSubstr("never"));
  EXPECT_GE(Now() - start, 0.29);  // not before the timeout
  // The controller was asked to wait no longer than the caller's timeout.
  std::lock_guard<std::mutex> lock(controller.service.mu);
  EXPECT_GT(controller.service.last_get_timeout_s, 0.0);
  EXPECT_LE(controller.service.last_get_timeout_s, 0.3);
}

TEST(GrpcKvStoreTest, WaitIndexedWaitsForEveryIndexAndSaysWhoIsMissing) {
  testing::FakeController controller;
  GrpcKvStore store(controller.NewStub(), Scope(1));
  ASSERT_TRUE(store.Set("arrived/0", "1").ok());
  ASSERT_TRUE(store.Set("arrived/2", "1").ok());
  absl::StatusOr<GrpcKvStore::Arrivals> partial = store.WaitIndexed("arrived/", 4, 0.2);
  ASSERT_TRUE(partial.ok()) << partial.status();  // the end of the wait is an answer
  EXPECT_FALSE(partial->complete);
  EXPECT_EQ(partial->present, 2u);
  EXPECT_THAT(partial->missing, ElementsAre(1u, 3u));
  std::thread setter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    EXPECT_TRUE(store.Set("arrived/1", "1").ok());
    EXPECT_TRUE(store.Set("arrived/3", "1").ok());
  });
  absl::StatusOr<GrpcKvStore::Arrivals> all = store.WaitIndexed("arrived/", 4, 5.0);
  setter.join();
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_TRUE(all->complete);
  EXPECT_EQ(all->present, 4u);
  EXPECT_TRUE(all->missing.empty());
}

TEST(GrpcKvStoreTest, FencedAttemptIsNotRetried) {
  testing::FakeController controller;
  controller.service.min_attempt = 2;
  GrpcKvStore store(controller.NewStub(), Scope(1));
  EXPECT_EQ(store.Set("a", "1").code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(store.Get({"a"}, 5.0).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(store.WaitIndexed("a/", 2, 5.0).status().code(), absl::StatusCode::kFailedPrecondition);
  std::lock_guard<std::mutex> lock(controller.service.mu);
  EXPECT_EQ(controller.service.kv_calls, 3);
}

TEST(GrpcKvStoreTest, UnavailableIsRetried) {
  testing::FakeController controller;
  controller.service.unavailable_kv_calls = 4;
  GrpcKvStore store(controller.NewStub(), Scope(1));
  ASSERT_TRUE(store.Set("a", "1").ok());  // 2 refusals, then served
  absl::StatusOr<std::vector<std::string>> values = store.Get({"a"}, 5.0);  // 2 more
  ASSERT_TRUE(values.ok()) << values.status();
  std::lock_guard<std::mutex> lock(controller.service.mu);
  EXPECT_EQ(controller.service.kv_calls, 6);
}

TEST(GrpcKvStoreTest, UnreachableControllerTimesOut) {
  // Nothing listens on port 1: every call is UNAVAILABLE until the overall timeout.
  GrpcKvStore store(furnace::v1::AgentService::NewStub(
                        grpc::CreateChannel("127.0.0.1:1", grpc::InsecureChannelCredentials())),
                    Scope(1), /*set_timeout_s=*/0.3);
  const double start = Now();
  EXPECT_EQ(store.Get({"a"}, 0.5).status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_GE(Now() - start, 0.45);  // not before the timeout (ctest's timeout catches a hang)
  EXPECT_EQ(store.Set("a", "1").code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace furnace::worker
