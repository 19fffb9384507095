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

// The real path of `p` (absolute, normal): every symlink along it followed, dangling ones too
// (std::filesystem::weakly_canonical stops at a symlink whose target does not exist, and a
// checkpoint written through one would land wherever it points); components that do not exist
// are kept as written. At most 40 symlinks, as the kernel allows.
absl::StatusOr<fs::path> Resolve(const fs::path& p, int& links, const std::string& field) {
  fs::path out = p.root_path();
  for (const fs::path& part : p.relative_path()) {
    if (part.empty() || part == ".") continue;
    if (part == "..") {
      out = out.parent_path();
      continue;
    }
    const fs::path next = out / part;
    std::error_code ec;
    if (!fs::is_symlink(fs::symlink_status(next, ec))) {
      out = next;
      continue;
    }
    if (++links > 40) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": too many symlinks resolving ", p.string()));
    }
    fs::path target = fs::read_symlink(next, ec);
    if (ec) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": cannot read symlink ", next.string(), ": ", ec.message()));
    }
    if (target.is_relative()) target = out / target;
    absl::StatusOr<fs::path> resolved = Resolve(target.lexically_normal(), links, field);
    if (!resolved.ok()) return resolved.status();
    out = *resolved;
  }
  return out.lexically_normal();
}

absl::StatusOr<fs::path> RealPath(const fs::path& p, const std::string& field) {
  int links = 0;
  return Resolve(p, links, field);
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
  absl::StatusOr<fs::path> real = RealPath(absolute.lexically_normal(), flag);
  if (!real.ok()) return real.status();
  std::string out = real->string();
  while (out.size() > 1 && out.back() == '/') out.pop_back();
  return out;
}

absl::StatusOr<std::string> ResolveDaemonRoot(const std::string& root, const std::string& flag) {
  absl::StatusOr<std::string> resolved = ResolveRoot(root, flag);
  if (!resolved.ok()) return resolved;
  std::error_code ec;
  if (!fs::is_directory(*resolved, ec)) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, " ", root, ": not a directory (allowed: an existing directory)"));
  }
  return resolved;
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
