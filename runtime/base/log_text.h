// Text that came from outside the process (a submitted file name, the paths a job names, a
// worker's id, a rendezvous key) made safe for a log line. The daemons log to a terminal or a
// journal that an operator reads: a raw ESC, CR or LF in such text could clear the screen, rewrite
// what is shown or forge whole log lines (`\r\n... admin cancel job-9 accepted`). Stateless and
// thread-safe.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace furnace {

// `text` with every control character escaped, so that it stays on its line and prints as itself:
// \n, \r and \t as those two characters, the other C0 controls and DEL as \xNN, the C1 controls
// (U+0080..U+009F) and the bidirectional overrides and isolates (U+202A..U+202E, U+2066..U+2069:
// they reorder what a terminal shows) as \uNNNN, and a byte that is not valid UTF-8 as \xNN.
// Printable text, UTF-8 included, is unchanged; a backslash is not escaped.
std::string EscapeForLog(std::string_view text);

// The last component of `path` (after its last '/'), cut to at most `max_bytes` (at a character
// boundary) and kept printable: every control character or bidirectional control (as above) and
// every byte that is not valid UTF-8 becomes '?'. Empty for a path that ends in '/', ".", ".."
// or "": the caller names it otherwise.
std::string PrintableBaseName(std::string_view path, size_t max_bytes);

}  // namespace furnace
