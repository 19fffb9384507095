#include "runtime/comm/gloo_store.h"

#include <atomic>
#include <chrono>
#include <thread>

#include "gloo/common/error.h"
#include "gtest/gtest.h"

namespace furnace::comm {
namespace {

using std::chrono::milliseconds;

// A store whose Get always fails with a non-timeout error.
class BrokenKvStore : public KvStore {
 public:
  absl::Status Set(const std::string&, const std::string&) override {
    return absl::UnavailableError("controller gone");
  }
  absl::StatusOr<std::vector<std::string>> Get(const std::vector<std::string>&, double) override {
    return absl::UnavailableError("controller gone");
  }
};

TEST(GlooStoreTest, SetThenGetRoundTripsBytes) {
  InMemoryKvStore kv;
  GlooStore store(kv, milliseconds(1000));
  const std::vector<char> data = {'a', '\0', 'b'};
  store.set("k", data);
  EXPECT_EQ(store.get("k"), data);
}

TEST(GlooStoreTest, GetWaitsForTheKeyAndTicksWhileWaiting) {
  InMemoryKvStore kv;
  std::atomic<int> ticks{0};
  GlooStore store(kv, milliseconds(10000), [&] { ++ticks; });
  std::thread writer([&] {
    std::this_thread::sleep_for(milliseconds(1300));
    ASSERT_TRUE(kv.Set("k", "v").ok());
  });
  const std::vector<char> value = store.get("k");
  writer.join();
  EXPECT_EQ(value, std::vector<char>({'v'}));
  EXPECT_GE(ticks.load(), 1);  // one-second slices: at least one passed before the key came
}

TEST(GlooStoreTest, WaitTimeoutThrowsTimedOutIoException) {
  InMemoryKvStore kv;
  std::atomic<int> ticks{0};
  GlooStore store(kv, milliseconds(10000), [&] { ++ticks; });
  const auto start = std::chrono::steady_clock::now();
  try {
    store.wait({"never"}, milliseconds(300));
    FAIL() << "wait returned";
  } catch (const gloo::IoException& e) {
    EXPECT_NE(std::string(e.what()).find("timed out"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("never"), std::string::npos) << e.what();
  }
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 2.0);
  EXPECT_GE(ticks.load(), 1);
}

TEST(GlooStoreTest, StoreErrorsBecomeIoExceptions) {
  BrokenKvStore kv;
  GlooStore store(kv, milliseconds(1000));
  EXPECT_THROW(store.set("k", {'v'}), gloo::IoException);
  EXPECT_THROW(store.get("k"), gloo::IoException);
}

}  // namespace
}  // namespace furnace::comm
