// Gang placement of a job's ranks onto free workers: all ranks or none, and the choice of the
// layout a recovering job runs under (recovery.shrink). Pure functions so the scheduler's choices
// are testable and reproducible.
//
// Rules: only workers that are free (ready, no rank) and of the requested device kind qualify;
// workers the caller asks to avoid (suspects: a rank of theirs just failed) are used only when
// there are not enough others (spares first); excluded workers are never used (the caller marks
// them not free); within each group, order is (host, slot), and rank r goes to the r-th worker, so
// consecutive ranks share a host (tensor-parallel neighbours stay close).
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "furnace/v1/job.pb.h"

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

// The layouts a job may run under, largest first: its own (spec.parallel), then each
// recovery.shrink layout. A shrink layout keeps the global batch (micro_batch * micro_batches *
// dp): its micro_batches is the job's scaled by dp / dp' (the spec refuses a layout where that is
// not a whole number); micro_batch and order stay the job's.
std::vector<furnace::v1::ParallelSpec> AllowedLayouts(const furnace::v1::JobSpec& spec);

// pp * dp * tp.
uint32_t LayoutWorld(const furnace::v1::ParallelSpec& layout);

// "pp 1 dp 4 tp 1 ep 4 esp 1 (4 ranks)".
std::string DescribeLayout(const furnace::v1::ParallelSpec& layout);

// The index of the first (largest) layout whose ranks fit `healthy` workers; -1 when none does.
int FirstFittingLayout(const std::vector<furnace::v1::ParallelSpec>& layouts, uint32_t healthy);

}  // namespace furnace::controller
