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
                                                     world_size == 1 ? " worker, " : " workers, ",
                                                     qualifying, " available"));
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

std::vector<furnace::v1::ParallelSpec> AllowedLayouts(const furnace::v1::JobSpec& spec) {
  std::vector<furnace::v1::ParallelSpec> out = {spec.parallel()};
  const furnace::v1::ParallelSpec& own = spec.parallel();
  for (const furnace::v1::LayoutSpec& layout : spec.recovery().shrink()) {
    furnace::v1::ParallelSpec p = own;
    p.set_pp(layout.pp());
    p.set_dp(layout.dp());
    p.set_tp(layout.tp());
    p.set_ep(layout.ep());
    p.set_esp(layout.esp());
    if (layout.dp() > 0) {
      // The global batch micro_batch * micro_batches * dp stays the job's.
      p.set_micro_batches(
          static_cast<uint32_t>(uint64_t{own.micro_batches()} * own.dp() / layout.dp()));
    }
    out.push_back(std::move(p));
  }
  return out;
}

uint32_t LayoutWorld(const furnace::v1::ParallelSpec& layout) {
  const uint64_t world = uint64_t{layout.pp()} * layout.dp() * layout.tp();
  return world > UINT32_MAX ? UINT32_MAX : static_cast<uint32_t>(world);
}

std::string DescribeLayout(const furnace::v1::ParallelSpec& l) {
  return absl::StrCat("pp ", l.pp(), " dp ", l.dp(), " tp ", l.tp(), " ep ", l.ep(), " esp ",
                      l.esp(), " (", LayoutWorld(l), " ranks)");
}

int FirstFittingLayout(const std::vector<furnace::v1::ParallelSpec>& layouts, uint32_t healthy) {
  for (size_t i = 0; i < layouts.size(); ++i) {
    if (LayoutWorld(layouts[i]) <= healthy) return static_cast<int>(i);
  }
  return -1;
}

}  // namespace furnace::controller
