#include "runtime/base/log_text.h"

#include <cstdint>
#include <cstdio>
#include <optional>

#include "runtime/base/utf8.h"

namespace furnace {
namespace {

// The length of the valid UTF-8 character at the start of `text`, or nullopt when its first byte
// starts none (FirstInvalidUtf8 reports a broken sequence at its lead byte).
std::optional<size_t> CharacterLength(std::string_view text) {
  const auto lead = static_cast<uint8_t>(text[0]);
  const size_t length = lead < 0x80 ? 1 : lead < 0xE0 ? 2 : lead < 0xF0 ? 3 : 4;
  if (length > text.size() || FirstInvalidUtf8(text.substr(0, length)).has_value()) {
    return std::nullopt;
  }
  return length;
}

// The code point of a valid character of `length` bytes.
uint32_t CodePoint(std::string_view c) {
  const auto b = [&](size_t i) { return static_cast<uint32_t>(static_cast<uint8_t>(c[i])); };
  switch (c.size()) {
    case 1:
      return b(0);
    case 2:
      return ((b(0) & 0x1F) << 6) | (b(1) & 0x3F);
    case 3:
      return ((b(0) & 0x0F) << 12) | ((b(1) & 0x3F) << 6) | (b(2) & 0x3F);
    default:
      return ((b(0) & 0x07) << 18) | ((b(1) & 0x3F) << 12) | ((b(2) & 0x3F) << 6) | (b(3) & 0x3F);
  }
}

// Characters a terminal acts on rather than shows.
bool IsControl(uint32_t cp) {
  return cp < 0x20 || (cp >= 0x7F && cp <= 0x9F) || (cp >= 0x202A && cp <= 0x202E) ||
         (cp >= 0x2066 && cp <= 0x2069);
}

std::string Hex(const char* format, uint32_t value) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), format, value);
  return buf;
}

}  // namespace

std::string EscapeForLog(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  while (!text.empty()) {
    const std::optional<size_t> length = CharacterLength(text);
    if (!length) {
      out += Hex("\\x%02x", static_cast<uint8_t>(text[0]));
      text.remove_prefix(1);
      continue;
    }
    const std::string_view c = text.substr(0, *length);
    text.remove_prefix(*length);
    const uint32_t cp = CodePoint(c);
    if (!IsControl(cp)) {
      out.append(c);
    } else if (cp == '\n') {
      out += "\\n";
    } else if (cp == '\r') {
      out += "\\r";
    } else if (cp == '\t') {
      out += "\\t";
    } else if (cp < 0x80) {
      out += Hex("\\x%02x", cp);
    } else {
      out += Hex("\\u%04x", cp);
    }
  }
  return out;
}

std::string PrintableBaseName(std::string_view path, size_t max_bytes) {
  if (const size_t slash = path.rfind('/'); slash != std::string_view::npos) {
    path.remove_prefix(slash + 1);
  }
  if (path == "." || path == "..") return "";
  std::string out;
  out.reserve(path.size());
  while (!path.empty()) {
    const std::optional<size_t> length = CharacterLength(path);
    const size_t taken = length.value_or(1);
    if (length && !IsControl(CodePoint(path.substr(0, taken)))) {
      out.append(path.substr(0, taken));
    } else {
      out.push_back('?');
    }
    path.remove_prefix(taken);
  }
  return SanitizeUtf8(out, max_bytes);  // valid already: only the cut
}

}  // namespace furnace
