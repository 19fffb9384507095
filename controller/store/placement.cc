#include "controller/store/placement.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace furnace::controller {

absl::StatusOr<std::vector<std::string>> PlaceRanks(const std::vector<WorkerSlot>& workers,
                                                    uint32_t world_size,
                                                    const std::string& device_kind,
                                                    const std::set<std::string>& avoid) {
  std::vector<const WorkerSlot*> preferred, fallback;
  for (const WorkerSlot& w : workers) {
    if (!w.free || w.device_kind != device_kind) continue;
    (avoid.count(w.worker_id) ? fallback : preferred).push_back(&w);
  }
  const size_t qualifying = preferred.size() + fallback.size();
  if (qualifying < world_size) {
    return absl::ResourceExhaustedError(absl::StrCat("needs ", world_size, " free ", device_kind,
                                                     " workers, ", qualifying, " available"));
  }
  auto by_host_slot = [](const WorkerSlot* a, const WorkerSlot* b) {
    return std::tie(a->host, a->slot, a->worker_id) < std::tie(b->host, b->slot, b->worker_id);
  };
  std::sort(preferred.begin(), preferred.end(), by_host_slot);
  std::sort(fallback.begin(), fallback.end(), by_host_slot);
  preferred.insert(preferred.end(), fallback.begin(), fallback.end());
  preferred.resize(world_size);
  // Keep the chosen set in (host, slot) order so rank neighbours are host neighbours.
  std::sort(preferred.begin(), preferred.end(), by_host_slot);
  std::vector<std::string> placement;
  placement.reserve(world_size);
  for (const WorkerSlot* w : preferred) placement.push_back(w->worker_id);
  return placement;
}

}  // namespace furnace::controller
