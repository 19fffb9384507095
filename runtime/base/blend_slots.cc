#include "runtime/base/blend_slots.h"

#include <algorithm>
#include <cmath>
#include <utility>

namespace furnace {

std::optional<std::vector<int64_t>> BlendSlotCounts(const std::vector<double>& weights) {
  double total = 0;
  for (double w : weights) {
    if (!(w > 0)) return std::nullopt;
    total += w;
  }
  if (!std::isfinite(total) || !(total > 0)) return std::nullopt;
  std::vector<int64_t> counts(weights.size());
  std::vector<std::pair<double, size_t>> remainders;
  int64_t assigned = 0;
  for (size_t d = 0; d < weights.size(); ++d) {
    // The share first: K * w would overflow for weights near the largest double.
    const double exact = weights[d] / total * kBlendSlots;
    counts[d] = static_cast<int64_t>(std::floor(exact));
    assigned += counts[d];
    // A share below one slot stays at 0 (refused), rather than rounded up to twice or more of
    // what its weight asks for.
    if (counts[d] > 0) remainders.push_back({exact - static_cast<double>(counts[d]), d});
  }
  std::stable_sort(remainders.begin(), remainders.end(),
                   [](const auto& a, const auto& b) { return a.first > b.first; });
  // Largest remainders: fewer than one slot per dataset is left to hand out.
  for (size_t i = 0; assigned < kBlendSlots && i < remainders.size(); ++i, ++assigned) {
    ++counts[remainders[i].second];
  }
  return counts;
}

}  // namespace furnace
