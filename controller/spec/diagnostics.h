// Collects every problem found in one job file, so the user fixes them all in one round instead of
// one per submit. Each problem is anchored at a YAML position and a dotted field path and renders
// as
//   FILE:LINE:COL: FIELD.PATH: <what is wrong> (got VALUE; allowed: ...)
// with 1-based line and column. Also remembers where each field that was present in the file sits,
// so cross-field checks (which run after all fields are read) can point at the right line.
//
// Not thread-safe; one instance per parse.
#pragma once

#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/string_view.h"

namespace furnace::spec {

// A 0-based position as yaml-cpp reports it; `known` is false for positions yaml-cpp did not
// record.
struct Position {
  int line = 0;
  int column = 0;
  bool known = false;
};

// One problem. `got` and `allowed` are optional (empty = omitted from the message).
struct Problem {
  std::string what;
  std::string got;
  std::string allowed;
};

class Diagnostics {
 public:
  explicit Diagnostics(std::string filename) : filename_(std::move(filename)) {}

  // Records a problem with field `path` at `pos`. An unknown position renders as 1:1.
  void Add(Position pos, absl::string_view path, Problem problem);
  // Records a problem that is not about one field (malformed YAML, empty file).
  void AddRaw(Position pos, absl::string_view message);

  // True if any problem was recorded for exactly `path` (cross-field checks skip such fields).
  bool Failed(absl::string_view path) const { return failed_paths_.count(std::string(path)) > 0; }
  // Whether a problem was recorded at `path` or at a field below it ("a.b" covers "a.b.c" and
  // "a.b[0]", not "a.bc").
  bool FailedAtOrBelow(absl::string_view path) const {
    for (auto it = failed_paths_.lower_bound(std::string(path));
         it != failed_paths_.end() && absl::StartsWith(*it, path); ++it) {
      if (it->size() == path.size() || (*it)[path.size()] == '.' || (*it)[path.size()] == '[') {
        return true;
      }
    }
    return false;
  }
  bool empty() const { return entries_.empty(); }

  // Remembers that `path` was present in the file at `pos`.
  void NoteField(absl::string_view path, Position pos) { fields_[std::string(path)] = pos; }
  bool Present(absl::string_view path) const { return fields_.count(std::string(path)) > 0; }
  // Where `path` is in the file; for an absent field, the position of its closest present ancestor
  // (the enclosing section, else the document start).
  Position Where(absl::string_view path) const;

  // OK when no problem was recorded; otherwise InvalidArgument listing the problems, one per
  // line, ordered by position in the file: the first kMaxListedProblems that fit in
  // kMaxMessageBytes, each cut to kMaxLineBytes, then `FILE: ... and N more problems not shown`.
  absl::Status ToStatus() const;

  // The refusal travels as a gRPC status message, which gRPC sends percent-encoded in a header
  // and a client refuses over 8 KiB of headers: a file with 60 unknown fields failed its submit
  // as "received initial metadata size exceeds limit" (exit 3) instead of listing them (exit 2).
  // So the listed lines take at most kMaxMessageBytes as sent (a byte outside printable ASCII, a
  // newline or '%' counts three), a long quoted value or key cannot take them all, and a file of
  // thousands of problems is not thousands of lines.
  static constexpr size_t kMaxListedProblems = 50;
  static constexpr size_t kMaxMessageBytes = 3584;
  static constexpr size_t kMaxLineBytes = 512;

 private:
  struct Entry {
    Position pos;
    size_t seq;
    std::string text;
  };
  std::string filename_;
  std::vector<Entry> entries_;
  std::set<std::string> failed_paths_;
  std::map<std::string, Position> fields_;
};

}  // namespace furnace::spec
