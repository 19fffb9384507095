// The `furnace` process exit codes, and how errors and final job states map onto them. Scripts
// depend on these numbers; `furnace --help` prints the same table (ExitCodeHelp()).
#pragma once

#include <string>

#include "absl/status/status.h"
#include "furnace/v1/controller.pb.h"

namespace furnace::cli {

enum ExitCode : int {
  kExitOk = 0,             // success; for watch / submit --watch: the job SUCCEEDED
  kExitJobFailed = 1,      // the job ended FAILED or CANCELLED
  kExitUsage = 2,          // bad usage, or a job file invalid or refused by the controller
  kExitRpcError = 3,       // the controller is unreachable or an RPC failed
  kExitJobNotFound = 4,    // the job does not exist (logs: nor the rank or attempt asked for)
  kExitLocalError = 5,     // export / data prepare: nothing to read, or a local file failed
  kExitNotApplicable = 6,  // the request does not apply in the job's state (cancel of an ended job)
};

// Marks an error that happened on this machine, in a file the CLI itself reads or writes (a
// checkpoint, an export, a token file), rather than at the controller. Its code and message are
// kept; ExitCodeForStatus gives kExitLocalError for it whatever the code, so "no checkpoint"
// (NOT_FOUND from the loader) does not read as "job not found". OK stays OK.
absl::Status LocalError(absl::Status status);

// Marks a controller's refusal that is about the job's state, not the call (cancel of a job that
// already ended): ExitCodeForStatus gives kExitNotApplicable for it.
absl::Status NotApplicable(absl::Status status);

// Marks a controller's refusal of the job a submit sent, for a reason other than an invalid field
// (its checkpoint.dir is in use by a job that has not ended: FAILED_PRECONDITION):
// ExitCodeForStatus gives kExitUsage for it, as for an invalid job file. The same file would be
// refused again; a rate limit, which a retry later gets past, is not marked (exit 3).
absl::Status JobRefused(absl::Status status);

// A LocalError -> 5, a NotApplicable -> 6, a JobRefused -> 2; otherwise INVALID_ARGUMENT -> 2,
// NOT_FOUND -> 4, any other error -> 3, OK -> 0. absl and gRPC share the numeric status codes, so
// this also maps gRPC codes after FromGrpcStatus.
ExitCode ExitCodeForStatus(const absl::Status& status);

// SUCCEEDED -> 0, FAILED / CANCELLED -> 1. A state that is not final also gives 1: a caller that
// stopped waiting early did not see the job succeed.
ExitCode ExitCodeForState(v1::JobState state);

// SUCCEEDED, FAILED and CANCELLED: nothing about the job will change any more.
bool IsFinalState(v1::JobState state);

// The summary keeps the last failure's cause until the job ends. Once a later attempt is placed
// (not recovering, not ended) that cause is what the job restarted after, not what is wrong now:
// views label it so (watch, status, jobs).
bool CauseIsPast(const v1::JobSummary& summary);

// "RUNNING" for JOB_RUNNING; "UNKNOWN" for JOB_STATE_UNSPECIFIED or a value this build lacks.
std::string StateName(v1::JobState state);

// The exit code table for the help footer.
std::string ExitCodeHelp();

}  // namespace furnace::cli
