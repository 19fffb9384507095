#include "runtime/comm/gloo_store.h"

#include <algorithm>
#include <chrono>
#include <limits>
#include <map>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "gloo/common/error.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/base/clock.h"

namespace furnace::comm {
namespace {

using std::chrono::milliseconds;
using ::testing::DoubleNear;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// A store on simulated time: each key appears at a given FakeClock time, and a blocking Get
// advances the clock by as much as the real store would have waited (until the keys appear, or
// the whole timeout). Records the timeout of every Get.
class SimulatedKvStore : public KvStore {
 public:
  explicit SimulatedKvStore(FakeClock& clock) : clock_(clock) {}
  void SetAt(double seconds, const std::string& key, const std::string& value) {
    values_[key] = {seconds, value};
  }

  absl::Status Set(const std::string& key, const std::string& value) override {
    values_[key] = {clock_.MonotonicSeconds(), value};
    return absl::OkStatus();
  }
  absl::StatusOr<std::vector<std::string>> Get(const std::vector<std::string>& keys,
                                               double timeout_s) override {
    slices_.push_back(timeout_s);
    const double now = clock_.MonotonicSeconds();
    double ready_at = now;
    std::vector<std::string> missing;
    for (const std::string& key : keys) {
      auto it = values_.find(key);
      if (it == values_.end()) {
        missing.push_back(key);
        ready_at = std::numeric_limits<double>::infinity();
      } else {
        ready_at = std::max(ready_at, it->second.first);
      }
    }
    if (ready_at > now + timeout_s) {
      clock_.Advance(timeout_s);
      return absl::DeadlineExceededError(absl::StrFormat("keys still missing after %.3f s: [%s]",
                                                         timeout_s, absl::StrJoin(missing, ", ")));
    }
    clock_.Advance(ready_at - now);
    std::vector<std::string> out;
    for (const std::string& key : keys) out.push_back(values_.at(key).second);
    return out;
  }
  const std::vector<double>& slices() const { return slices_; }

 private:
  FakeClock& clock_;
  std::map<std::string, std::pair<double, std::string>> values_;  // key -> (appears at, value)
  std::vector<double> slices_;
};

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
  FakeClock clock;
  SimulatedKvStore kv(clock);
  kv.SetAt(1.3, "k", "v");
  int ticks = 0;
  const auto tick = [&] { ++ticks; };
  GlooStore store(kv, milliseconds(10000), tick, clock);
  EXPECT_EQ(store.get("k"), std::vector<char>({'v'}));
  // One-second slices: the first ran out before the key came (one tick), the second found it.
  EXPECT_THAT(kv.slices(), ElementsAre(DoubleNear(1.0, 1e-9), DoubleNear(1.0, 1e-9)));
  EXPECT_EQ(ticks, 1);
  EXPECT_NEAR(clock.MonotonicSeconds(), 1.3, 1e-9);
}

TEST(GlooStoreTest, WaitTimeoutThrowsTimedOutIoException) {
  FakeClock clock;
  SimulatedKvStore kv(clock);
  int ticks = 0;
  const auto tick = [&] { ++ticks; };
  GlooStore store(kv, milliseconds(10000), tick, clock);
  try {
    store.wait({"never"}, milliseconds(300));
    FAIL() << "wait returned";
  } catch (const gloo::IoException& e) {
    EXPECT_THAT(e.what(), HasSubstr("timed out after 0.300 s"));
    EXPECT_THAT(e.what(), HasSubstr("never"));
  }
  EXPECT_THAT(kv.slices(), ElementsAre(DoubleNear(0.3, 1e-9)));
  EXPECT_EQ(ticks, 1);
  EXPECT_NEAR(clock.MonotonicSeconds(), 0.3, 1e-9);
}

TEST(GlooStoreTest, LongWaitIsSlicedAndStopsAtTheTimeout) {
  FakeClock clock;
  SimulatedKvStore kv(clock);
  kv.SetAt(0.0, "a", "1");
  int ticks = 0;
  const auto tick = [&] { ++ticks; };
  GlooStore store(kv, milliseconds(2500), tick, clock);
  EXPECT_THROW(store.wait({"a", "b"}), gloo::IoException);  // the default timeout
  EXPECT_THAT(kv.slices(),
              ElementsAre(DoubleNear(1.0, 1e-9), DoubleNear(1.0, 1e-9), DoubleNear(0.5, 1e-9)));
  EXPECT_EQ(ticks, 3);
  EXPECT_NEAR(clock.MonotonicSeconds(), 2.5, 1e-9);
}

TEST(GlooStoreTest, StoreErrorsBecomeIoExceptions) {
  BrokenKvStore kv;
  GlooStore store(kv, milliseconds(1000));
  EXPECT_THROW(store.set("k", {'v'}), gloo::IoException);
  EXPECT_THROW(store.get("k"), gloo::IoException);
}

}  // namespace
}  // namespace furnace::comm
