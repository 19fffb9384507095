#include "controller/store/memory_escalation.h"

namespace furnace::controller {

std::optional<std::string> EscalatedMemoryPolicy(const std::string& policy) {
  if (policy.empty() || policy == "none") return "selective";
  if (policy == "selective" || policy == "offload" || policy == "adaptive") {
    return "full_recompute";
  }
  return std::nullopt;
}

}  // namespace furnace::controller
