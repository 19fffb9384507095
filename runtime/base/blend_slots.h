// The apportionment of a data blend (data.blend: several datasets with weights w_d) into the
// K = 4096 slots of its interleave period (runtime/data/epoch_sampler.h says how the slots are
// laid out and read). A pure function of the weights, shared by the rank that builds the sampler
// and the controller's job-file checks (controller/spec), so a blend the rank would refuse is
// refused at `furnace submit`, before any worker starts. Stateless and thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

namespace furnace {

inline constexpr int64_t kBlendSlots = 4096;  // K, the blend's interleave period

// Slots per dataset: the largest-remainder apportionment of K * w_d / sum(w), in order. A count
// of 0 is a dataset whose share is below 1/K (refused by both callers). nullopt when the weights'
// sum is not a positive finite number (a weight that is not positive, or a sum that overflows).
std::optional<std::vector<int64_t>> BlendSlotCounts(const std::vector<double>& weights);

}  // namespace furnace
