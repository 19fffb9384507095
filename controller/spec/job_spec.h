// The job YAML -> furnace.v1.JobSpec. The only entry point for job files: the CLI (`submit`,
// `plan`) and the controller both go through here, so a spec that reaches a rank has been checked
// in full and carries every default explicitly (nothing downstream defaults again).
//
// The schema (fields, defaults, allowed values) is in sections_*.cc and cross_checks.cc; the user
// documentation is DESIGN.md ("Interfaces users touch") and configs/*.yaml.
//
// Stateless and thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "furnace/v1/job.pb.h"

namespace furnace::spec {

// Parses a job YAML, validates every field, fills every default; returns the resolved spec, or
// InvalidArgument whose message lists ALL problems found, one per line, ordered by position, each
//   FILE:LINE:COL: FIELD.PATH: <what is wrong> (got VALUE; allowed: ...)
// with 1-based LINE and COL. `filename` is used only in messages.
absl::StatusOr<furnace::v1::JobSpec> ParseJobYaml(std::string_view yaml_text,
                                                  std::string_view filename);

// Reads `path` and parses it as above. NotFound / PermissionDenied / Internal for I/O errors.
absl::StatusOr<furnace::v1::JobSpec> LoadJobFile(const std::string& path);

// Ranks in the job: pp * dp * tp (saturating; a parsed spec keeps it <= INT32_MAX).
uint32_t WorldSize(const furnace::v1::JobSpec& spec);

}  // namespace furnace::spec
