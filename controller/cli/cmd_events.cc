// furnace events [--job ID] [--limit N]: the controller's audit log of state-changing calls.
#include "absl/strings/str_cat.h"
#include "controller/cli/commands.h"
#include "controller/cli/exit_codes.h"
#include "controller/cli/format.h"
#include "runtime/base/status.h"

namespace furnace::cli {

absl::StatusOr<int> RunEvents(const CommandContext& ctx, const EventsOptions& options) {
  v1::ListAuditEventsRequest request;
  request.set_job_id(options.job_id);
  request.set_limit(options.limit);
  ASSIGN_OR_RETURN(const v1::ListAuditEventsResponse response,
                   ctx.client->ListAuditEvents(request));
  if (ctx.json) {
    RETURN_IF_ERROR(PrintJson(response, *ctx.out));
    return kExitOk;
  }
  if (response.events().empty()) {
    *ctx.out << (options.job_id.empty() ? std::string("no events")
                                        : absl::StrCat("no events for job ", options.job_id))
             << "\n";
    return kExitOk;
  }
  Table table({"TIME", "WHO", "ACTION", "JOB", "OUTCOME", "DETAIL"});
  for (const v1::AuditEvent& e : response.events()) {
    // A refusal's message may run over several lines (every problem of a job file): the first
    // line here, all of it with --json.
    const std::string detail = e.detail().substr(0, e.detail().find('\n'));
    table.AddRow({FormatUnixTime(e.unix_time()), e.identity(), e.action(),
                  e.job_id().empty() ? "-" : e.job_id(),
                  e.accepted() ? "accepted" : absl::StrCat("refused (", e.code(), ")"),
                  ctx.width > 0 ? Truncate(detail, 100) : detail});
  }
  *ctx.out << table.Render();
  return kExitOk;
}

}  // namespace furnace::cli
