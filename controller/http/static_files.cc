#include "controller/http/static_files.h"

#include <filesystem>
#include <fstream>
#include <sstream>
#include <system_error>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_split.h"

namespace furnace::controller::http {
namespace fs = std::filesystem;

namespace {

bool SafeSegment(absl::string_view s) {
  if (s.empty() || s.front() == '.') return false;  // "", ".", "..", hidden files
  for (char c : s) {
    if (c == '\\' || c == '\0' || static_cast<unsigned char>(c) < 0x20) return false;
  }
  return true;
}

// True if `p` equals `root` or lies below it (both canonical).
bool Under(const fs::path& p, const fs::path& root) {
  auto r = root.begin();
  auto q = p.begin();
  for (; r != root.end(); ++r, ++q) {
    if (q == p.end() || *q != *r) return false;
  }
  return true;
}

}  // namespace

std::string ContentTypeFor(const std::string& filename) {
  const std::string ext = fs::path(filename).extension().string();
  if (ext == ".html") return "text/html; charset=utf-8";
  if (ext == ".js") return "text/javascript; charset=utf-8";
  if (ext == ".css") return "text/css; charset=utf-8";
  if (ext == ".json" || ext == ".map") return "application/json; charset=utf-8";
  if (ext == ".txt") return "text/plain; charset=utf-8";
  if (ext == ".svg") return "image/svg+xml";
  if (ext == ".png") return "image/png";
  if (ext == ".ico") return "image/x-icon";
  return "";
}

absl::StatusOr<StaticFile> ReadStaticFile(const std::string& root, const std::string& url_path) {
  if (url_path.empty() || url_path.front() != '/') {
    return absl::InvalidArgumentError("path must start with '/'");
  }
  const std::string rel = url_path == "/" ? "index.html" : url_path.substr(1);
  for (absl::string_view seg : absl::StrSplit(rel, '/')) {
    if (!SafeSegment(seg)) return absl::InvalidArgumentError("bad path");
  }
  StaticFile out;
  out.content_type = ContentTypeFor(rel);
  if (out.content_type.empty()) return absl::NotFoundError("not found");

  std::error_code ec;
  const fs::path canonical_root = fs::canonical(root, ec);
  if (ec) return absl::NotFoundError("no dashboard installed");
  const fs::path file = fs::weakly_canonical(canonical_root / rel, ec);
  if (ec || !Under(file, canonical_root)) return absl::InvalidArgumentError("bad path");
  if (!fs::is_regular_file(file, ec)) return absl::NotFoundError("not found");
  const auto size = fs::file_size(file, ec);
  if (ec || size > static_cast<uintmax_t>(kMaxStaticFileBytes)) {
    return absl::InternalError("cannot serve " + rel);
  }
  std::ifstream in(file, std::ios::binary);
  std::ostringstream buf;
  buf << in.rdbuf();
  if (!in.good() && !in.eof()) return absl::InternalError("cannot read " + rel);
  out.body = std::move(buf).str();
  return out;
}

std::string DefaultWebRoot() {
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (ec) return "";
  return (exe.parent_path().parent_path() / "share" / "furnace" / "web").string();
}

}  // namespace furnace::controller::http
