// Gang placement of a job's ranks onto free workers: all ranks or none. A pure function so the
// scheduler's choices are testable and reproducible.
//
// Rules: only workers that are free (ready, no rank) and of the requested device kind qualify;
// workers the caller asks to avoid (e.g. the ones that just lost a rank) are used only when there
// are not enough others; within each group, order is (host, slot), and rank r goes to the r-th
// worker, so consecutive ranks share a host (tensor-parallel neighbours stay close).
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace furnace::controller {

struct WorkerSlot {
  std::string worker_id;
  std::string host;
  uint32_t slot = 0;
  std::string device_kind;
  bool free = false;
};

// Returns worker ids indexed by rank, or ResourceExhausted saying how many qualify.
absl::StatusOr<std::vector<std::string>> PlaceRanks(const std::vector<WorkerSlot>& workers,
                                                    uint32_t world_size,
                                                    const std::string& device_kind,
                                                    const std::set<std::string>& avoid);

}  // namespace furnace::controller
