#include "controller/cli/format.h"

#include <cstdlib>
#include <ctime>

#include "gtest/gtest.h"

namespace furnace::cli {
namespace {

TEST(TableTest, AlignsColumnsAndTrimsTrailingSpace) {
  Table table({"JOB", "STATE", "STEP"});
  table.SetRightAligned(2);
  table.AddRow({"j-1", "RUNNING", "5/10"});
  table.AddRow({"j-0002", "FAILED", "100/100"});
  EXPECT_EQ(table.Render(),
            "JOB     STATE       STEP\n"
            "j-1     RUNNING     5/10\n"
            "j-0002  FAILED   100/100\n");
}

TEST(TableTest, PadsShortRowsAndIndents) {
  Table table({"A", "B"}, "  ");
  table.AddRow({"x"});
  EXPECT_EQ(table.Render(), "  A  B\n  x\n");
}

TEST(TableTest, CountsUtf8CodePoints) {
  Table table({"NAME", "X"});
  table.AddRow({"héllo", "1"});
  EXPECT_EQ(table.Render(), "NAME   X\nhéllo  1\n");
}

// A cause of several lines (a checkpoint loader's list of what it passed over) is one cell.
TEST(TableTest, ACellIsOneLine) {
  Table t({"JOB", "CAUSE"});
  t.AddRow({"j-1", "checkpoint: no step loads\n  step 20: checksum\n  step 10: \x1b[2Jgone"});
  EXPECT_EQ(t.Render(),
            "JOB  CAUSE\n"
            "j-1  checkpoint: no step loads step 20: checksum step 10: [2Jgone\n");
}

TEST(FormatTest, OneLine) {
  EXPECT_EQ(OneLine("a\n  b\tc\r\n d"), "a b c d");
  EXPECT_EQ(OneLine("trailing\n"), "trailing ");
  EXPECT_EQ(OneLine("x  y"), "x  y");  // spaces of the text itself stay
  EXPECT_EQ(OneLine("\n\nlead"), "lead");
  EXPECT_EQ(OneLine("caf\xC3\xA9"), "caf\xC3\xA9");
}

TEST(FormatTest, Truncate) {
  EXPECT_EQ(Truncate("abcdef", 10), "abcdef");
  EXPECT_EQ(Truncate("abcdefghij", 6), "abc...");
  EXPECT_EQ(Truncate("abcdef", 2), "..");
}

TEST(FormatTest, Duration) {
  EXPECT_EQ(FormatDuration(0), "0s");
  EXPECT_EQ(FormatDuration(42.9), "42s");
  EXPECT_EQ(FormatDuration(65), "1m05s");
  EXPECT_EQ(FormatDuration(3599), "59m59s");
  EXPECT_EQ(FormatDuration(3600 * 2 + 180), "2h03m");
  EXPECT_EQ(FormatDuration(86400 * 3 + 3600 * 4), "3d04h");
  EXPECT_EQ(FormatDuration(-1), "-");
}

TEST(FormatTest, Bytes) {
  EXPECT_EQ(FormatBytes(0), "0 B");
  EXPECT_EQ(FormatBytes(512), "512 B");
  EXPECT_EQ(FormatBytes(4096), "4.0 KiB");
  EXPECT_EQ(FormatBytes(4 << 20), "4.0 MiB");
  EXPECT_EQ(FormatBytes(1536ull << 20), "1.5 GiB");
  EXPECT_EQ(FormatBytes(80ull << 30), "80.0 GiB");
  EXPECT_EQ(FormatBytes(2ull << 40), "2.0 TiB");
  // Where one decimal would round to 1024 of a unit, the next unit.
  EXPECT_EQ(FormatBytes(1048575), "1.0 MiB");
  EXPECT_EQ(FormatBytes(1048524), "1023.9 KiB");
}

TEST(FormatTest, Bandwidth) {
  EXPECT_EQ(FormatGbps(0.1234), "0.123");
  EXPECT_EQ(FormatGbps(12.346), "12.35");
  EXPECT_EQ(FormatGbps(123.46), "123.5");
  EXPECT_EQ(FormatBandwidth(12.346), "12.35 GB/s");
  EXPECT_EQ(FormatGbps(-1), "-");
}

TEST(FormatTest, UnixTimeInLocalZone) {
  setenv("TZ", "UTC", 1);
  tzset();
  EXPECT_EQ(FormatUnixTime(1700000000), "2023-11-14 22:13:20");
  EXPECT_EQ(FormatClock(1700000000.7), "22:13:20");
  EXPECT_EQ(FormatUnixTime(0), "-");
}

TEST(FormatTest, ProgressBar) {
  EXPECT_EQ(ProgressBar(0, 10, 10), "[----------]   0%");
  EXPECT_EQ(ProgressBar(5, 10, 10), "[#####-----]  50%");
  EXPECT_EQ(ProgressBar(10, 10, 10), "[##########] 100%");
  EXPECT_EQ(ProgressBar(1, 3, 10), "[###-------]  33%");
  EXPECT_EQ(ProgressBar(12, 10, 4), "[####] 100%");  // clamped
  EXPECT_EQ(ProgressBar(7, 0, 4), "[----]   ?%");    // unknown total
  EXPECT_EQ(FormatProgress(5, 10), "5/10");
  EXPECT_EQ(FormatProgress(5, 0), "5");
}

TEST(FormatTest, CountsRatesSecondsPercents) {
  EXPECT_EQ(FormatCount(0), "0");
  EXPECT_EQ(FormatCount(999), "999");
  EXPECT_EQ(FormatCount(1000), "1,000");
  EXPECT_EQ(FormatCount(1234567), "1,234,567");
  EXPECT_EQ(FormatCount(-1000), "-1,000");
  EXPECT_EQ(FormatRate(850), "850");
  EXPECT_EQ(FormatRate(12345), "12.3k");
  EXPECT_EQ(FormatRate(4.56e6), "4.56M");
  // Never "1000" of a unit: the next unit.
  EXPECT_EQ(FormatRate(999.4), "999");
  EXPECT_EQ(FormatRate(999.7), "1.0k");
  EXPECT_EQ(FormatRate(999960), "1.00M");
  EXPECT_EQ(FormatSeconds(0.99996), "1.00 s");
  EXPECT_EQ(FormatSeconds(0.0009996), "1.0 ms");
  EXPECT_EQ(FormatRate(1.234e9), "1.23G");
  EXPECT_EQ(FormatRate(-1), "-");
  EXPECT_EQ(FormatSeconds(850e-6), "850 us");
  EXPECT_EQ(FormatSeconds(0.0123), "12.3 ms");
  EXPECT_EQ(FormatSeconds(1.25), "1.25 s");
  EXPECT_EQ(FormatSeconds(65), "1m05s");
  EXPECT_EQ(FormatSeconds(-1), "-");
  EXPECT_EQ(FormatPercent(0.2094), "21%");
  EXPECT_EQ(FormatPercent(0.034, 2), "3.40%");
}

}  // namespace
}  // namespace furnace::cli
