#include "runtime/base/open_files.h"

#include <sys/resource.h>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace furnace {
namespace {

// The daemons and the rank program start with the soft limit their service manager gave (1024
// under systemd); each raises it to the hard limit.
TEST(OpenFileLimitTest, RaisesTheSoftLimitToTheHardLimit) {
  rlimit saved{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &saved), 0);
  if (saved.rlim_max != RLIM_INFINITY && saved.rlim_max <= 64) {
    GTEST_SKIP() << "the hard limit here is " << saved.rlim_max << ": nothing to raise";
  }
  rlimit low = saved;
  low.rlim_cur = 64;
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &low), 0);

  absl::StatusOr<OpenFileLimit> raised = RaiseOpenFileLimit();
  rlimit now{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &now), 0);
  // At the hard limit already: nothing changes, and it says so (before the original limit is put
  // back, which may be below the hard one).
  absl::StatusOr<OpenFileLimit> again = RaiseOpenFileLimit();
  setrlimit(RLIMIT_NOFILE, &saved);
  ASSERT_TRUE(raised.ok()) << raised.status();
  EXPECT_EQ(raised->before, 64u);
  EXPECT_GT(raised->soft, 64u);
  EXPECT_EQ(raised->soft, now.rlim_cur);
  if (saved.rlim_max != RLIM_INFINITY) {
    EXPECT_EQ(now.rlim_cur, saved.rlim_max);
  }
  EXPECT_EQ(
      DescribeOpenFileLimit(*raised),
      absl::StrCat(raised->soft, " open files (soft limit raised from 64 to the hard limit)"));

  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->before, again->soft);
}

}  // namespace
}  // namespace furnace
