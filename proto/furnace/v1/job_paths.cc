#include "proto/furnace/v1/job_paths.h"

namespace furnace::v1 {

std::vector<JobPathField> JobPathFields(JobSpec& spec) {
  std::vector<JobPathField> out;
  const auto add = [&out](std::string field, bool checkpoint, std::string* path,
                          std::vector<std::string> files) {
    if (!path->empty()) out.push_back({std::move(field), checkpoint, path, std::move(files)});
  };
  DataSpec& data = *spec.mutable_data();
  // An indexed dataset is a prefix: the rank opens <prefix>.bin and <prefix>.idx.
  const std::vector<std::string> dataset = data.source() == "indexed"
                                               ? std::vector<std::string>{".bin", ".idx"}
                                               : std::vector<std::string>{};
  add("data.path", false, data.mutable_path(), dataset);
  for (int i = 0; i < data.blend_size(); ++i) {
    add("data.blend[" + std::to_string(i) + "].path", false, data.mutable_blend(i)->mutable_path(),
        dataset);
  }
  add("data.validation.path", false, data.mutable_validation()->mutable_path(), dataset);
  if (data.tokenizer() != "byte") add("data.tokenizer", false, data.mutable_tokenizer(), {});
  add("checkpoint.dir", true, spec.mutable_checkpoint()->mutable_dir(), {});
  return out;
}

}  // namespace furnace::v1
