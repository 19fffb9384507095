// The dashboard's static files: maps a URL path onto a file under a root directory, refusing
// anything that could reach outside it, and names its content type.
//
// A path is accepted only if every segment is a plain name: no "..", ".", empty or hidden
// (".x") segment, no backslash, no NUL. The resolved file must still lie under the root after
// symlinks are followed, be a regular file, have a known extension (html, js, css, svg, png, ico,
// json, map, txt) and be smaller than kMaxStaticFileBytes.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace furnace::controller::http {

inline constexpr int64_t kMaxStaticFileBytes = 16 << 20;

struct StaticFile {
  std::string content_type;
  std::string body;
};

// "/" means "/index.html". Errors: InvalidArgument for an unsafe path, NotFound for a missing
// file or an unknown extension, Internal when the file cannot be read.
absl::StatusOr<StaticFile> ReadStaticFile(const std::string& root, const std::string& url_path);

// "text/css; charset=utf-8" for "style.css"; empty for an extension not served.
std::string ContentTypeFor(const std::string& filename);

// Where the dashboard is installed next to a binary: <dir of exe>/../share/furnace/web (the build
// tree and an install prefix share that layout). Empty if the executable cannot be found.
std::string DefaultWebRoot();

}  // namespace furnace::controller::http
