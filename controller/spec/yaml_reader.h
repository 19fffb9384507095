// Typed, position-tracking access to one YAML mapping of the job file. Each getter names a key the
// schema allows at this level; it returns the value when the key is present and valid, nullopt when
// it is absent or invalid (an invalid value is recorded in Diagnostics with its path, position,
// the offending text and what is allowed). After the schema has asked for every key it knows,
// ReportUnknownKeys() flags the rest, listing the allowed keys and suggesting the closest one.
//
// Presence of every key is noted in Diagnostics so later cross-field checks can point at it.
// Holds a reference to a yaml-cpp node tree and to Diagnostics, both owned by the caller and
// outliving the reader. Not thread-safe.
#pragma once

#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "absl/strings/string_view.h"
#include "controller/spec/diagnostics.h"

namespace furnace::spec {

inline constexpr uint64_t kMaxU32 = std::numeric_limits<uint32_t>::max();
inline constexpr uint64_t kMaxU64 = std::numeric_limits<uint64_t>::max();
// Sizes and counts the runtime holds in 32-bit ints (runtime/model/config.h, the trainer's and the
// layout's counts), bounded far above any real model's and so that the products the runtime forms
// of them in int (4 * d_model, the fused 3 * d_model) stay in range; the products of several
// fields are cross-field checks (cross_checks.cc).
inline constexpr uint64_t kMaxVocab = uint64_t{1} << 24;  // 16,777,216 ids
inline constexpr uint64_t kMaxSeqLen = uint64_t{1} << 20;
inline constexpr uint64_t kMaxDModel = uint64_t{1} << 20;
inline constexpr uint64_t kMaxFfn = uint64_t{1} << 24;
inline constexpr uint64_t kMaxLayers = uint64_t{1} << 16;  // also heads, experts, top_k
inline constexpr uint64_t kMaxCount = uint64_t{1} << 20;   // parallel degrees, batch counts, keep

// Bounds for a real-valued field; `*_open` excludes the bound itself.
struct NumberRange {
  double min = -std::numeric_limits<double>::infinity();
  bool min_open = false;
  double max = std::numeric_limits<double>::infinity();
  bool max_open = false;
};
inline NumberRange AtLeast(double min) { return NumberRange{.min = min}; }
inline NumberRange Above(double min) { return NumberRange{.min = min, .min_open = true}; }
inline NumberRange Between(double min, double max) { return NumberRange{.min = min, .max = max}; }
// A duration in seconds: above 0 (or at least 0 with `zero_ok`), at most kMaxDurationS (11.6
// days), so that no deadline computed from it overflows (gRPC's, the clock's).
inline constexpr double kMaxDurationS = 1e6;
inline NumberRange Seconds(bool zero_ok = false) {
  return NumberRange{.min = 0, .min_open = !zero_ok, .max = kMaxDurationS};
}

// Renders a YAML node for "got ...": scalars quoted, others by kind ("a list", "a mapping").
std::string DescribeNode(const YAML::Node& node);
// Renders a range for "allowed: ...", e.g. "> 0", "[0, 1]", "1..255".
std::string DescribeRange(const NumberRange& range);
std::string DescribeRange(uint64_t min, uint64_t max);

class MapReader {
 public:
  // `node` is the mapping at dotted `path` ("" for the document root); `pos` is where it starts.
  // A null (absent or empty) node reads as an empty mapping; any other non-mapping is reported.
  MapReader(const YAML::Node& node, std::string path, Position pos, Diagnostics* diag);

  std::optional<uint64_t> Integer(absl::string_view key, uint64_t min, uint64_t max);
  // An integer in [min, max], or exactly `word` (plain, e.g. `every: auto`): then nullopt with
  // *is_word set. Errors name both ("0..4294967295, or auto").
  std::optional<uint64_t> IntegerOrWord(absl::string_view key, uint64_t min, uint64_t max,
                                        absl::string_view word, bool* is_word);
  std::optional<double> Number(absl::string_view key, const NumberRange& range);
  std::optional<bool> Bool(absl::string_view key);
  std::optional<std::string> String(absl::string_view key);
  std::optional<std::string> Enum(absl::string_view key, const std::vector<std::string>& allowed);
  // Bytes, as an integer or a string with a unit (see ParseSize).
  std::optional<uint64_t> Size(absl::string_view key, uint64_t min, uint64_t max);
  // A non-empty list of distinct values from `allowed`.
  std::optional<std::vector<std::string>> EnumList(absl::string_view key,
                                                   const std::vector<std::string>& allowed);
  // The nested mapping at `key` (empty when absent).
  MapReader Section(absl::string_view key);
  // The list of mappings at `key`, one reader per item (paths "key[i]"); nullopt when absent or
  // not a list (reported).
  std::optional<std::vector<MapReader>> SectionList(absl::string_view key);

  // Records a problem about `key` (at its value's position, or this mapping's when absent).
  void Report(absl::string_view key, Problem problem);
  // Flags every key in the mapping that no getter asked for.
  void ReportUnknownKeys();

  std::string PathOf(absl::string_view key) const;

 private:
  struct Entry {
    std::string key;
    YAML::Node key_node;
    YAML::Node value;
  };
  // Registers `key` as allowed; returns its entry when present.
  const Entry* Find(absl::string_view key);
  // The entry of `key` when present (nothing registered).
  const Entry* Lookup(absl::string_view key) const;
  Position ValuePosition(const Entry& entry) const;
  // The scalar text of a field that must be a plain (unquoted) scalar of kind `expected`
  // ("an integer", "a number", true or false); nullopt (and a recorded problem) otherwise.
  std::optional<std::string> PlainScalar(const Entry& entry, absl::string_view expected,
                                         const std::string& allowed);
  // Integer's checks of a present entry, with `allowed` as the allowed text.
  std::optional<uint64_t> CheckedInteger(const Entry& e, uint64_t min, uint64_t max,
                                         const std::string& allowed);

  std::string path_;
  Position pos_;
  Diagnostics* diag_;
  std::vector<Entry> entries_;                     // in file order
  std::unordered_map<std::string, size_t> index_;  // key -> its entry
  std::vector<std::string> allowed_keys_;          // in schema order, for messages
  std::unordered_set<std::string> allowed_set_;    // the same, to look up
};

Position PositionOf(const YAML::Mark& mark);

}  // namespace furnace::spec
