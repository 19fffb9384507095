// The device a rank runs on, from its task's resources.device, and the compute stream its main
// thread enqueues on (device::StreamScope for the rest of the rank): cpu; emulated (an emulated
// discrete device of the worker's --device-memory, runtime/device/emulated_device.h); cuda (the
// slot's GPU, device_ordinal). A train rank trains on it; a commcheck rank and the health check
// run their collectives on its memory.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "furnace/v1/agent.pb.h"
#include "runtime/device/backend.h"
#include "runtime/device/device.h"

namespace furnace::worker {

struct RankDevice {
  std::unique_ptr<device::Device> device;
  std::unique_ptr<device::Stream> compute;
  device::Precision precision = device::Precision::kFp32;  // model.precision
};

// Unavailable when the device cannot be had (a build or machine without CUDA); InvalidArgument
// for an unknown kind. For cuda it first sets CUDA_MODULE_LOADING=EAGER in this process unless the
// environment sets it already (the rank's process, before its first CUDA call; see the .cc).
// Not thread-safe for cuda (setenv): called on the rank's main thread before it starts any thread
// that reads the environment or calls CUDA.
absl::StatusOr<RankDevice> MakeRankDevice(const furnace::v1::RankTask& task);

}  // namespace furnace::worker
