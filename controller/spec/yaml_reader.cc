#include "controller/spec/yaml_reader.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "controller/spec/scalars.h"
#include "controller/spec/suggest.h"

namespace furnace::spec {
namespace {

// yaml-cpp tags plain scalars "?" and quoted ones "!".
bool IsQuoted(const YAML::Node& node) { return node.Tag() == "!"; }

std::string Quote(absl::string_view text) { return absl::StrCat("'", text, "'"); }

// A whole bound in full ("31622400", not StrCat's "3.16224e+07"); others as StrCat gives them.
std::string FormatNumber(double v) {
  if (std::abs(v) < 1e15 && v == std::floor(v)) return absl::StrCat(static_cast<int64_t>(v));
  return absl::StrCat(v);
}

std::string JoinAllowed(const std::vector<std::string>& values) {
  std::vector<std::string> shown;
  for (const std::string& v : values) shown.push_back(v.empty() ? "\"\"" : v);
  return absl::StrJoin(shown, ", ");
}

}  // namespace

Position PositionOf(const YAML::Mark& mark) {
  if (mark.is_null()) return Position{};
  return Position{mark.line, mark.column, true};
}

std::string DescribeNode(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Scalar:
      return IsQuoted(node) ? absl::StrCat("the quoted string \"", node.Scalar(), "\"")
                            : Quote(node.Scalar());
    case YAML::NodeType::Sequence:
      return "a list";
    case YAML::NodeType::Map:
      return "a mapping";
    default:
      return "an empty value";
  }
}

std::string DescribeRange(const NumberRange& r) {
  const bool has_min = std::isfinite(r.min);
  const bool has_max = std::isfinite(r.max);
  if (has_min && has_max) {
    return absl::StrCat(r.min_open ? "(" : "[", FormatNumber(r.min), ", ", FormatNumber(r.max),
                        r.max_open ? ")" : "]");
  }
  if (has_min) return absl::StrCat(r.min_open ? "> " : ">= ", FormatNumber(r.min));
  if (has_max) return absl::StrCat(r.max_open ? "< " : "<= ", FormatNumber(r.max));
  return "any number";
}

std::string DescribeRange(uint64_t min, uint64_t max) { return absl::StrCat(min, "..", max); }

MapReader::MapReader(const YAML::Node& node, std::string path, Position pos, Diagnostics* diag)
    : path_(std::move(path)), pos_(pos), diag_(diag) {
  if (!node.IsDefined() || node.IsNull()) return;
  if (!node.IsMap()) {
    diag_->Add(PositionOf(node.Mark()), path_.empty() ? "top level" : path_,
               Problem{"expected a mapping of fields", DescribeNode(node), ""});
    return;
  }
  for (const auto& kv : node) {
    const YAML::Node key = kv.first;
    if (!key.IsScalar()) {
      diag_->Add(PositionOf(key.Mark()), path_.empty() ? "top level" : path_,
                 Problem{"field names must be plain strings", DescribeNode(key), ""});
      continue;
    }
    // A hash index, not a search of the entries so far: a 1 MiB file of 95,000 keys took
    // 13 s to check for duplicates that way (quadratic), on the controller's submit path.
    const auto [at, inserted] = index_.try_emplace(key.Scalar(), entries_.size());
    if (!inserted) {
      diag_->Add(
          PositionOf(key.Mark()), PathOf(key.Scalar()),
          Problem{absl::StrCat("duplicate field (first set on line ",
                               PositionOf(entries_[at->second].key_node.Mark()).line + 1, ")"),
                  "", ""});
      continue;
    }
    entries_.push_back(Entry{key.Scalar(), key, kv.second});
  }
}

const MapReader::Entry* MapReader::Lookup(absl::string_view key) const {
  const auto it = index_.find(std::string(key));
  return it == index_.end() ? nullptr : &entries_[it->second];
}

