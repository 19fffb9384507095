#include "controller/spec/input_roots.h"

#include "proto/furnace/v1/job_paths.h"
#include "runtime/base/path_root.h"

namespace furnace::spec {

absl::Status ConfineJobPaths(const InputRoots& roots, furnace::v1::JobSpec& spec) {
  if (roots.data.empty() && roots.checkpoint.empty()) return absl::OkStatus();
  furnace::v1::JobSpec confined = spec;
  if (absl::Status s =
          ConfineFields(roots.data, roots.checkpoint, furnace::v1::JobPathFields(confined));
      !s.ok()) {
    return s;
  }
  spec = std::move(confined);
  return absl::OkStatus();
}

}  // namespace furnace::spec
