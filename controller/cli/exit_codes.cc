#include "controller/cli/exit_codes.h"

#include "absl/strings/cord.h"
#include "absl/strings/match.h"

namespace furnace::cli {
namespace {

constexpr char kLocalErrorPayload[] = "type.furnace.dev/furnace.cli.LocalError";
constexpr char kNotApplicablePayload[] = "type.furnace.dev/furnace.cli.NotApplicable";
constexpr char kJobRefusedPayload[] = "type.furnace.dev/furnace.cli.JobRefused";

}  // namespace

absl::Status LocalError(absl::Status status) {
  if (!status.ok()) status.SetPayload(kLocalErrorPayload, absl::Cord("1"));
  return status;
}

absl::Status NotApplicable(absl::Status status) {
  if (!status.ok()) status.SetPayload(kNotApplicablePayload, absl::Cord("1"));
  return status;
}

absl::Status JobRefused(absl::Status status) {
  if (!status.ok()) status.SetPayload(kJobRefusedPayload, absl::Cord("1"));
  return status;
}

ExitCode ExitCodeForStatus(const absl::Status& status) {
  if (!status.ok() && status.GetPayload(kLocalErrorPayload).has_value()) return kExitLocalError;
  if (!status.ok() && status.GetPayload(kNotApplicablePayload).has_value()) {
    return kExitNotApplicable;
  }
  if (!status.ok() && status.GetPayload(kJobRefusedPayload).has_value()) return kExitUsage;
  switch (status.code()) {
    case absl::StatusCode::kOk:
      return kExitOk;
    case absl::StatusCode::kInvalidArgument:
      return kExitUsage;
    case absl::StatusCode::kNotFound:
      return kExitJobNotFound;
    default:
      return kExitRpcError;
  }
}

ExitCode ExitCodeForState(v1::JobState state) {
  return state == v1::JOB_SUCCEEDED ? kExitOk : kExitJobFailed;
}

bool IsFinalState(v1::JobState state) {
  return state == v1::JOB_SUCCEEDED || state == v1::JOB_FAILED || state == v1::JOB_CANCELLED;
}

bool CauseIsPast(const v1::JobSummary& summary) {
  return !IsFinalState(summary.state()) && summary.state() != v1::JOB_RECOVERING;
}

std::string StateName(v1::JobState state) {
  if (state == v1::JOB_STATE_UNSPECIFIED || !v1::JobState_IsValid(state)) return "UNKNOWN";
  std::string name = v1::JobState_Name(state);
  if (absl::StartsWith(name, "JOB_")) name = name.substr(4);
  return name;
}

std::string ExitCodeHelp() {
  return "Exit codes:\n"
         "  0  success (watch, submit --watch: the job SUCCEEDED)\n"
         "  1  the job ended FAILED or CANCELLED\n"
         "  2  bad usage, or a job file invalid or refused by the controller (too many ranks\n"
         "     for its workers, checkpoint.dir in use by another job)\n"
         "  3  controller unreachable or RPC error (submit: over the controller's rate limit)\n"
         "  4  job not found (logs: a rank or attempt the job does not have)\n"
         "  5  export, data: no checkpoint to export, or a local file could not be read, used "
         "or\n"
         "     written\n"
         "  6  the request does not apply in the job's state (cancel: the job already ended)\n";
}

}  // namespace furnace::cli
