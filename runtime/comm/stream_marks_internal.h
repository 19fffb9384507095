// Internal to furnace_comm: the CUDA marker (stream_marks_cuda.cc, built with CUDA only).
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "runtime/comm/stream_marks.h"

namespace furnace::comm::internal {

absl::StatusOr<std::unique_ptr<StreamMarker>> CreateCudaStreamMarker(device::Device& device);

}  // namespace furnace::comm::internal
