#include "controller/store/memory_escalation.h"

namespace furnace::controller {

std::optional<std::string> EscalatedMemoryPolicy(const std::string& policy,
                                                 uint64_t device_budget) {
  const std::string p = policy.empty() ? "none" : policy;
  if (p != "none" && p != "selective" && p != "full_recompute" && p != "offload" &&
      p != "adaptive") {
    return std::nullopt;
  }
  if (device_budget > 0) {
    if (p == "adaptive") return std::nullopt;
    return "adaptive";
  }
  if (p == "none") return "selective";
  if (p == "selective" || p == "offload") return "full_recompute";
  return std::nullopt;  // full_recompute; adaptive always has a budget (refused at submit)
}

}  // namespace furnace::controller