std::string MapReader::PathOf(absl::string_view key) const {
  return path_.empty() ? std::string(key) : absl::StrCat(path_, ".", key);
}

const MapReader::Entry* MapReader::Find(absl::string_view key) {
  allowed_keys_.emplace_back(key);
  allowed_set_.emplace(key);
  const Entry* e = Lookup(key);
  if (e != nullptr) {
    diag_->NoteField(PathOf(key),
                     e->value.IsMap() ? PositionOf(e->key_node.Mark()) : ValuePosition(*e));
  }
  return e;
}

Position MapReader::ValuePosition(const Entry& entry) const {
  // An empty value's mark points past the key's line; the key is where the user looks.
  if (entry.value.IsNull()) return PositionOf(entry.key_node.Mark());
  Position p = PositionOf(entry.value.Mark());
  return p.known ? p : PositionOf(entry.key_node.Mark());
}

void MapReader::Report(absl::string_view key, Problem problem) {
  const Entry* e = Lookup(key);
  diag_->Add(e != nullptr ? ValuePosition(*e) : pos_, PathOf(key), std::move(problem));
}

std::optional<std::string> MapReader::PlainScalar(const Entry& e, absl::string_view expected,
                                                  const std::string& allowed) {
  if (!e.value.IsScalar() || IsQuoted(e.value)) {
    diag_->Add(
        ValuePosition(e), PathOf(e.key),
        Problem{absl::StrCat("expected ", expected, ", got ", DescribeNode(e.value)), "", allowed});
    return std::nullopt;
  }
  return e.value.Scalar();
}

std::optional<uint64_t> MapReader::Integer(absl::string_view key, uint64_t min, uint64_t max) {
  const Entry* e = Find(key);
  if (e == nullptr) return std::nullopt;
  return CheckedInteger(*e, min, max, DescribeRange(min, max));
}

std::optional<uint64_t> MapReader::IntegerOrWord(absl::string_view key, uint64_t min, uint64_t max,
                                                 absl::string_view word, bool* is_word) {
  *is_word = false;
  const Entry* e = Find(key);
  if (e == nullptr) return std::nullopt;
  if (e->value.IsScalar() && !IsQuoted(e->value) && e->value.Scalar() == word) {
    *is_word = true;
    return std::nullopt;
  }
  return CheckedInteger(*e, min, max, absl::StrCat(DescribeRange(min, max), ", or ", word));
}

std::optional<uint64_t> MapReader::CheckedInteger(const Entry& e, uint64_t min, uint64_t max,
                                                  const std::string& allowed) {
  std::optional<std::string> text = PlainScalar(e, "an integer", allowed);
  if (!text) return std::nullopt;
  absl::StatusOr<ParsedInteger> parsed = ParseInteger(*text);
  if (!parsed.ok() && absl::IsInvalidArgument(parsed.status())) {
    diag_->Add(ValuePosition(e), PathOf(e.key),
               Problem{absl::StrCat("expected an integer, got ", Quote(*text)), "", allowed});
    return std::nullopt;
  }
  if (!parsed.ok() || (!parsed->negative && parsed->magnitude > max)) {
    diag_->Add(ValuePosition(e), PathOf(e.key),
               Problem{absl::StrCat("must be <= ", max), *text, allowed});
    return std::nullopt;
  }
  if (parsed->negative || parsed->magnitude < min) {
    diag_->Add(ValuePosition(e), PathOf(e.key),
               Problem{absl::StrCat("must be >= ", min), *text, allowed});
    return std::nullopt;
  }
  return parsed->magnitude;
}

