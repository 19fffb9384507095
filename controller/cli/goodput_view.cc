#include "controller/cli/goodput_view.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "controller/cli/format.h"

namespace furnace::cli {

bool HasGoodput(const v1::JobDetail& job) {
  if (!job.has_goodput()) return false;
  const v1::JobGoodput& g = job.goodput();
  return g.productive_steps() > 0 || g.redone_steps() > 0 || g.recovering_seconds() > 0;
}

std::vector<std::pair<std::string, std::string>> GoodputRows(const v1::JobGoodput& g) {
  std::vector<std::pair<std::string, std::string>> rows;
  const double lost =
      g.restart_seconds() + g.redone_seconds() + g.checkpoint_stall_seconds() + g.startup_seconds();
  const bool measured = g.productive_seconds() + lost > 0;
  rows.emplace_back("goodput", measured
                                   ? absl::StrCat(FormatPercent(g.ratio(), 1), "  (productive ",
                                                  FormatSeconds(g.productive_seconds()), " over ",
                                                  g.productive_steps(),
                                                  g.productive_steps() == 1 ? " step)" : " steps)")
                                   : std::string("-"));
  if (measured) {
    rows.emplace_back(
        "lost", absl::StrCat(FormatSeconds(lost), ": restart ", FormatSeconds(g.restart_seconds()),
                             ", redone ", FormatSeconds(g.redone_seconds()), " (", g.redone_steps(),
                             g.redone_steps() == 1 ? " step)" : " steps)", ", checkpoint stall ",
                             FormatSeconds(g.checkpoint_stall_seconds()), ", start-up ",
                             FormatSeconds(g.startup_seconds())));
  }
  if (g.recovering_seconds() > 0) {
    rows.emplace_back("recovering",
                      absl::StrCat(FormatSeconds(g.recovering_seconds()),
                                   " so far (counted once the attempt's first step is done)"));
  }
  if (g.mtbf_seconds() > 0) {
    rows.emplace_back("failures",
                      absl::StrCat(g.failures(), ", MTBF ", FormatSeconds(g.mtbf_seconds()),
                                   !g.mtbf_from_prior() ? " observed"
                                   : g.mtbf_basis() == "cluster"
                                       ? " (from this cluster's failures: none of this job yet)"
                                       : " (prior: no failure yet)"));
  }
  if (g.checkpoint_interval_steps() > 0) {
    rows.emplace_back("interval",
                      absl::StrCat("checkpoint.every auto: ", g.checkpoint_interval_steps(),
                                   g.checkpoint_interval_steps() == 1 ? " step (" : " steps (",
                                   FormatSeconds(g.checkpoint_interval_seconds()), ")"));
  }
  return rows;
}

std::string RenderGoodputSection(const v1::JobDetail& job) {
  if (!HasGoodput(job)) return "";
  const auto rows = GoodputRows(job.goodput());
  size_t width = 0;
  for (const auto& [key, value] : rows) width = std::max(width, key.size());
  std::string out = "\ngoodput\n";
  for (const auto& [key, value] : rows) {
    absl::StrAppend(&out, "  ", key, std::string(width + 2 - key.size(), ' '), value, "\n");
  }
  return out;
}

}  // namespace furnace::cli
