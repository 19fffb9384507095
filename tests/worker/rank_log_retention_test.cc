#include "worker/rank_log_retention.h"

#include <fcntl.h>
#include <sys/stat.h>

#include <ctime>
#include <filesystem>
#include <fstream>
#include <string>

#include "gtest/gtest.h"
#include "tests/testing/test_dir.h"

namespace furnace::worker {
namespace {

namespace fs = std::filesystem;

const auto kNone = [](const std::string&) { return false; };  // no rank runs here

// Sets the modification time of `path` to `unix_s`.
void Touch(const fs::path& path, double unix_s) {
  struct timespec times[2];
  times[0].tv_sec = times[1].tv_sec = static_cast<time_t>(unix_s);
  times[0].tv_nsec = times[1].tv_nsec = 0;
  ASSERT_EQ(::utimensat(AT_FDCWD, path.c_str(), times, AT_SYMLINK_NOFOLLOW), 0) << path;
}

// logs/<job>/attempt-1/rank-0.log, every entry (files and directories) last changed at `unix_s`,
// except `newest_file_s` for the log file when given.
void MakeJobLogs(const fs::path& logs, const std::string& job, double unix_s,
                 double newest_file_s = 0) {
  fs::create_directories(logs / job / "attempt-1");
  std::ofstream(logs / job / "attempt-1" / "rank-0.log") << "step 1\n";
  Touch(logs / job / "attempt-1" / "rank-0.log", newest_file_s > 0 ? newest_file_s : unix_s);
  Touch(logs / job / "attempt-1", unix_s);
  Touch(logs / job, unix_s);
}

TEST(RankLogRetentionTest, RemovesOnlyJobsUnchangedForLongerThanKeptAndNotRunningHere) {
  testing_util::TestDir dir;
  const fs::path logs = dir / "logs";
  const double now = 2e9;
  MakeJobLogs(logs, "old", now - 7200);
  MakeJobLogs(logs, "recent", now - 600);
  // Old directories, but a file in it changed a minute ago: the job is not stale.
  MakeJobLogs(logs, "old-dirs-new-file", now - 7200, now - 60);
  MakeJobLogs(logs, "running-quietly", now - 7200);  // a rank of it runs here

  const RankLogSweep sweep = SweepRankLogs(
      logs.string(), 3600, now, [](const std::string& job) { return job == "running-quietly"; });
  EXPECT_EQ(sweep.removed, 1u);
  EXPECT_EQ(sweep.kept_active, 1u);
  EXPECT_FALSE(fs::exists(logs / "old"));
  EXPECT_TRUE(fs::exists(logs / "recent" / "attempt-1" / "rank-0.log"));
  EXPECT_TRUE(fs::exists(logs / "old-dirs-new-file" / "attempt-1" / "rank-0.log"));
  EXPECT_TRUE(fs::exists(logs / "running-quietly" / "attempt-1" / "rank-0.log"));
}

TEST(RankLogRetentionTest, ZeroKeepsEverythingAndAMissingDirectoryIsNoError) {
  testing_util::TestDir dir;
  const fs::path logs = dir / "logs";
  MakeJobLogs(logs, "old", 1e9);
  EXPECT_EQ(SweepRankLogs(logs.string(), 0, 2e9, kNone).removed, 0u);
  EXPECT_TRUE(fs::exists(logs / "old"));
  EXPECT_EQ(SweepRankLogs(dir / "none", 3600, 2e9, kNone).removed, 0u);
}

// A symlink in logs/ (nothing the agent makes) is never followed or removed.
TEST(RankLogRetentionTest, ASymlinkIsLeftAlone) {
  testing_util::TestDir dir;
  const fs::path logs = dir / "logs";
  fs::create_directories(logs);
  MakeJobLogs(dir / "elsewhere", "target", 1e9);
  const fs::path target = fs::path(dir / "elsewhere") / "target";
  fs::create_directory_symlink(target, logs / "link");
  EXPECT_EQ(SweepRankLogs(logs.string(), 3600, 2e9, kNone).removed, 0u);
  EXPECT_TRUE(fs::exists(target / "attempt-1" / "rank-0.log"));
}

}  // namespace
}  // namespace furnace::worker
