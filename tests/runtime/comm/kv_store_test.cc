#include "runtime/base/kv_store.h"

#include <chrono>
#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace furnace {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

TEST(InMemoryKvStoreTest, SetThenGetReturnsValuesInKeyOrder) {
  InMemoryKvStore store;
  ASSERT_TRUE(store.Set("a", "1").ok());
  ASSERT_TRUE(store.Set("b", "2").ok());
  absl::StatusOr<std::vector<std::string>> values = store.Get({"b", "a"}, 0);
  ASSERT_TRUE(values.ok()) << values.status();
  EXPECT_THAT(*values, ElementsAre("2", "1"));
}

TEST(InMemoryKvStoreTest, SetOverwrites) {
  InMemoryKvStore store;
  ASSERT_TRUE(store.Set("a", "1").ok());
  ASSERT_TRUE(store.Set("a", "x").ok());
  EXPECT_THAT(*store.Get({"a"}, 0), ElementsAre("x"));
}

// Longer than ctest's timeout: a Get that only its timeout could end shows as a hang.
constexpr double kLongerThanTheTestS = 3600;

TEST(InMemoryKvStoreTest, GetWaitsForKeysSetByAnotherThread) {
  InMemoryKvStore store;
  std::thread writer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    ASSERT_TRUE(store.Set("late", "v").ok());
  });
  // Woken by the Set: its timeout is not what ends the wait.
  absl::StatusOr<std::vector<std::string>> values = store.Get({"late"}, kLongerThanTheTestS);
  writer.join();
  ASSERT_TRUE(values.ok()) << values.status();
  EXPECT_THAT(*values, ElementsAre("v"));
}

TEST(InMemoryKvStoreTest, TimeoutNamesOnlyTheMissingKeys) {
  InMemoryKvStore store;
  ASSERT_TRUE(store.Set("present", "v").ok());
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<std::vector<std::string>> values =
      store.Get({"present", "missing_1", "missing_2"}, 0.1);
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_TRUE(absl::IsDeadlineExceeded(values.status())) << values.status();
  EXPECT_THAT(values.status().message(), HasSubstr("missing_1"));
  EXPECT_THAT(values.status().message(), HasSubstr("missing_2"));
  EXPECT_THAT(values.status().message(), Not(HasSubstr("present")));
  EXPECT_THAT(values.status().message(), HasSubstr("after 0.100 s"));  // the timeout it was given
  EXPECT_GE(waited, 0.09);                                             // not before it
}

TEST(InMemoryKvStoreTest, CloseEndsAWaitingGetAndRefusesLaterCalls) {
  InMemoryKvStore store;
  ASSERT_TRUE(store.Set("a", "1").ok());
  std::thread closer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    store.Close();
  });
  // Woken by the Close: its timeout is not what ends the wait.
  absl::StatusOr<std::vector<std::string>> values = store.Get({"a", "never"}, kLongerThanTheTestS);
  closer.join();
  EXPECT_TRUE(absl::IsFailedPrecondition(values.status())) << values.status();
  EXPECT_TRUE(absl::IsFailedPrecondition(store.Set("b", "2")));
  EXPECT_TRUE(absl::IsFailedPrecondition(store.Get({"a"}, 0).status()));
}

}  // namespace
}  // namespace furnace
