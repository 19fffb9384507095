#include "runtime/base/path_root.h"

#include <filesystem>
#include <system_error>

#include "absl/strings/str_cat.h"

namespace furnace {
namespace {

namespace fs = std::filesystem;

// `p` is `root` or below it (both absolute and normal).
bool IsUnder(const fs::path& p, const fs::path& root) {
  auto r = root.begin(), q = p.begin();
  for (; r != root.end(); ++r, ++q) {
    if (r->empty()) continue;  // the empty name after a trailing separator
    if (q == p.end() || *q != *r) return false;
  }
  return true;
}

absl::Status Escape(const std::string& root, const std::string& path, const std::string& field,
                    const std::string& flag, const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", path, " is outside ", flag, " ", root,
                                                 " (", why, "); allowed: paths under ", root));
}

// The real path of `p` (absolute, normal): its existing part with symlinks resolved.
absl::StatusOr<fs::path> RealPath(const fs::path& p, const std::string& field) {
  std::error_code ec;
  fs::path real = fs::weakly_canonical(p, ec);
  if (ec) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": cannot resolve ", p.string(), ": ", ec.message()));
  }
  return real.lexically_normal();
}

}  // namespace

absl::StatusOr<std::string> ResolveRoot(const std::string& root, const std::string& flag) {
  if (root.empty()) return absl::InvalidArgumentError(absl::StrCat(flag, ": empty directory"));
  std::error_code ec;
  const fs::path absolute = fs::absolute(fs::path(root), ec);
  if (ec) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, " ", root, ": cannot resolve: ", ec.message()));
  }
  fs::path real = fs::weakly_canonical(absolute, ec);
  if (ec) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, " ", root, ": cannot resolve: ", ec.message()));
  }
  std::string out = real.lexically_normal().string();
  while (out.size() > 1 && out.back() == '/') out.pop_back();
  return out;
}

absl::StatusOr<std::string> ConfinePath(const std::string& root, const std::string& path,
                                        const std::string& field, const std::string& flag,
                                        const std::vector<std::string>& suffixes) {
  const fs::path root_path(root);
  const fs::path given(path);
  const fs::path joined = (given.is_absolute() ? given : root_path / given).lexically_normal();
  if (!IsUnder(joined, root_path)) {
    return Escape(root, path, field, flag,
                  given.is_absolute() ? "an absolute path elsewhere"
                                      : absl::StrCat("`..` leads to ", joined.string()));
  }
  std::vector<std::string> checked = {""};
  checked.insert(checked.end(), suffixes.begin(), suffixes.end());
  fs::path resolved;
  for (const std::string& suffix : checked) {
    const fs::path p(joined.string() + suffix);
    absl::StatusOr<fs::path> real = RealPath(p, field);
    if (!real.ok()) return real.status();
    if (!IsUnder(*real, root_path)) {
      return Escape(root, path, field, flag,
                    absl::StrCat("a symlink: ", p.string(), " resolves to ", real->string()));
    }
    if (suffix.empty()) resolved = *real;
  }
  return resolved.string();
}

}  // namespace furnace
