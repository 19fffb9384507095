#include "runtime/base/utf8.h"

#include <algorithm>
#include <cstdint>

namespace furnace {

std::optional<size_t> FirstInvalidUtf8(std::string_view text) {
  const auto* s = reinterpret_cast<const uint8_t*>(text.data());
  const size_t n = text.size();
  size_t i = 0;
  while (i < n) {
    const uint8_t c = s[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t len = 0;
    uint8_t lo = 0x80, hi = 0xBF;  // the allowed range of the second byte
    if (c >= 0xC2 && c <= 0xDF) {
      len = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
      len = 3;
      if (c == 0xE0) lo = 0xA0;  // overlong
      if (c == 0xED) hi = 0x9F;  // surrogates
    } else if (c >= 0xF0 && c <= 0xF4) {
      len = 4;
      if (c == 0xF0) lo = 0x90;  // overlong
      if (c == 0xF4) hi = 0x8F;  // above U+10FFFF
    } else {
      return i;  // a continuation byte without a lead, C0/C1 (overlong) or F5..FF
    }
    // A broken sequence (a bad continuation, or the text ends inside it) is reported at its
    // lead byte.
    for (size_t k = 1; k < len; ++k) {
      if (i + k >= n) return i;
      const uint8_t b = s[i + k];
      if (b < (k == 1 ? lo : 0x80) || b > (k == 1 ? hi : 0xBF)) return i;
    }
    i += len;
  }
  return std::nullopt;
}

std::string SanitizeUtf8(std::string_view text, size_t max_bytes) {
  std::string out;
  out.reserve(std::min(text.size(), max_bytes));
  while (!text.empty()) {
    const std::optional<size_t> bad = FirstInvalidUtf8(text);
    const size_t good = bad.value_or(text.size());
    out.append(text.substr(0, good));
    if (!bad) break;
    out.push_back('?');
    text.remove_prefix(good + 1);
  }
  if (out.size() <= max_bytes) return out;
  size_t cut = max_bytes >= 3 ? max_bytes - 3 : 0;
  while (cut > 0 && (static_cast<uint8_t>(out[cut]) & 0xC0) == 0x80) --cut;  // not mid-character
  out.resize(cut);
  out.append("...");
  return out;
}

}  // namespace furnace
