#include "controller/service/log_store.h"

#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace furnace::controller {
namespace {

namespace fs = std::filesystem;
namespace v1 = furnace::v1;

class LogStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) /
           ::testing::UnitTest::GetInstance()->current_test_info()->name();
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Appends `n` lines "line <first + i>" of rank 0, attempt 1, each padded to `pad` characters.
  void AppendLines(LogStore& store, int first, int n, size_t pad = 0) {
    std::string text;
    for (int i = 0; i < n; ++i) {
      v1::LogLine line;
      line.set_attempt(1);
      line.set_rank(0);
      std::string body = absl::StrCat("line ", first + i);
      if (body.size() < pad) body.append(pad - body.size(), '.');
      line.set_text(body);
      text += LogStore::Format(line);
    }
    ASSERT_TRUE(store.Append({{"job-1", text}}).ok());
  }

  // Every line from offset 0 on, page by page, as `furnace logs` reads them.
  static std::vector<std::string> ReadAll(const LogStore& store, int* pages) {
    std::vector<std::string> all;
    v1::GetLogsRequest req;
    req.set_job_id("job-1");
    req.set_rank(-1);
    *pages = 0;
    while (true) {
      absl::StatusOr<v1::GetLogsResponse> read = store.Read(req);
      EXPECT_TRUE(read.ok()) << read.status();
      if (!read.ok() || read->lines_size() == 0) break;
      const v1::GetLogsResponse& page = *read;
      ++*pages;
      all.insert(all.end(), page.lines().begin(), page.lines().end());
      EXPECT_GT(page.next_offset(), req.offset());
      req.set_offset(page.next_offset());
    }
    return all;
  }

  fs::path dir_;
};

TEST_F(LogStoreTest, PagesContinueWithTheFirstLineNotReturned) {
  LogStore store(dir_.string());
  const int n = static_cast<int>(2 * kMaxLogPageLines + 7);
  AppendLines(store, 0, n);
  int pages = 0;
  const std::vector<std::string> all = ReadAll(store, &pages);
  EXPECT_EQ(pages, 3);
  ASSERT_EQ(all.size(), static_cast<size_t>(n));  // none lost at a page's end
  for (int i = 0; i < n; ++i) ASSERT_EQ(all[i], absl::StrCat("[attempt 1 rank 0] line ", i));
}

TEST_F(LogStoreTest, APageIsBoundedInBytes) {
  LogStore store(dir_.string());
  // 64 KiB lines (the longest a rank sends): a page of 5000 would be 320 MiB.
  constexpr size_t kLine = 64 << 10;
  const int n = static_cast<int>(3 * kMaxLogPageBytes / kLine);
  AppendLines(store, 0, n, kLine);
  v1::GetLogsRequest req;
  req.set_job_id("job-1");
  req.set_rank(-1);
  const v1::GetLogsResponse first = *store.Read(req);
  size_t bytes = 0;
  for (const std::string& line : first.lines()) bytes += line.size();
  EXPECT_GT(first.lines_size(), 1);
  EXPECT_LE(bytes, kMaxLogPageBytes + static_cast<size_t>(first.lines_size()) * 32);
  // Stored as "1 0 <text>\n": the next page starts after the lines returned.
  EXPECT_EQ(first.next_offset(), static_cast<uint64_t>(first.lines_size()) * (kLine + 5));
  int pages = 0;
  const std::vector<std::string> all = ReadAll(store, &pages);
  ASSERT_EQ(all.size(), static_cast<size_t>(n));
  EXPECT_GE(pages, 3);
  for (int i = 0; i < n; ++i) {
    ASSERT_TRUE(absl::StartsWith(all[i], absl::StrCat("[attempt 1 rank 0] line ", i, ".")));
  }
}

TEST_F(LogStoreTest, OneLineLongerThanAPageStillComes) {
  LogStore store(dir_.string());
  AppendLines(store, 0, 2, kMaxLogPageBytes + 10);
  v1::GetLogsRequest req;
  req.set_job_id("job-1");
  req.set_rank(-1);
  const v1::GetLogsResponse first = *store.Read(req);
  ASSERT_EQ(first.lines_size(), 1);
  EXPECT_EQ(first.next_offset(), kMaxLogPageBytes + 10 + 5);
  req.set_offset(first.next_offset());
  EXPECT_EQ(store.Read(req)->lines_size(), 1);
}

TEST_F(LogStoreTest, FilteredLinesAdvanceTheOffset) {
  LogStore store(dir_.string());
  AppendLines(store, 0, 3);
  v1::GetLogsRequest req;
  req.set_job_id("job-1");
  req.set_rank(5);  // no such rank's lines
  const v1::GetLogsResponse page = *store.Read(req);
  EXPECT_EQ(page.lines_size(), 0);
  EXPECT_EQ(page.next_offset(), 3 * std::string("1 0 line 0\n").size());  // past all three
}

// The offset is a byte position: a follow's poll reads from there, not from the file's start.
// A partial last line is left for the next read; an offset inside a line is refused.
TEST_F(LogStoreTest, ReadsGoOnFromWhereTheLastPageEnded) {
  LogStore store(dir_.string());
  AppendLines(store, 0, 2);
  v1::GetLogsRequest req;
  req.set_job_id("job-1");
  req.set_rank(-1);
  const v1::GetLogsResponse first = *store.Read(req);
  ASSERT_EQ(first.lines_size(), 2);
  EXPECT_EQ(first.next_offset(), fs::file_size(dir_ / "job-1.log"));

  req.set_offset(first.next_offset());
  const v1::GetLogsResponse none = *store.Read(req);
  EXPECT_EQ(none.lines_size(), 0);
  EXPECT_EQ(none.next_offset(), first.next_offset());

  {  // a line still being written, then its end
    std::ofstream out(dir_ / "job-1.log", std::ios::app);
    out << "1 0 half";
  }
  EXPECT_EQ(store.Read(req)->lines_size(), 0);
  {
    std::ofstream out(dir_ / "job-1.log", std::ios::app);
    out << " and done\n";
  }
  AppendLines(store, 2, 1);
  const v1::GetLogsResponse next = *store.Read(req);
  ASSERT_EQ(next.lines_size(), 2);
  EXPECT_EQ(next.lines(0), "[attempt 1 rank 0] half and done");
  EXPECT_EQ(next.lines(1), "[attempt 1 rank 0] line 2");
  EXPECT_EQ(next.next_offset(), fs::file_size(dir_ / "job-1.log"));

  req.set_offset(first.next_offset() + 2);  // inside "1 0 half and done"
  const absl::StatusOr<v1::GetLogsResponse> inside = store.Read(req);
  EXPECT_EQ(inside.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(inside.status().message(), "not where a line")) << inside.status();
}

TEST_F(LogStoreTest, AJobWithoutALogHasNoLines) {
  LogStore store(dir_.string());
  v1::GetLogsRequest req;
  req.set_job_id("job-1");
  req.set_rank(-1);
  const v1::GetLogsResponse page = *store.Read(req);
  EXPECT_EQ(page.lines_size(), 0);
  EXPECT_EQ(page.next_offset(), 0u);
}

}  // namespace
}  // namespace furnace::controller
