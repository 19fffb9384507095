// furnace watch JOB: polls GetJob until the job is final. On a terminal the frame is redrawn in
// place; otherwise a line is printed only when something changed, so a log of it stays readable.
// With --json those lines go to stderr and stdout gets the final JobDetail alone.
#include "absl/strings/str_cat.h"
#include "controller/cli/commands.h"
#include "controller/cli/exit_codes.h"
#include "controller/cli/poll_outage.h"
#include "controller/cli/watch_view.h"
#include "runtime/base/status.h"

namespace furnace::cli {

absl::StatusOr<int> RunWatch(const CommandContext& ctx, const std::string& job_id,
                             bool controller_answered) {
  std::optional<v1::JobDetail> previous;
  int frame_lines = 0;
  PollOutage outage(*ctx.clock, controller_answered);
  StepRate rate;
  while (true) {
    absl::StatusOr<v1::JobDetail> polled = ctx.client->GetJob(job_id);
    if (!polled.ok()) {
      if (!outage.Retry(polled.status())) return polled.status();
      ctx.sleep(ctx.poll_interval_s);
      continue;
    }
    outage.Answered();
    const v1::JobDetail& job = *polled;
    const double now_unix = ctx.clock->UnixSeconds();
    const bool final = IsFinalState(job.summary().state());
    if (ctx.json) {
      // stdout is the one document (the final JobDetail); what changed goes to stderr as it
      // happens, so a long watch is not silent for hours.
      if (ctx.err != nullptr) {
        for (const auto& line : PlainWatchLines(previous ? &*previous : nullptr, job)) {
          *ctx.err << line << "\n";
        }
        *ctx.err << std::flush;
      }
      if (final) RETURN_IF_ERROR(PrintJson(job, *ctx.out));
    } else if (ctx.tty) {
      rate.Observe(ctx.clock->MonotonicSeconds(), job.summary().attempt(), job.summary().step());
      const std::vector<std::string> lines =
          WatchFrame(job, now_unix, ctx.width, rate.steps_per_second());
      *ctx.out << RedrawFrame(frame_lines, lines) << std::flush;
      frame_lines = static_cast<int>(lines.size());
    } else {
      for (const auto& line : PlainWatchLines(previous ? &*previous : nullptr, job)) {
        *ctx.out << line << "\n";
      }
      *ctx.out << std::flush;
    }
    if (final) {
      if (!ctx.json) *ctx.out << WatchSummary(job, now_unix) << "\n";
      return ExitCodeForState(job.summary().state());
    }
    previous = job;
    ctx.sleep(ctx.poll_interval_s);
  }
}

}  // namespace furnace::cli
