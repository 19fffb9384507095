// furnace logs JOB: pages GetLogs by offset (where the last page ended); --follow keeps polling
// until the controller says the job is done and no lines are left, and rides out a controller
// restart (poll_outage.h).
#include "controller/cli/commands.h"
#include "controller/cli/exit_codes.h"
#include "controller/cli/poll_outage.h"
#include "runtime/base/status.h"

namespace furnace::cli {

absl::StatusOr<int> RunLogs(const CommandContext& ctx, const std::string& job_id,
                            const LogsOptions& options) {
  // --json is one document, printed once the log is read to its end: with --follow nothing would
  // show until the job ended, every line held in memory meanwhile.
  if (ctx.json && options.follow) {
    return absl::InvalidArgumentError(
        "logs: --json and --follow do not go together (--json prints the whole log as one "
        "document once it is read to its end; --follow prints lines as they come): drop one");
  }
  v1::GetLogsRequest request;
  request.set_job_id(job_id);
  request.set_rank(options.rank);
  request.set_attempt(options.attempt);
  request.set_offset(0);
  v1::GetLogsResponse all;  // for --json: every line, as one document
  PollOutage outage(*ctx.clock, /*answered=*/false);
  bool printed = false;
  // Nothing at all: say why on stderr (a job that has not started prints nothing, and looked like
  // a job whose ranks wrote nothing).
  const auto say_none = [&](bool follow) {
    absl::StatusOr<v1::JobDetail> job = ctx.client->GetJob(job_id);
    if (!job.ok() || ctx.err == nullptr) return;
    const v1::JobSummary& s = job->summary();
    *ctx.err << "job " << job_id << " has no log lines (" << StateName(s.state())
             << (s.waiting().empty() ? "" : ", waiting: " + s.waiting()) << ")"
             << (follow ? "; following" : "") << "\n";
  };
  while (true) {
    absl::StatusOr<v1::GetLogsResponse> polled = ctx.client->GetLogs(request);
    if (!polled.ok()) {
      if (!options.follow || !outage.Retry(polled.status())) return polled.status();
      ctx.sleep(ctx.poll_interval_s);
      continue;
    }
    outage.Answered();
    const v1::GetLogsResponse& page = *polled;
    if (ctx.json) {
      for (const auto& line : page.lines()) all.add_lines(line);
    } else {
      for (const auto& line : page.lines()) *ctx.out << line << "\n";
      if (!page.lines().empty()) *ctx.out << std::flush;
      if (!printed && page.lines().empty() && request.offset() == 0) {
        say_none(options.follow);
      }
      printed = true;  // (said once, or a line came)
    }
    // A controller that does not advance the offset would loop forever: treat it as no progress.
    const bool advanced = page.next_offset() > request.offset();
    all.set_next_offset(page.next_offset());
    all.set_job_done(page.job_done());
    if (advanced) request.set_offset(page.next_offset());
    if (page.lines().empty() || !advanced) {
      if (!options.follow || page.job_done()) break;
      ctx.sleep(ctx.poll_interval_s);
    }
  }
  if (ctx.json) RETURN_IF_ERROR(PrintJson(all, *ctx.out));
  return kExitOk;
}

}  // namespace furnace::cli
