// furnace jobs | status | cancel | workers: one request, one answer printed.
#include "absl/strings/str_cat.h"
#include "controller/cli/commands.h"
#include "controller/cli/exit_codes.h"
#include "controller/cli/status_view.h"
#include "google/protobuf/util/json_util.h"
#include "runtime/base/status.h"

namespace furnace::cli {

absl::Status PrintJson(const google::protobuf::Message& message, std::ostream& out) {
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.always_print_primitive_fields = true;
  options.preserve_proto_field_names = true;
  std::string json;
  const auto status = google::protobuf::util::MessageToJsonString(message, &json, options);
  if (!status.ok()) {
    return absl::InternalError(absl::StrCat("cannot print JSON: ", status.ToString()));
  }
  out << json;
  if (json.empty() || json.back() != '\n') out << '\n';
  return absl::OkStatus();
}

absl::StatusOr<int> RunJobs(const CommandContext& ctx) {
  ASSIGN_OR_RETURN(const v1::ListJobsResponse jobs, ctx.client->ListJobs());
  if (ctx.json) {
    RETURN_IF_ERROR(PrintJson(jobs, *ctx.out));
  } else if (jobs.jobs().empty()) {
    *ctx.out << "no jobs\n";
  } else {
    *ctx.out << RenderJobsTable(jobs, ctx.clock->UnixSeconds());
  }
  return kExitOk;
}

absl::StatusOr<int> RunStatus(const CommandContext& ctx, const std::string& job_id) {
  ASSIGN_OR_RETURN(const v1::JobDetail job, ctx.client->GetJob(job_id));
  if (ctx.json) {
    RETURN_IF_ERROR(PrintJson(job, *ctx.out));
  } else {
    *ctx.out << RenderJobStatus(job, ctx.clock->UnixSeconds());
  }
  return kExitOk;
}

absl::StatusOr<int> RunCancel(const CommandContext& ctx, const std::string& job_id) {
  absl::StatusOr<v1::CancelJobResponse> cancelled = ctx.client->CancelJob(job_id);
  // The controller refuses to cancel a job that already ended: not an RPC error (exit 6).
  if (absl::IsFailedPrecondition(cancelled.status())) return NotApplicable(cancelled.status());
  ASSIGN_OR_RETURN(const v1::CancelJobResponse response, std::move(cancelled));
  if (ctx.json) {
    RETURN_IF_ERROR(PrintJson(response, *ctx.out));
  } else {
    const v1::JobSummary& job = response.job();
    *ctx.out << "job " << (job.job_id().empty() ? job_id : job.job_id()) << " is "
             << StateName(job.state()) << "\n";
  }
  return kExitOk;
}

absl::StatusOr<int> RunWorkers(const CommandContext& ctx) {
  ASSIGN_OR_RETURN(const v1::ListWorkersResponse workers, ctx.client->ListWorkers());
  if (ctx.json) {
    RETURN_IF_ERROR(PrintJson(workers, *ctx.out));
  } else if (workers.workers().empty()) {
    *ctx.out << "no workers\n";
  } else {
    *ctx.out << RenderWorkersTable(workers, ctx.clock->UnixSeconds());
  }
  return kExitOk;
}

}  // namespace furnace::cli
