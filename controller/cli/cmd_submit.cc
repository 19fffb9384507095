// furnace submit FILE [--watch] [--dry-run[=server]]: the CLI checks that the file can be sent
// (size, UTF-8) and that its memory.device_budget is not below the least a rank needs
// (job_model.h), and the controller validates it; --dry-run validates here and sends nothing,
// --dry-run=server has the controller check it and store nothing.
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "controller/cli/commands.h"
#include "controller/cli/exit_codes.h"
#include "controller/cli/job_model.h"
#include "controller/spec/job_spec.h"
#include "runtime/base/status.h"

namespace furnace::cli {
namespace {

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot read job file ", path, ": ", std::strerror(errno)));
  }
  // Read at most one byte past the limit: a huge file is refused without reading all of it.
  std::string text(spec::kMaxJobFileBytes + 1, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  if (in.bad()) return absl::InvalidArgumentError(absl::StrCat("cannot read job file ", path));
  text.resize(static_cast<size_t>(in.gcount()));
  return text;
}

// "submitted job j-1", and what the controller filled in that the file left out (a cluster's
// default time limit: the job would otherwise end at a limit its user never wrote).
std::string SubmittedLine(const v1::SubmitJobResponse& response) {
  std::string line = absl::StrCat("submitted job ", response.job_id());
  if (!response.defaults().empty()) {
    absl::StrAppend(&line, " (", absl::StrJoin(response.defaults(), "; "), ")");
  }
  return line + "\n";
}

// "x (train, 4 ranks": a dry run's words for the job, left open for what follows.
std::string JobWords(const v1::JobSpec& job) {
  const uint32_t world = spec::WorldSize(job);
  return absl::StrCat(job.name(), " (", job.kind(), ", ", world, world == 1 ? " rank" : " ranks");
}

// --dry-run=server: the controller checks the file as a submission and stores nothing; its answer
// says it would accept it, with what it would fill in.
absl::StatusOr<int> ServerDryRun(const CommandContext& ctx, const std::string& path,
                                 const v1::SubmitJobRequest& request) {
  absl::StatusOr<v1::SubmitJobResponse> checked = ctx.client->CheckJob(request);
  if (absl::IsUnimplemented(checked.status())) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the controller cannot check a file (it is older than this furnace: ",
        checked.status().message(), "); nothing was submitted; use --dry-run to validate it here"));
  }
  // As for a submission: a checkpoint.dir in use by another job is a refusal of this file (2).
  if (absl::IsFailedPrecondition(checked.status())) return JobRefused(checked.status());
  ASSIGN_OR_RETURN(const v1::SubmitJobResponse response, std::move(checked));
  if (ctx.json) {
    RETURN_IF_ERROR(PrintJson(response, *ctx.out));
    return kExitOk;
  }
  *ctx.out << path << ": the controller would accept job " << JobWords(response.spec());
  if (!response.defaults().empty()) *ctx.out << "; " << absl::StrJoin(response.defaults(), "; ");
  *ctx.out << "); not submitted (--dry-run=server)\n";
  return kExitOk;
}

}  // namespace

absl::StatusOr<int> RunSubmit(const CommandContext& ctx, const std::string& path,
                              const SubmitOptions& options) {
  v1::SubmitJobRequest request;
  ASSIGN_OR_RETURN(*request.mutable_yaml(), ReadFile(path));
  RETURN_IF_ERROR(spec::CheckJobText(request.yaml(), path));
  if (options.dry_run == DryRun::kClient) {
    ASSIGN_OR_RETURN(const v1::JobSpec job, spec::ParseJobYaml(request.yaml(), path));
    RETURN_IF_ERROR(CheckDeviceBudgetFloor(job, path));
    if (ctx.json) {
      RETURN_IF_ERROR(PrintJson(job, *ctx.out));
    } else {
      *ctx.out << path << ": valid job " << JobWords(job) << "); not submitted (--dry-run)\n";
    }
    return kExitOk;
  }
  // What the controller cannot check (it links no part of the model): a memory.device_budget
  // below the least a rank needs, which every rank would refuse at start. A file that does not
  // parse here goes to the controller, whose validation says why.
  if (absl::StatusOr<v1::JobSpec> parsed = spec::ParseJobYaml(request.yaml(), path); parsed.ok()) {
    RETURN_IF_ERROR(CheckDeviceBudgetFloor(*parsed, path));
  }
  request.set_filename(path);
  if (options.dry_run == DryRun::kServer) return ServerDryRun(ctx, path, request);
  absl::StatusOr<v1::SubmitJobResponse> submitted = ctx.client->SubmitJob(request);
  // An invalid field (INVALID_ARGUMENT) already exits 2; a checkpoint.dir in use by another job is
  // as much a refusal of this file (exit 2). A rate limit (RESOURCE_EXHAUSTED) is not: exit 3.
  if (absl::IsFailedPrecondition(submitted.status())) return JobRefused(submitted.status());
  ASSIGN_OR_RETURN(const v1::SubmitJobResponse response, std::move(submitted));
  if (options.watch) {
    // With --json, watch prints the final JobDetail, which carries the job id: one document on
    // stdout; the submitted line (with what the controller filled in) goes to stderr, as watch's
    // progress does.
    if (!ctx.json) {
      *ctx.out << SubmittedLine(response);
    } else if (ctx.err != nullptr) {
      *ctx.err << SubmittedLine(response) << std::flush;
    }
    absl::StatusOr<int> watched = RunWatch(ctx, response.job_id(), /*controller_answered=*/true);
    if (!watched.ok()) {
      // The job exists: the error names it (with --json it was printed on stderr only).
      return absl::Status(watched.status().code(),
                          absl::StrCat("submitted job ", response.job_id(),
                                       ", but watching it failed: ", watched.status().message()));
    }
    return watched;
  }
  if (ctx.json) {
    RETURN_IF_ERROR(PrintJson(response, *ctx.out));
  } else {
    *ctx.out << SubmittedLine(response);
  }
  return kExitOk;
}

}  // namespace furnace::cli
