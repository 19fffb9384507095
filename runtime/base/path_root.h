// Confining the files a job names to the directories an operator allows (`--data-root`,
// `--checkpoint-root` of the controller and of each worker). A job comes from whoever can submit
// one, and the paths it names are opened and written by daemons on other machines, so a path must
// not reach outside its root by `..`, by being absolute elsewhere, or through a symlink.
//
// Resolution: a relative path is joined to the root; the result is normalised lexically and must
// lie under the root; then it is resolved with realpath semantics (every symlink along it
// followed, a dangling one too; the part that does not exist yet kept as written) and the result
// must still lie under the root's own real path. The controller checks at
// submit (its view of the filesystem), the worker again when a rank opens the files (its own),
// so a symlink planted after submit is caught where it matters.
//
// Stateless and thread-safe; reads the filesystem (lstat/readlink) only.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace furnace {

// The real path of `root` (made absolute, symlinks resolved; it need not exist). InvalidArgument
// naming `flag` when root is empty or cannot be resolved.
absl::StatusOr<std::string> ResolveRoot(const std::string& root, const std::string& flag);

// A daemon's --data-root / --checkpoint-root: ResolveRoot, and the result must be an existing
// directory (InvalidArgument "<flag> <root>: not a directory (allowed: an existing directory)"):
// a root that is not there would confine every job to nothing.
absl::StatusOr<std::string> ResolveDaemonRoot(const std::string& root, const std::string& flag);

// `path` (the value of job field `field`) resolved under `root` (a ResolveRoot result, named
// `flag` in messages). `suffixes`: files the path is the prefix of (an indexed dataset's ".bin"
// and ".idx"), each checked the same way. Returns the resolved absolute path; InvalidArgument
//   "<field>: <path> is outside <flag> <root> (<why>); allowed: paths under <root>"
// when it escapes.
absl::StatusOr<std::string> ConfinePath(const std::string& root, const std::string& path,
                                        const std::string& field, const std::string& flag,
                                        const std::vector<std::string>& suffixes = {});

// Resolves each of `fields` in place under its root: a range of records with `field` (the name
// for messages), `checkpoint` (true: under checkpoint_root, else data_root), `path` (a
// std::string* to read and rewrite) and `files` (ConfinePath's suffixes), such as
// furnace::v1::JobPathFields. An empty root leaves its fields as they are. Every escape is
// reported, one per line, in one InvalidArgument; fields before a failure may have been rewritten.
template <typename Fields>
absl::Status ConfineFields(const std::string& data_root, const std::string& checkpoint_root,
                           Fields&& fields) {
  std::string problems;
  for (auto& f : fields) {
    const std::string& root = f.checkpoint ? checkpoint_root : data_root;
    if (root.empty()) continue;
    absl::StatusOr<std::string> resolved = ConfinePath(
        root, *f.path, f.field, f.checkpoint ? "--checkpoint-root" : "--data-root", f.files);
    if (resolved.ok()) {
      *f.path = *std::move(resolved);
    } else {
      if (!problems.empty()) problems += "\n";
      problems += std::string(resolved.status().message());
    }
  }
  return problems.empty() ? absl::OkStatus() : absl::InvalidArgumentError(problems);
}

}  // namespace furnace
