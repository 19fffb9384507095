// The `furnace` commands. main.cc parses flags and calls these; each one talks to the controller
// through ctx.client (data prepare needs none), writes to ctx.out / ctx.err, and returns the
// process exit code for its outcome (0, or 1 for a job that ended FAILED or CANCELLED) or an error
// whose code main() maps through ExitCodeForStatus. None of them exits.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "controller/cli/client.h"
#include "google/protobuf/message.h"
#include "runtime/base/clock.h"

namespace furnace::cli {

struct CommandContext {
  JobClient* client = nullptr;
  std::ostream* out = nullptr;
  std::ostream* err = nullptr;
  bool json = false;  // one JSON document per command instead of text
  bool tty = false;   // out is a terminal: watch redraws in place
  int width = 0;      // terminal columns; 0 = do not cut lines
  const Clock* clock = nullptr;
  std::function<void(double seconds)> sleep;  // waits between polls
  double poll_interval_s = 0.5;
};

// The message as one JSON document (proto field names, default values included) and a newline.
absl::Status PrintJson(const google::protobuf::Message& message, std::ostream& out);

// Reads `path` and submits it. An invalid job comes back as INVALID_ARGUMENT with the
// controller's message; an unreadable file too. With `watch`, continues as Watch.
absl::StatusOr<int> RunSubmit(const CommandContext& ctx, const std::string& path, bool watch);
absl::StatusOr<int> RunJobs(const CommandContext& ctx);
absl::StatusOr<int> RunStatus(const CommandContext& ctx, const std::string& job_id);
// Polls until the job is final; exit code by ExitCodeForState. A controller that stays
// unreachable for longer than ~10 s ends the watch with UNAVAILABLE.
absl::StatusOr<int> RunWatch(const CommandContext& ctx, const std::string& job_id);

struct LogsOptions {
  int rank = -1;    // -1: all ranks
  int attempt = 0;  // 0: all attempts
  bool follow = false;
};
absl::StatusOr<int> RunLogs(const CommandContext& ctx, const std::string& job_id,
                            const LogsOptions& options);
absl::StatusOr<int> RunCancel(const CommandContext& ctx, const std::string& job_id);
absl::StatusOr<int> RunWorkers(const CommandContext& ctx);

struct ExportOptions {
  int64_t step = -1;                   // -1: the newest committed checkpoint that verifies
  std::string format = "safetensors";  // the only format
  std::string output;                  // the file to write
};
// Asks the controller for the job (GetJob) to learn its checkpoint directory, reads the committed
// checkpoint there directly (the directory must be visible from this machine), and writes its
// parameters as whole fp32 tensors with MODEL.md names and shapes (a parallel job's shards are
// reassembled: whole_checkpoint.h). Errors: an unknown format or no output file ->
// INVALID_ARGUMENT; the job unknown -> the controller's NOT_FOUND; no checkpoint directory or none
// committed yet, a checkpoint that does not verify (the loader's message naming the file) or whose
// shards leave part of a tensor out, an output that cannot be written -> a LocalError (exit 5).
// Newer checkpoints that were skipped as damaged, and replicas that disagree, are reported on
// ctx.err.
absl::StatusOr<int> RunExport(const CommandContext& ctx, const std::string& job_id,
                              const ExportOptions& options);

struct ReportOptions {
  std::string output;  // the directory to write (created, with parents)
};
// Fetches the job (GetJob) and all of its step records (GetJobSeries) and writes report.h's files
// into options.output; prints the directory and files written (--json: {job_id, dir, files,
// summary}). The job unknown -> the controller's NOT_FOUND; no output directory ->
// INVALID_ARGUMENT; a directory or file that cannot be written -> a LocalError (exit 5).
absl::StatusOr<int> RunReport(const CommandContext& ctx, const std::string& job_id,
                              const ReportOptions& options);

struct DataPrepareOptions {
  std::vector<std::string> inputs;  // text files, one document each, in order
  std::string output;               // the token file to write
  bool eod = false;                 // append the end-of-document token (256) after each document
};
// Byte-level tokenization of the inputs into one token file (runtime/data/byte_tokenizer.h);
// needs no controller. No inputs or no output -> INVALID_ARGUMENT; an input that cannot be read
// or an output that cannot be written -> a LocalError (exit 5).
absl::StatusOr<int> RunDataPrepare(const CommandContext& ctx, const DataPrepareOptions& options);

}  // namespace furnace::cli
