// Strict parsers for the text of YAML scalars. YAML 1.1 is loose (yes/no are booleans, 010 is
// octal, 1_000 is an integer); a job file is safer when each field accepts exactly one obvious
// spelling, so these accept only: decimal integers, finite decimal numbers, true/false, and byte
// sizes written as an integer or a number with a unit. Errors carry only the "what is wrong" text;
// the caller adds file, position, field path and value.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace furnace::spec {

// A decimal integer, `[+-]?[0-9]+`, split into sign and magnitude so that the full uint64 range and
// negative values can both be told apart from garbage.
struct ParsedInteger {
  bool negative = false;
  uint64_t magnitude = 0;
};
absl::StatusOr<ParsedInteger> ParseInteger(absl::string_view text);

// A finite decimal number: an integer or a float such as 3e-4, 0.5, -1.
absl::StatusOr<double> ParseNumber(absl::string_view text);

// Exactly `true` or `false`.
absl::StatusOr<bool> ParseBool(absl::string_view text);

// Bytes: a non-negative integer, or a number followed by one of B, KB, MB, GB (powers of 1000),
// KiB, MiB, GiB (powers of 1024), with optional space between: "4096", "512MiB", "1.5GB". The
// result must be a whole number of bytes that fits in uint64.
absl::StatusOr<uint64_t> ParseSize(absl::string_view text);

// The accepted units, for "allowed:" lists.
inline constexpr absl::string_view kSizeUnitsHelp =
    "an integer or a number with a unit B, KB, MB, GB, KiB, MiB, GiB (e.g. 512MiB, 1.5GB)";

// Renders a byte count the way a user would write it: "4KiB", "1.5GB" when exact, else digits.
std::string FormatSize(uint64_t bytes);

}  // namespace furnace::spec
