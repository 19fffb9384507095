#include "controller/spec/diagnostics.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "runtime/base/utf8.h"

namespace furnace::spec {
namespace {

// The bytes `text` takes in gRPC's grpc-message header, which percent-encodes every byte outside
// printable ASCII, and '%'.
size_t WireBytes(absl::string_view text) {
  size_t n = 0;
  for (const char c : text) n += (c < 0x20 || c > 0x7e || c == '%') ? 3 : 1;
  return n;
}

}  // namespace

void Diagnostics::Add(Position pos, absl::string_view path, Problem problem) {
  std::string text = absl::StrCat(path, ": ", problem.what);
  if (!problem.got.empty() && !problem.allowed.empty()) {
    absl::StrAppend(&text, " (got ", problem.got, "; allowed: ", problem.allowed, ")");
  } else if (!problem.got.empty()) {
    absl::StrAppend(&text, " (got ", problem.got, ")");
  } else if (!problem.allowed.empty()) {
    absl::StrAppend(&text, " (allowed: ", problem.allowed, ")");
  }
  failed_paths_.insert(std::string(path));
  AddRaw(pos, text);
}

void Diagnostics::AddRaw(Position pos, absl::string_view message) {
  if (!pos.known) pos = Position{0, 0, true};
  // One problem a line: a key or value quoted from the file may span lines (found by tests/fuzz).
  const std::string one_line = absl::StrReplaceAll(message, {{"\n", "\\n"}, {"\r", "\\r"}});
  entries_.push_back(
      Entry{pos, entries_.size(),
            absl::StrCat(filename_, ":", pos.line + 1, ":", pos.column + 1, ": ", one_line)});
}

Position Diagnostics::Where(absl::string_view path) const {
  std::string p(path);
  while (true) {
    auto it = fields_.find(p);
    if (it != fields_.end()) return it->second;
    size_t dot = p.rfind('.');
    if (dot == std::string::npos) return Position{0, 0, true};
    p.resize(dot);
  }
}

absl::Status Diagnostics::ToStatus() const {
  if (entries_.empty()) return absl::OkStatus();
  std::vector<Entry> sorted = entries_;
  std::sort(sorted.begin(), sorted.end(), [](const Entry& a, const Entry& b) {
    if (a.pos.line != b.pos.line) return a.pos.line < b.pos.line;
    if (a.pos.column != b.pos.column) return a.pos.column < b.pos.column;
    return a.seq < b.seq;
  });
  std::vector<std::string> lines;
  size_t bytes = 0;
  for (const Entry& e : sorted) {
    if (lines.size() == kMaxListedProblems) break;
    std::string line = SanitizeUtf8(e.text, kMaxLineBytes);
    const size_t cost = WireBytes(line) + 3;  // and its newline
    if (!lines.empty() && bytes + cost > kMaxMessageBytes) break;
    bytes += cost;
    lines.push_back(std::move(line));
  }
  if (lines.size() < sorted.size()) {
    const size_t more = sorted.size() - lines.size();
    lines.push_back(absl::StrCat(SanitizeUtf8(filename_, kMaxLineBytes / 4), ": ... and ", more,
                                 more == 1 ? " more problem" : " more problems",
                                 " not shown (fix these and check again)"));
  }
  return absl::InvalidArgumentError(absl::StrJoin(lines, "\n"));
}

}  // namespace furnace::spec
