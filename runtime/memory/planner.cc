#include "runtime/memory/planner.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace furnace::memory {

const char* PlanActionName(PlanAction action) {
  switch (action) {
    case PlanAction::kOffload:
      return "offload";
    case PlanAction::kCompress:
      return "compress";
    case PlanAction::kRecompute:
      return "recompute";
  }
  return "?";
}

namespace {

struct Option {
  PlanAction action = PlanAction::kOffload;
  uint64_t freed = 0;
  double cost = 0;
  double copy_seconds = 0;  // of the hidden window it uses (offload)
};

// The cheapest option of one candidate given the hidden copy time left; freed 0: none.
Option Cheapest(const PlanCandidate& c, const PlannerCosts& costs, double hidden_left) {
  Option best;
  auto consider = [&best](const Option& o) {
    if (o.freed == 0) return;
    const double per = o.cost / static_cast<double>(o.freed);
    const double best_per =
        best.freed == 0 ? std::numeric_limits<double>::infinity() : best.cost / best.freed;
    if (per < best_per || (per == best_per && o.freed > best.freed)) best = o;
  };
  if (c.can_offload && costs.link_bytes_per_second > 0) {
    const double copy = 2.0 * static_cast<double>(c.bytes) / costs.link_bytes_per_second;
    consider(
        {PlanAction::kOffload, c.bytes, std::max(0.0, copy - std::max(0.0, hidden_left)), copy});
  }
  if (c.can_compress && c.compressed_fraction < 1) {
    const auto saved =
        static_cast<uint64_t>(static_cast<double>(c.bytes) * (1 - c.compressed_fraction));
    consider({PlanAction::kCompress, saved, c.bytes * costs.cast_seconds_per_byte, 0});
  }
  if (c.can_recompute) consider({PlanAction::kRecompute, c.bytes, c.recompute_seconds, 0});
  return best;
}

// Rules out what taking `action` on candidate `i` conflicts with: a rebuild reads exact inputs.
void RuleOutConflicts(std::vector<PlanCandidate>& candidates, size_t i, PlanAction action) {
  const PlanCandidate& c = candidates[i];
  if (action == PlanAction::kRecompute) {
    for (PlanCandidate& input : candidates) {
      if (std::count(c.rebuild_inputs.begin(), c.rebuild_inputs.end(), input.id) != 0) {
        input.can_compress = false;
      }
    }
  } else if (action == PlanAction::kCompress) {
    for (PlanCandidate& reader : candidates) {
      if (std::count(reader.rebuild_inputs.begin(), reader.rebuild_inputs.end(), c.id) != 0) {
        reader.can_recompute = false;
      }
    }
  }
}

}  // namespace

Plan CoverDeficits(const std::vector<PlanCandidate>& given, const std::vector<Deficit>& deficits,
                   const PlannerCosts& costs) {
  std::vector<PlanCandidate> candidates = given;  // what conflicts rule out is taken off these
  Plan plan;
  std::vector<Deficit> left = deficits;
  std::sort(left.begin(), left.end(),
            [](const Deficit& a, const Deficit& b) { return a.position < b.position; });
  std::vector<bool> taken(candidates.size(), false);
  double hidden_left = costs.hidden_seconds;
  plan.covered = true;
  for (size_t point = 0; point < left.size(); ++point) {
    while (left[point].bytes > 0) {
      int best = -1;
      Option best_option;
      double best_per = std::numeric_limits<double>::infinity();
      for (size_t i = 0; i < candidates.size(); ++i) {
        const PlanCandidate& c = candidates[i];
        const int at = left[point].position;
        if (taken[i] || c.position >= at || at >= c.until) continue;
        const Option o = Cheapest(c, costs, hidden_left);
        if (o.freed == 0) continue;
        const double per = o.cost / static_cast<double>(o.freed);
        const bool better =
            best < 0 || per < best_per ||
            (per == best_per && (o.freed > best_option.freed ||
                                 (o.freed == best_option.freed && c.id < candidates[best].id)));
        if (better) {
          best = static_cast<int>(i);
          best_option = o;
          best_per = per;
        }
      }
      if (best < 0) {
        plan.covered = false;
        break;
      }
      taken[best] = true;
      RuleOutConflicts(candidates, static_cast<size_t>(best), best_option.action);
      hidden_left -= best_option.copy_seconds;
      const PlanCandidate& c = candidates[best];
      plan.choices.push_back(
          {c.id, best_option.action, c.deferred, best_option.freed, best_option.cost});
      plan.freed += best_option.freed;
      plan.cost_seconds += best_option.cost;
      for (Deficit& d : left) {
        if (d.position > c.position && d.position < c.until) {
          d.bytes -= static_cast<int64_t>(best_option.freed);
        }
      }
    }
  }
  return plan;
}

double NextHiddenShare(double share, bool late) {
  return std::clamp(late ? 0.5 * share : share + 0.125, 0.0, 1.0);
}

std::string PlanSummary(const Plan& plan) {
  std::string out;
  for (PlanAction a : {PlanAction::kOffload, PlanAction::kCompress, PlanAction::kRecompute}) {
    int n = 0;
    uint64_t bytes = 0;
    for (const PlanChoice& c : plan.choices) {
      if (c.action != a) continue;
      ++n;
      bytes += c.freed;
    }
    if (n == 0) continue;
    absl::StrAppend(&out, out.empty() ? "" : ", ", PlanActionName(a), " ", n,
                    absl::StrFormat(" (%.2f MiB)", bytes / 1048576.0));
  }
  return out.empty() ? "nothing" : out;
}

}  // namespace furnace::memory