std::optional<double> MapReader::Number(absl::string_view key, const NumberRange& range) {
  const Entry* e = Find(key);
  if (e == nullptr) return std::nullopt;
  const std::string allowed = DescribeRange(range);
  std::optional<std::string> text = PlainScalar(*e, "a number", allowed);
  if (!text) return std::nullopt;
  absl::StatusOr<double> value = ParseNumber(*text);
  if (!value.ok()) {
    diag_->Add(
        ValuePosition(*e), PathOf(key),
        Problem{absl::StrCat(value.status().message(), ", got ", Quote(*text)), "", allowed});
    return std::nullopt;
  }
  const bool below = range.min_open ? *value <= range.min : *value < range.min;
  const bool above = range.max_open ? *value >= range.max : *value > range.max;
  if (below || above) {
    diag_->Add(ValuePosition(*e), PathOf(key), Problem{"out of range", *text, allowed});
    return std::nullopt;
  }
  return *value;
}

std::optional<bool> MapReader::Bool(absl::string_view key) {
  const Entry* e = Find(key);
  if (e == nullptr) return std::nullopt;
  std::optional<std::string> text = PlainScalar(*e, "true or false", "true, false");
  if (!text) return std::nullopt;
  absl::StatusOr<bool> value = ParseBool(*text);
  if (!value.ok()) {
    diag_->Add(
        ValuePosition(*e), PathOf(key),
        Problem{absl::StrCat("expected true or false, got ", Quote(*text)), "", "true, false"});
    return std::nullopt;
  }
  return *value;
}

std::optional<std::string> MapReader::String(absl::string_view key) {
  const Entry* e = Find(key);
  if (e == nullptr) return std::nullopt;
  if (!e->value.IsScalar()) {
    diag_->Add(ValuePosition(*e), PathOf(key),
               Problem{absl::StrCat("expected a string, got ", DescribeNode(e->value)), "", ""});
    return std::nullopt;
  }
  return e->value.Scalar();
}

std::optional<std::string> MapReader::Enum(absl::string_view key,
                                           const std::vector<std::string>& allowed) {
  const Entry* e = Find(key);
  if (e == nullptr) return std::nullopt;
  if (!e->value.IsScalar()) {
    diag_->Add(
        ValuePosition(*e), PathOf(key),
        Problem{absl::StrCat("expected one of the allowed names, got ", DescribeNode(e->value)), "",
                JoinAllowed(allowed)});
    return std::nullopt;
  }
  const std::string& value = e->value.Scalar();
  if (std::find(allowed.begin(), allowed.end(), value) != allowed.end()) return value;
  std::string what = "unknown value";
  if (std::string guess = ClosestMatch(value, allowed); !guess.empty()) {
    absl::StrAppend(&what, "; did you mean '", guess, "'?");
  }
  diag_->Add(ValuePosition(*e), PathOf(key), Problem{what, Quote(value), JoinAllowed(allowed)});
  return std::nullopt;
}

std::optional<uint64_t> MapReader::Size(absl::string_view key, uint64_t min, uint64_t max) {
  const Entry* e = Find(key);
  if (e == nullptr) return std::nullopt;
  const std::string allowed =
      absl::StrCat(FormatSize(min), "..", FormatSize(max), ", as ", kSizeUnitsHelp);
  if (!e->value.IsScalar()) {
    diag_->Add(ValuePosition(*e), PathOf(key),
               Problem{absl::StrCat("expected a size in bytes, got ", DescribeNode(e->value)), "",
                       allowed});
    return std::nullopt;
  }
  const std::string& text = e->value.Scalar();
  absl::StatusOr<uint64_t> bytes = ParseSize(text);
  if (!bytes.ok()) {
    diag_->Add(ValuePosition(*e), PathOf(key),
               Problem{std::string(bytes.status().message()), Quote(text), allowed});
    return std::nullopt;
  }
  if (*bytes < min || *bytes > max) {
    diag_->Add(ValuePosition(*e), PathOf(key),
               Problem{*bytes < min ? absl::StrCat("must be >= ", FormatSize(min))
                                    : absl::StrCat("must be <= ", FormatSize(max)),
                       Quote(text), allowed});
    return std::nullopt;
  }
  return *bytes;
}

