// Text formatting for the CLI: aligned tables and the units a person reads (durations, bytes,
// bandwidth, local times, progress bars). Pure functions of their arguments, except FormatUnixTime,
// which reads the process time zone (TZ). Thread-compatible.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace furnace::cli {

// Columns separated by two spaces, each as wide as its widest cell (UTF-8 code points), left
// aligned unless marked right aligned; no trailing spaces. A row shorter than the header is padded
// with empty cells; extra cells are dropped.
class Table {
 public:
  explicit Table(std::vector<std::string> headers, std::string indent = "");
  void SetRightAligned(size_t column);
  void AddRow(std::vector<std::string> cells);
  size_t rows() const { return rows_.size(); }
  // Header line then one line per row, each ending in '\n'.
  std::string Render() const;

 private:
  std::vector<std::string> headers_;
  std::string indent_;
  std::vector<bool> right_;
  std::vector<std::vector<std::string>> rows_;
};

// Display width of UTF-8 text: the number of code points.
size_t DisplayWidth(const std::string& text);
// `text` on one line: each control character (a newline, a tab, an escape) becomes a space, and
// the spaces that indent a continuation line go with it. Causes and event messages may hold
// several lines (a checkpoint loader lists what it passed over); a table cell or a redrawn frame's
// line must not, and a terminal must not be handed escapes from them.
std::string OneLine(absl::string_view text);
// Cuts `text` to at most `width` code points, ending in "..." when it had to cut.
std::string Truncate(const std::string& text, size_t width);

// "0s", "42s", "1m05s", "2h03m", "3d04h"; "-" for a negative or non-finite value.
std::string FormatDuration(double seconds);
// "512 B", "4.0 KiB", "4.0 MiB", "1.5 GiB", "2.0 TiB" (binary units).
std::string FormatBytes(uint64_t bytes);
// A GB/s (1e9 bytes/s) figure without its unit: "0.123", "12.35", "123.4".
std::string FormatGbps(double gbps);
// The same with its unit: "12.35 GB/s".
std::string FormatBandwidth(double gbps);
// Local time "2026-11-29 09:12:03"; "-" for 0 (a time never set).
std::string FormatUnixTime(double unix_seconds);
// Local time of day "09:12:03"; "-" for 0.
std::string FormatClock(double unix_seconds);
// "[#########-----------]  45%"; `width` is the number of cells inside the brackets. Unknown total
// (0): an empty bar and "   ?%". The step is clamped to the total.
std::string ProgressBar(uint64_t step, uint64_t total, int width);
// "5/10", or "5" when the total is unknown (0).
std::string FormatProgress(uint64_t step, uint64_t total);
// A metric value: "%.6g".
std::string FormatMetric(double value);
// An integer with thousands separators: "1,234,567"; "-1,000".
std::string FormatCount(int64_t n);
// A per-second rate in SI units: "850", "12.3k", "4.56M", "1.23G"; "-" for a negative or
// non-finite value.
std::string FormatRate(double per_second);
// A short time: "850 us", "12.3 ms", "1.25 s", then FormatDuration from a minute on; "-" for a
// negative or non-finite value.
std::string FormatSeconds(double seconds);
// A ratio as a percentage: "21%" at 0.21 with 0 decimals; "-" for a non-finite value.
std::string FormatPercent(double ratio, int decimals = 0);

}  // namespace furnace::cli
