#include "controller/cli/recovery_view.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "controller/cli/format.h"

namespace furnace::cli {

std::string RenderRecoverySection(const furnace::v1::JobDetail& job) {
  Table table({"ATTEMPT", "TOTAL", "DETECT", "TEARDOWN", "BACKOFF", "PLACE", "START", "RENDEZVOUS",
               "SETUP", "CKPT LOAD", "1ST STEP", "LONGEST"},
              "  ");
  for (size_t c = 0; c <= 10; ++c) table.SetRightAligned(c);
  const auto s = [](double seconds) { return absl::StrFormat("%.2f s", seconds); };
  int rows = 0;
  for (const furnace::v1::AttemptInfo& a : job.attempts()) {
    if (!a.has_recovery()) continue;
    const furnace::v1::RecoveryPhases& p = a.recovery();
    table.AddRow({absl::StrCat(p.from_attempt(), " -> ", a.attempt()), s(p.total_s()),
                  s(p.detection_s()), s(p.teardown_s()), s(p.backoff_s()), s(p.placement_s()),
                  s(p.start_s()), s(p.rendezvous_s()), s(p.setup_s()), s(p.checkpoint_load_s()),
                  s(p.first_step_s()), p.dominant()});
    ++rows;
  }
  if (rows == 0) return "";
  return absl::StrCat(
      "\nrecoveries (failure -> first step of the next attempt; teardown and backoff overlap)\n",
      table.Render());
}

}  // namespace furnace::cli
