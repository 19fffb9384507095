#include "runtime/memory/policy.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "absl/strings/str_cat.h"

namespace furnace::memory {
namespace {

// Norm and activation outputs: recomputed under selective and full_recompute.
constexpr std::string_view kSelective[] = {"ln1.out", "ln2.out", "lnf.out", "mlp.hidden",
                                           "moe.expert_hidden"};
// The rest of the MoE layer's rebuildable tensors: recomputed under full_recompute. The layer's
// LayerNorm statistics (two floats a token) and its residual output (the next layer's input) stay.
constexpr std::string_view kMoeLayer[] = {"moe.router_probs", "moe.topk_indices",
                                          "moe.gates",        "moe.expert_input",
                                          "moe.expert_pre",   "moe.combined_output"};

template <size_t n>
bool In(std::string_view tag, const std::string_view (&tags)[n]) {
  for (std::string_view t : tags) {
    if (t == tag) return true;
  }
  return false;
}

}  // namespace

absl::StatusOr<MemoryPolicy> ParseMemoryPolicy(std::string_view name) {
  if (name == "none") return MemoryPolicy::kNone;
  if (name == "selective") return MemoryPolicy::kSelective;
  if (name == "full_recompute") return MemoryPolicy::kFullRecompute;
  if (name == "offload") return MemoryPolicy::kOffload;
  if (name == "adaptive") return MemoryPolicy::kAdaptive;
  return absl::InvalidArgumentError(
      absl::StrCat("memory.policy: unknown policy '", std::string(name),
                   "' (allowed: none, selective, full_recompute, offload, adaptive)"));
}

const char* MemoryPolicyName(MemoryPolicy policy) {
  switch (policy) {
    case MemoryPolicy::kNone:
      return "none";
    case MemoryPolicy::kSelective:
      return "selective";
    case MemoryPolicy::kFullRecompute:
      return "full_recompute";
    case MemoryPolicy::kOffload:
      return "offload";
    case MemoryPolicy::kAdaptive:
      return "adaptive";
  }
  return "?";
}

std::string_view TensorTag(std::string_view producer) {
  constexpr std::string_view kLayers = "layers.";
  if (producer.substr(0, kLayers.size()) != kLayers) return producer;
  const size_t dot = producer.find('.', kLayers.size());
  return dot == std::string_view::npos ? producer : producer.substr(dot + 1);
}

SaveAction StaticSaveAction(MemoryPolicy policy, std::string_view tag) {
  const bool selective = In(tag, kSelective);
  const bool moe = In(tag, kMoeLayer);
  switch (policy) {
    case MemoryPolicy::kNone:
    case MemoryPolicy::kOffload:   // keeps every tensor; its offloads are not a save action
    case MemoryPolicy::kAdaptive:  // keeps every tensor; the planner acts per micro-batch
      return SaveAction::kKeep;
    case MemoryPolicy::kSelective:
      return selective ? SaveAction::kDropAfterForward : SaveAction::kKeep;
    case MemoryPolicy::kFullRecompute:
      return selective || moe ? SaveAction::kDropAfterForward : SaveAction::kKeep;
  }
  return SaveAction::kKeep;
}

std::vector<size_t> OffloadShare(const std::vector<uint64_t>& bytes, double ratio) {
  const size_t n = std::min<size_t>(bytes.size(), 16);
  uint64_t total = 0;
  for (size_t i = 0; i < n; ++i) total += bytes[i];
  if (ratio <= 0 || total == 0) return {};
  const double share = ratio * static_cast<double>(total);
  uint32_t best = 0;
  uint64_t best_sum = 0;
  double best_gap = std::numeric_limits<double>::infinity();
  for (uint32_t mask = 1; mask < (uint32_t{1} << n); ++mask) {
    uint64_t sum = 0;
    for (size_t i = 0; i < n; ++i) {
      if ((mask >> i) & 1) sum += bytes[i];
    }
    if (sum == 0) continue;
    const double gap = std::fabs(static_cast<double>(sum) - share);
    if (gap < best_gap || (gap == best_gap && sum < best_sum)) {
      best = mask;
      best_sum = sum;
      best_gap = gap;
    }
  }
  std::vector<size_t> out;
  for (size_t i = 0; i < n; ++i) {
    if ((best >> i) & 1) out.push_back(i);
  }
  return out;
}

}  // namespace furnace::memory
