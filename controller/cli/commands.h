// The `furnace` commands. main.cc parses flags and calls these; each one talks to the controller
// through ctx.client, writes to ctx.out / ctx.err, and returns the process exit code for its
// outcome (0, or 1 for a job that ended FAILED or CANCELLED) or an error whose code main() maps
// through ExitCodeForStatus. None of them exits.
#pragma once

#include <functional>
#include <optional>
#include <ostream>
#include <string>

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
  bool json = false;          // one JSON document per command instead of text
  bool tty = false;           // out is a terminal: watch redraws in place
  int width = 0;              // terminal columns; 0 = do not cut lines
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
  int rank = -1;     // -1: all ranks
  int attempt = 0;   // 0: all attempts
  bool follow = false;
};
absl::StatusOr<int> RunLogs(const CommandContext& ctx, const std::string& job_id,
                            const LogsOptions& options);
absl::StatusOr<int> RunCancel(const CommandContext& ctx, const std::string& job_id);
absl::StatusOr<int> RunWorkers(const CommandContext& ctx);

}  // namespace furnace::cli
