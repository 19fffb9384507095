// furnace jobs | status | cancel | workers: one request, one answer printed.
#include <algorithm>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "controller/cli/commands.h"
#include "controller/cli/exit_codes.h"
#include "controller/cli/status_view.h"
#include "google/protobuf/util/json_util.h"
#include "proto/furnace/v1/state_names.h"
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

absl::StatusOr<int> RunJobs(const CommandContext& ctx, const std::vector<std::string>& states) {
  ASSIGN_OR_RETURN(v1::ListJobsResponse jobs, ctx.client->ListJobs());
  if (!states.empty()) {
    const std::set<std::string> wanted(states.begin(), states.end());
    v1::ListJobsResponse kept;
    for (v1::JobSummary& job : *jobs.mutable_jobs()) {
      const bool ended = IsFinalState(job.state());
      if (wanted.count(v1::StateWord(job.state())) > 0 ||
          wanted.count(ended ? "ended" : "active") > 0) {
        *kept.add_jobs() = std::move(job);
      }
    }
    jobs = std::move(kept);
    if (jobs.jobs().empty() && !ctx.json) {
      *ctx.out << "no jobs in state " << absl::StrJoin(states, ", ") << "\n";
      return kExitOk;
    }
  }
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

absl::StatusOr<int> RunCancel(const CommandContext& ctx, const std::vector<std::string>& job_ids) {
  v1::ListJobsResponse cancelled_jobs;  // --json with several jobs
  int exit_code = kExitOk;
  for (const std::string& job_id : job_ids) {
    absl::StatusOr<v1::CancelJobResponse> cancelled = ctx.client->CancelJob(job_id);
    // The controller refuses to cancel a job that already ended: not an RPC error (exit 6).
    absl::Status error = cancelled.status();
    if (absl::IsFailedPrecondition(error)) error = NotApplicable(error);
    if (!error.ok()) {
      if (job_ids.size() == 1) return error;
      *ctx.err << "furnace: " << error.message() << "\n";
      if (exit_code == kExitOk) exit_code = ExitCodeForStatus(error);
      continue;
    }
    const v1::JobSummary& job = cancelled->job();
    if (ctx.json && job_ids.size() == 1) {
      RETURN_IF_ERROR(PrintJson(*cancelled, *ctx.out));
    } else if (ctx.json) {
      *cancelled_jobs.add_jobs() = job;
    } else {
      *ctx.out << "job " << (job.job_id().empty() ? job_id : job.job_id()) << " is "
               << StateName(job.state()) << "\n";
    }
  }
  if (ctx.json && job_ids.size() > 1) RETURN_IF_ERROR(PrintJson(cancelled_jobs, *ctx.out));
  return exit_code;
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
