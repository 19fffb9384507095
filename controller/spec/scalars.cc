#include "controller/spec/scalars.h"

#include <charconv>
#include <cmath>
#include <limits>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace furnace::spec {
namespace {

bool IsDigit(char c) { return c >= '0' && c <= '9'; }

struct Unit {
  absl::string_view name;
  uint64_t bytes;
};
constexpr Unit kUnits[] = {
    {"B", 1},
    {"KB", 1000ull},
    {"MB", 1000ull * 1000},
    {"GB", 1000ull * 1000 * 1000},
    {"KiB", 1ull << 10},
    {"MiB", 1ull << 20},
    {"GiB", 1ull << 30},
};

}  // namespace

absl::StatusOr<ParsedInteger> ParseInteger(absl::string_view text) {
  ParsedInteger out;
  absl::string_view digits = text;
  if (!digits.empty() && (digits[0] == '+' || digits[0] == '-')) {
    out.negative = digits[0] == '-';
    digits.remove_prefix(1);
  }
  if (digits.empty()) return absl::InvalidArgumentError("expected an integer");
  for (char c : digits) {
    if (!IsDigit(c)) return absl::InvalidArgumentError("expected an integer");
  }
  auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), out.magnitude);
  if (ec == std::errc::result_out_of_range) {
    return absl::OutOfRangeError("integer is too large");
  }
  if (ec != std::errc() || end != digits.data() + digits.size()) {
    return absl::InvalidArgumentError("expected an integer");
  }
  if (out.magnitude == 0) out.negative = false;
  return out;
}

absl::StatusOr<double> ParseNumber(absl::string_view text) {
  absl::string_view body = text;
  if (!body.empty() && body[0] == '+') body.remove_prefix(1);
  // from_chars also accepts "inf", "nan" and hex floats; require a digit-led decimal spelling.
  size_t first = (!body.empty() && body[0] == '-') ? 1 : 0;
  if (body.size() <= first || !(IsDigit(body[first]) || body[first] == '.')) {
    return absl::InvalidArgumentError("expected a number");
  }
  double value = 0;
  auto [end, ec] = std::from_chars(body.data(), body.data() + body.size(), value);
  if (ec == std::errc::result_out_of_range && end == body.data() + body.size()) {
    // A well-formed number a double cannot hold: too large, or so small that it would be 0.
    const size_t e = body.find_first_of("eE");
    const bool tiny = e != absl::string_view::npos && e + 1 < body.size() && body[e + 1] == '-';
    return absl::OutOfRangeError(tiny ? "too small: it would be 0 as a double (the smallest is "
                                        "about 2.2e-308)"
                                      : "too large for a double (the largest is about 1.8e308)");
  }
  if (ec != std::errc() || end != body.data() + body.size()) {
    return absl::InvalidArgumentError("expected a number");
  }
  if (!std::isfinite(value)) return absl::InvalidArgumentError("expected a finite number");
  return value;
}

absl::StatusOr<bool> ParseBool(absl::string_view text) {
  if (text == "true") return true;
  if (text == "false") return false;
  return absl::InvalidArgumentError("expected true or false");
}

absl::StatusOr<uint64_t> ParseSize(absl::string_view text) {
  absl::string_view rest = absl::StripAsciiWhitespace(text);
  if (!rest.empty() && rest[0] == '-') return absl::OutOfRangeError("size must not be negative");
  if (!rest.empty() && rest[0] == '+') rest.remove_prefix(1);
  // Mantissa: digits, optionally '.' and more digits; kept exact as integer / 10^frac_digits.
  unsigned __int128 mantissa = 0;
  int frac_digits = 0;
  size_t i = 0;
  bool any_digit = false;
  bool seen_point = false;
  for (; i < rest.size(); ++i) {
    char c = rest[i];
    if (IsDigit(c)) {
      any_digit = true;
      if (mantissa > std::numeric_limits<uint64_t>::max()) {
        return absl::OutOfRangeError("size is too large");
      }
      mantissa = mantissa * 10 + static_cast<unsigned>(c - '0');
      if (seen_point) ++frac_digits;
    } else if (c == '.' && !seen_point) {
      seen_point = true;
    } else {
      break;
    }
  }
  if (!any_digit || frac_digits > 18) {
    return absl::InvalidArgumentError("expected a size");
  }
  absl::string_view unit_text = absl::StripLeadingAsciiWhitespace(rest.substr(i));
  uint64_t multiplier = 1;
  if (!unit_text.empty()) {
    bool found = false;
    for (const Unit& unit : kUnits) {
      if (unit.name == unit_text) {
        multiplier = unit.bytes;
        found = true;
      }
    }
    if (!found)
      return absl::InvalidArgumentError(absl::StrCat("unknown size unit '", unit_text, "'"));
  } else if (seen_point) {
    return absl::InvalidArgumentError("a size without a unit must be a whole number of bytes");
  }
  unsigned __int128 scaled = mantissa * multiplier;
  unsigned __int128 divisor = 1;
  for (int d = 0; d < frac_digits; ++d) divisor *= 10;
  if (scaled % divisor != 0) return absl::InvalidArgumentError("not a whole number of bytes");
  scaled /= divisor;
  if (scaled > std::numeric_limits<uint64_t>::max()) {
    return absl::OutOfRangeError("size is too large");
  }
  return static_cast<uint64_t>(scaled);
}

std::string FormatSize(uint64_t bytes) {
  if (bytes == 0) return "0";
  // Largest binary unit that divides exactly, else largest decimal one, else plain bytes.
  for (int u = 6; u >= 4; --u) {
    if (bytes % kUnits[u].bytes == 0) return absl::StrCat(bytes / kUnits[u].bytes, kUnits[u].name);
  }
  for (int u = 3; u >= 1; --u) {
    if (bytes % kUnits[u].bytes == 0) return absl::StrCat(bytes / kUnits[u].bytes, kUnits[u].name);
  }
  return absl::StrCat(bytes);
}

}  // namespace furnace::spec
