// UTF-8 validation for text that crosses into protobuf string fields (job files, file names):
// protobuf refuses to serialise or parse a string field that is not valid UTF-8, so callers check
// first and report where the text goes wrong. Stateless and thread-safe.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

namespace furnace {

// The byte offset at which `text` stops being valid UTF-8 (RFC 3629: no overlong forms, no
// surrogates, nothing above U+10FFFF, no truncated sequence): the first byte that cannot start a
// character, or the lead byte of the first broken multi-byte sequence. nullopt when all of `text`
// is valid.
std::optional<size_t> FirstInvalidUtf8(std::string_view text);

// `text` as valid UTF-8 for a record a person reads: each invalid byte becomes '?', and the result
// is cut (at a character boundary) to at most `max_bytes`, marked with "..." when cut.
std::string SanitizeUtf8(std::string_view text, size_t max_bytes);

}  // namespace furnace
