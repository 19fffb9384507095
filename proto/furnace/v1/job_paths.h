// Every field of a JobSpec that names a file or directory the workers open, in one list: the
// controller confines them under its roots at submit (controller/spec/input_roots.h) and the rank
// again under its worker's roots before it opens them (worker/train_rank.cc). A new path field of
// job.proto belongs here, or it escapes both checks (tests/controller/spec/input_roots_test.cc
// walks the descriptor for string fields named path, dir or tokenizer).
#pragma once

#include <string>
#include <vector>

#include "furnace/v1/job.pb.h"

namespace furnace::v1 {

struct JobPathField {
  std::string field;               // the YAML path, for messages: "data.blend[1].path"
  bool checkpoint = false;         // under the checkpoint root (else the data root)
  std::string* path = nullptr;     // the value, to read and to rewrite; never empty
  std::vector<std::string> files;  // suffixes of the files it is a prefix of (indexed datasets)
};

// The non-empty path fields of `spec` (data.tokenizer only when it names a file, not `byte`).
std::vector<JobPathField> JobPathFields(JobSpec& spec);

// How long a stop that is no failure (a cancel, an interruption, an agent's own stop) gives the
// ranks of `spec` to write a checkpoint of the step in progress into checkpoint.dir
// (checkpoint.stop_grace_s): only a train job with a directory has one to keep; 0 otherwise.
inline double StopCheckpointGraceS(const JobSpec& spec) {
  return spec.kind() == "train" && !spec.checkpoint().dir().empty()
             ? spec.checkpoint().stop_grace_s()
             : 0;
}

}  // namespace furnace::v1
