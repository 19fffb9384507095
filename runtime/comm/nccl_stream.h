// The communicator of one group for a rank on a CUDA device, as the worker connects every group of
// a train rank when the job's resources.device is cuda (worker/rank_groups.cc): a communication
// stream of the group's own (Device::CreateStream), an NCCL communicator enqueueing on it
// (nccl_communicator.h; its unique id published through `store` under "<prefix>/nccl_id" by the
// group's rank 0), wrapped in a StreamCommunicator (stream_communicator.h) that `watchdog` (the
// rank's, shared by all its groups) follows. The header names no CUDA type, so callers build
// without CUDA; there the function says Unavailable.
//
// Errors: InvalidArgument when `device` is not a CUDA device or an argument is bad; Unavailable in
// a build without CUDA/NCCL; otherwise CreateNcclCommunicator's (DeadlineExceeded when the peers do
// not join within timeout_s) and the device's.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "runtime/comm/comm_watchdog.h"
#include "runtime/comm/communicator.h"
#include "runtime/comm/kv_store.h"
#include "runtime/device/device.h"

namespace furnace::comm {

struct NcclGroupOptions {
  double timeout_s = 300;                   // NCCL's rendezvous and host-side waits
  std::function<void()> on_wait_tick = {};  // at least once a second while the rendezvous waits
};

// True when this build has NCCL (FURNACE_ENABLE_CUDA).
bool NcclAvailable();

absl::StatusOr<std::unique_ptr<Communicator>> CreateNcclStreamCommunicator(
    KvStore& store, const std::string& prefix, const std::string& name, int rank, int size,
    device::Device& device, std::shared_ptr<CommWatchdog> watchdog,
    const NcclGroupOptions& options);

}  // namespace furnace::comm
