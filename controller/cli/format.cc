#include "controller/cli/format.h"

#include <algorithm>
#include <cmath>
#include <ctime>

#include "absl/strings/str_format.h"

namespace furnace::cli {

Table::Table(std::vector<std::string> headers, std::string indent)
    : headers_(std::move(headers)), indent_(std::move(indent)), right_(headers_.size(), false) {}

void Table::SetRightAligned(size_t column) {
  if (column < right_.size()) right_[column] = true;
}

void Table::AddRow(std::vector<std::string> cells) {
  cells.resize(headers_.size());
  for (std::string& cell : cells) cell = OneLine(cell);
  rows_.push_back(std::move(cells));
}

std::string Table::Render() const {
  std::vector<size_t> widths(headers_.size(), 0);
  for (size_t c = 0; c < headers_.size(); ++c) widths[c] = DisplayWidth(headers_[c]);
  for (const auto& row : rows_) {
    for (size_t c = 0; c < row.size(); ++c) widths[c] = std::max(widths[c], DisplayWidth(row[c]));
  }
  std::string out;
  auto render_row = [&](const std::vector<std::string>& cells) {
    std::string line = indent_;
    for (size_t c = 0; c < cells.size(); ++c) {
      const size_t pad = widths[c] - DisplayWidth(cells[c]);
      if (c > 0) line += "  ";
      if (right_[c]) {
        line.append(pad, ' ');
        line += cells[c];
      } else {
        line += cells[c];
        line.append(pad, ' ');
      }
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out += line;
    out += '\n';
  };
  render_row(headers_);
  for (const auto& row : rows_) render_row(row);
  return out;
}

size_t DisplayWidth(const std::string& text) {
  size_t n = 0;
  for (unsigned char ch : text) {
    if ((ch & 0xC0) != 0x80) ++n;  // count lead bytes only
  }
  return n;
}

std::string OneLine(absl::string_view text) {
  std::string out;
  out.reserve(text.size());
  bool joined = false;  // the last character was a replaced control character
  for (const char ch : text) {
    const unsigned char c = static_cast<unsigned char>(ch);
    if (c < 0x20 || c == 0x7F) {
      if (!out.empty() && out.back() != ' ') out += ' ';
      joined = true;
      continue;
    }
    if (joined && ch == ' ') continue;
    joined = false;
    out += ch;
  }
  return out;
}

std::string Truncate(const std::string& text, size_t width) {
  if (DisplayWidth(text) <= width) return text;
  const size_t keep = width > 3 ? width - 3 : 0;
  std::string out;
  size_t points = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    const unsigned char ch = static_cast<unsigned char>(text[i]);
    if ((ch & 0xC0) != 0x80) {
      if (points == keep) break;
      ++points;
    }
    out += text[i];
  }
  return out + std::string("...").substr(0, std::min<size_t>(3, width));
}

std::string FormatDuration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "-";
  const uint64_t s = static_cast<uint64_t>(seconds);
  if (s < 60) return absl::StrFormat("%ds", s);
  if (s < 3600) return absl::StrFormat("%dm%02ds", s / 60, s % 60);
  if (s < 86400) return absl::StrFormat("%dh%02dm", s / 3600, (s % 3600) / 60);
  return absl::StrFormat("%dd%02dh", s / 86400, (s % 86400) / 3600);
}

std::string FormatBytes(uint64_t bytes) {
  static constexpr const char* kUnits[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  if (bytes < 1024) return absl::StrFormat("%d B", bytes);
  double value = static_cast<double>(bytes) / 1024.0;
  size_t unit = 0;
  // Up a unit where one decimal would round to 1024 (1048575 B is "1.0 MiB", not "1024.0 KiB").
  while (value >= 1023.95 && unit + 1 < std::size(kUnits)) {
    value /= 1024.0;
    ++unit;
  }
  return absl::StrFormat("%.1f %s", value, kUnits[unit]);
}

std::string FormatGbps(double gbps) {
  if (!std::isfinite(gbps) || gbps < 0) return "-";
  if (gbps < 1.0) return absl::StrFormat("%.3f", gbps);
  if (gbps < 100.0) return absl::StrFormat("%.2f", gbps);
  return absl::StrFormat("%.1f", gbps);
}

std::string FormatBandwidth(double gbps) { return FormatGbps(gbps) + " GB/s"; }

namespace {

std::string FormatLocal(double unix_seconds, const char* format) {
  if (unix_seconds <= 0 || !std::isfinite(unix_seconds)) return "-";
  const std::time_t t = static_cast<std::time_t>(unix_seconds);
  std::tm tm{};
  localtime_r(&t, &tm);
  char buf[64];
  const size_t n = std::strftime(buf, sizeof(buf), format, &tm);
  return std::string(buf, n);
}

}  // namespace

std::string FormatUnixTime(double unix_seconds) {
  return FormatLocal(unix_seconds, "%Y-%m-%d %H:%M:%S");
}

std::string FormatClock(double unix_seconds) { return FormatLocal(unix_seconds, "%H:%M:%S"); }

std::string ProgressBar(uint64_t step, uint64_t total, int width) {
  width = std::max(width, 1);
  if (total == 0) return "[" + std::string(width, '-') + "]   ?%";
  step = std::min(step, total);
  const int filled = static_cast<int>(static_cast<double>(step) * width / total);
  const int percent = static_cast<int>(static_cast<double>(step) * 100 / total);
  return "[" + std::string(filled, '#') + std::string(width - filled, '-') + "]" +
         absl::StrFormat(" %3d%%", percent);
}

std::string FormatProgress(uint64_t step, uint64_t total) {
  if (total == 0) return absl::StrFormat("%d", step);
  return absl::StrFormat("%d/%d", step, total);
}

std::string FormatMetric(double value) { return absl::StrFormat("%.6g", value); }

std::string FormatCount(int64_t n) {
  const std::string digits =
      absl::StrFormat("%d", n < 0 ? -static_cast<uint64_t>(n) : static_cast<uint64_t>(n));
  std::string out = n < 0 ? "-" : "";
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

std::string FormatRate(double per_second) {
  if (!std::isfinite(per_second) || per_second < 0) return "-";
  // Each bound is where the shown digits would round up to 1000 of the unit: the next one instead.
  if (per_second < 999.5) return absl::StrFormat("%.0f", per_second);
  if (per_second < 999.95e3) return absl::StrFormat("%.1fk", per_second / 1e3);
  if (per_second < 999.995e6) return absl::StrFormat("%.2fM", per_second / 1e6);
  return absl::StrFormat("%.2fG", per_second / 1e9);
}

std::string FormatSeconds(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "-";
  if (seconds < 999.5e-6) return absl::StrFormat("%.0f us", seconds * 1e6);
  if (seconds < 0.99995) return absl::StrFormat("%.1f ms", seconds * 1e3);
  if (seconds < 60.0) return absl::StrFormat("%.2f s", seconds);
  return FormatDuration(seconds);
}

std::string FormatPercent(double ratio, int decimals) {
  if (!std::isfinite(ratio)) return "-";
  return absl::StrFormat("%.*f%%", std::max(decimals, 0), ratio * 100.0);
}

}  // namespace furnace::cli
