// The job YAML -> furnace.v1.JobSpec. The only entry point for job files: the CLI (`submit`,
// `plan`) and the controller both go through here, so a spec that reaches a rank has been checked
// in full and carries every default explicitly (nothing downstream defaults again).
//
// The schema (fields, defaults, allowed values) is in sections_*.cc and cross_checks.cc; the user
// documentation is DESIGN.md ("Interfaces users touch") and configs/*.yaml.
//
// Stateless and thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "furnace/v1/job.pb.h"

namespace furnace::spec {

// The largest job file accepted (the CLI refuses a bigger one before sending it; the controller
// again). A job file is a few KiB; this leaves room for long shrink lists and blends.
inline constexpr size_t kMaxJobFileBytes = size_t{1} << 20;

// What every job text must be before it is parsed or sent: at most kMaxJobFileBytes, and valid
// UTF-8 (protobuf string fields must be). InvalidArgument naming the file and the limit, or the
// byte offset of the first bad byte.
absl::Status CheckJobText(std::string_view text, std::string_view filename);

// Parses a job YAML (after CheckJobText), validates every field, fills every default; returns the
// resolved spec, or InvalidArgument whose message lists the problems found, one per line, ordered
// by position, each
//   FILE:LINE:COL: FIELD.PATH: <what is wrong> (got VALUE; allowed: ...)
// with 1-based LINE and COL: all of them, or the first 50 that fit in about 4 KB and then
//   FILE: ... and N more problems not shown
// (Diagnostics::ToStatus says why). `filename` is used only in messages.
absl::StatusOr<furnace::v1::JobSpec> ParseJobYaml(std::string_view yaml_text,
                                                  std::string_view filename);

// Reads `path` and parses it as above. NotFound / PermissionDenied / Internal for I/O errors.
absl::StatusOr<furnace::v1::JobSpec> LoadJobFile(const std::string& path);

// Ranks in the job: pp * dp * tp (saturating; a parsed spec keeps it <= INT32_MAX).
uint32_t WorldSize(const furnace::v1::JobSpec& spec);

}  // namespace furnace::spec
