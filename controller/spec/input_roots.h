// The controller's check of the files a job names (furnace-controller --data-root,
// --checkpoint-root): every path field (furnace/v1/job_paths.h) is resolved under its root
// (runtime/base/path_root.h) and rewritten to the resolved absolute path, which is what the
// workers receive. A path that escapes is refused with InvalidArgument naming the field and the
// root. Workers check again under their own roots when a rank opens the files.
//
// Stateless and thread-safe; reads the controller's filesystem (symlinks) only.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "furnace/v1/job.pb.h"

namespace furnace::spec {

struct InputRoots {
  std::string data;        // resolved (ResolveRoot); empty: data paths are not confined
  std::string checkpoint;  // resolved; empty: checkpoint.dir is not confined
};

// Resolves every path field of `spec` under its root, in place. All escapes are reported, one per
// line; the spec is left unchanged when any is.
absl::Status ConfineJobPaths(const InputRoots& roots, furnace::v1::JobSpec& spec);

}  // namespace furnace::spec
