#include "controller/cli/exit_codes.h"

#include "absl/strings/match.h"

namespace furnace::cli {

ExitCode ExitCodeForStatus(const absl::Status& status) {
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
         "  2  bad usage or invalid job file\n"
         "  3  controller unreachable or RPC error\n"
         "  4  job not found\n";
}

}  // namespace furnace::cli
