// Start-up calibration of the cost model (cost_model.h): times the collectives the MoE schedules
// use on this job's real groups and fits alpha-beta per (collective kind, group), so `auto` picks
// a schedule from this machine's links rather than stated defaults.
//
// Every rank of `world` must call Calibrate with the same options at the same point (it runs
// collectives on every group). The sequence, identical on every rank:
//   for each group of size > 1, in the order tp, ep, esp, for each kind the schedules use on it
//   (tp: all_gather; ep: all_to_all, an AllToAllV of equal chunks; esp: all_gather,
//   reduce_scatter), for each size: a Barrier on that group, then `repeats` timed calls; the
//   median is the point. Then, with the caller's gemm_seconds (and copy_seconds), the GEMM and copy
//   fits. Every timing is then averaged over `world` (one fp32 AllReduce, sum / world size), so
//   every rank fits bit-identical points and gets a bit-identical profile: the schedule choice
//   agrees everywhere.
// Sizes are logical bytes in the Communicator convention (what cost_model's OpBytes counts): the
// all-gather's own contribution, the all-to-all's whole send, the reduce-scatter's whole input.
// A kind a group does not use, and every kind of a group of one, is left unfitted (points 0).
// Buffers: on `device` (CalibrationOptions), so a GPU rank times its collectives on device memory
// as the MoE layers run them (a stream communicator stages host buffers through pinned memory,
// which is not what the schedules pay). Each timed call ends when the calling thread's stream has
// passed it (tensor::Synchronize): a stream communicator returns at enqueue, and the collective is
// timed to its completion. On the CPU device (or none) the buffers are host memory and the calls
// complete before they return.
//
// Logs nothing. Errors: a collective's, the device's or a measure's error, or InvalidArgument for
// options that cannot be run (no sizes, repeats < 1). Thread-safety: one call per rank thread; uses
// the communicators' threads as their contract says (one thread at a time per communicator).
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/comm/communicator.h"
#include "runtime/device/device.h"
#include "runtime/moe/cost_model.h"

namespace furnace::moe {

struct CalibrationGroups {  // nullptr = a group of one (this rank alone)
  comm::Communicator* world = nullptr;
  comm::Communicator* tp = nullptr;
  comm::Communicator* ep = nullptr;
  comm::Communicator* esp = nullptr;
};

struct CalibrationOptions {
  std::vector<int64_t> sizes_bytes = {16 << 10, 128 << 10, 1 << 20};
  int repeats = 3;
  // Where the collectives' buffers live: the rank's device (the model's). nullptr: host memory.
  device::Device* device = nullptr;
  // Measures one GEMM of about `flops` to its completion and returns its seconds (the caller owns
  // the device). Unset:
  // the profile keeps DefaultProfile's GEMM numbers (points 0).
  std::function<absl::StatusOr<double>(int64_t flops)> gemm_seconds;
  std::vector<int64_t> gemm_flops = {1 << 20, 1 << 23, 1 << 26};
  // Measures one local row copy of `bytes` (on the device), to its completion. Unset:
  // DefaultProfile's copy numbers.
  std::function<absl::StatusOr<double>(int64_t bytes)> copy_seconds;
};

// The profile's source reads "fitted on tp T x ep E x esp S (world W)"; seconds_spent is the
// calibration's wall time averaged over world.
absl::StatusOr<CostProfile> Calibrate(const CalibrationGroups& g, const CalibrationOptions& o);

}  // namespace furnace::moe
