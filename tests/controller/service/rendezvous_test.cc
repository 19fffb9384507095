// The controller's rendezvous: scopes keep keys apart (fencing), a closed scope ends its waits and
// stays closed.
#include "controller/service/rendezvous.h"

#include <chrono>
#include <thread>

#include "gtest/gtest.h"

namespace furnace::controller {
namespace {

TEST(RendezvousTest, ScopesDoNotShareKeys) {
  Rendezvous r;
  r.Set({"j", 1}, "k", "attempt1");
  r.Set({"j", 2}, "k", "attempt2");
  auto v1 = r.Get({"j", 1}, {"k"}, 0);
  ASSERT_TRUE(v1.ok()) << v1.status();
  EXPECT_EQ((*v1)[0], "attempt1");
  auto missing = r.Get({"other", 1}, {"k"}, 0.05);
  EXPECT_TRUE(absl::IsDeadlineExceeded(missing.status())) << missing.status();
  EXPECT_NE(missing.status().message().find("rendezvous: "), std::string::npos);
}

TEST(RendezvousTest, CloseEndsWaitsAndTheScopeStaysClosed) {
  Rendezvous r;
  r.Set({"j", 1}, "a", "1");
  std::thread closer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    r.Close({"j", 1});
  });
  const auto start = std::chrono::steady_clock::now();
  auto waited = r.Get({"j", 1}, {"a", "never"}, 5.0);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  closer.join();
  EXPECT_TRUE(absl::IsFailedPrecondition(waited.status())) << waited.status();
  EXPECT_LT(s, 4.0);
  r.Set({"j", 1}, "a", "again");  // ignored
  EXPECT_TRUE(absl::IsFailedPrecondition(r.Get({"j", 1}, {"a"}, 0).status()));
  // The next attempt's scope is unaffected.
  r.Set({"j", 2}, "a", "2");
  EXPECT_TRUE(r.Get({"j", 2}, {"a"}, 0).ok());
}

}  // namespace
}  // namespace furnace::controller