std::optional<std::vector<std::string>> MapReader::EnumList(
    absl::string_view key, const std::vector<std::string>& allowed) {
  const Entry* e = Find(key);
  if (e == nullptr) return std::nullopt;
  const std::string allowed_text =
      absl::StrCat("a non-empty list of distinct values from: ", JoinAllowed(allowed));
  if (!e->value.IsSequence()) {
    diag_->Add(
        ValuePosition(*e), PathOf(key),
        Problem{absl::StrCat("expected a list, got ", DescribeNode(e->value)), "", allowed_text});
    return std::nullopt;
  }
  if (e->value.size() == 0) {
    diag_->Add(ValuePosition(*e), PathOf(key), Problem{"must not be empty", "[]", allowed_text});
    return std::nullopt;
  }
  std::vector<std::string> out;
  bool ok = true;
  for (size_t i = 0; i < e->value.size(); ++i) {
    const YAML::Node item = e->value[i];
    const std::string item_path = absl::StrCat(PathOf(key), "[", i, "]");
    Position item_pos = PositionOf(item.Mark());
    if (!item_pos.known || item.IsNull()) item_pos = ValuePosition(*e);
    if (!item.IsScalar()) {
      diag_->Add(item_pos, item_path,
                 Problem{absl::StrCat("expected a name, got ", DescribeNode(item)), "",
                         JoinAllowed(allowed)});
      ok = false;
      continue;
    }
    const std::string& value = item.Scalar();
    if (std::find(allowed.begin(), allowed.end(), value) == allowed.end()) {
      std::string what = "unknown value";
      if (std::string guess = ClosestMatch(value, allowed); !guess.empty()) {
        absl::StrAppend(&what, "; did you mean '", guess, "'?");
      }
      diag_->Add(item_pos, item_path, Problem{what, Quote(value), JoinAllowed(allowed)});
      ok = false;
      continue;
    }
    if (std::find(out.begin(), out.end(), value) != out.end()) {
      diag_->Add(item_pos, item_path, Problem{"duplicate value", Quote(value), allowed_text});
      ok = false;
      continue;
    }
    out.push_back(value);
  }
  if (!ok) return std::nullopt;
  return out;
}

MapReader MapReader::Section(absl::string_view key) {
  const Entry* e = Find(key);
  if (e == nullptr) return MapReader(YAML::Node(), PathOf(key), diag_->Where(path_), diag_);
  return MapReader(e->value, PathOf(key), PositionOf(e->key_node.Mark()), diag_);
}

std::optional<std::vector<MapReader>> MapReader::SectionList(absl::string_view key) {
  const Entry* e = Find(key);
  if (e == nullptr) return std::nullopt;
  if (!e->value.IsSequence()) {
    diag_->Add(ValuePosition(*e), PathOf(key),
               Problem{absl::StrCat("expected a list, got ", DescribeNode(e->value)), "",
                       "a list of mappings"});
    return std::nullopt;
  }
  std::vector<MapReader> out;
  for (size_t i = 0; i < e->value.size(); ++i) {
    const YAML::Node item = e->value[i];
    const std::string item_path = absl::StrCat(PathOf(key), "[", i, "]");
    Position item_pos = PositionOf(item.Mark());
    if (!item_pos.known || item.IsNull()) item_pos = ValuePosition(*e);
    diag_->NoteField(item_path, item_pos);
    out.emplace_back(item, item_path, item_pos, diag_);
  }
  return out;
}

void MapReader::ReportUnknownKeys() {
  for (const Entry& e : entries_) {
    if (allowed_set_.count(e.key) > 0) continue;
    std::string what = "unknown field";
    if (std::string guess = ClosestMatch(e.key, allowed_keys_); !guess.empty()) {
      absl::StrAppend(&what, "; did you mean '", guess, "'?");
    }
    diag_->Add(PositionOf(e.key_node.Mark()), PathOf(e.key),
               Problem{what, "", absl::StrJoin(allowed_keys_, ", ")});
  }
}

}  // namespace furnace::spec
