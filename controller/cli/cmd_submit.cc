// furnace submit FILE [--watch]: the controller validates the file; the CLI only reads it.
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "controller/cli/commands.h"
#include "controller/cli/exit_codes.h"
#include "runtime/base/status.h"

namespace furnace::cli {
namespace {

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot read job file ", path, ": ", std::strerror(errno)));
  }
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return absl::InvalidArgumentError(absl::StrCat("cannot read job file ", path));
  return text.str();
}

}  // namespace

absl::StatusOr<int> RunSubmit(const CommandContext& ctx, const std::string& path, bool watch) {
  v1::SubmitJobRequest request;
  ASSIGN_OR_RETURN(*request.mutable_yaml(), ReadFile(path));
  request.set_filename(path);
  ASSIGN_OR_RETURN(const v1::SubmitJobResponse response, ctx.client->SubmitJob(request));
  if (watch) {
    // With --json, watch prints the final JobDetail, which carries the job id: one document.
    if (!ctx.json) *ctx.out << "submitted job " << response.job_id() << "\n";
    return RunWatch(ctx, response.job_id());
  }
  if (ctx.json) {
    RETURN_IF_ERROR(PrintJson(response, *ctx.out));
  } else {
    *ctx.out << "submitted job " << response.job_id() << "\n";
  }
  return kExitOk;
}

}  // namespace furnace::cli
