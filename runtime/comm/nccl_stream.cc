// CreateNcclStreamCommunicator (nccl_stream.h): the group's stream, NCCL on it, the stream
// communicator around both. Without CUDA, Unavailable.
#include "runtime/comm/nccl_stream.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "runtime/base/status.h"
#include "runtime/comm/stream_communicator.h"

#if FURNACE_HAVE_CUDA
#include <cuda_runtime.h>

#include "runtime/comm/nccl_communicator.h"
#include "runtime/device/cuda_status.h"
#endif

namespace furnace::comm {

bool NcclAvailable() {
#if FURNACE_HAVE_CUDA
  return true;
#else
  return false;
#endif
}

absl::StatusOr<std::unique_ptr<Communicator>> CreateNcclStreamCommunicator(
    KvStore& store, const std::string& prefix, const std::string& name, int rank, int size,
    device::Device& device, std::shared_ptr<CommWatchdog> watchdog,
    const NcclGroupOptions& options) {
  if (device.kind() != device::Kind::kCuda) {
    return absl::InvalidArgumentError(
        absl::StrCat("nccl group ", name, ": device ", device.name(), " is not a CUDA device"));
  }
  if (watchdog == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("nccl group ", name, ": no watchdog"));
  }
#if FURNACE_HAVE_CUDA
  ASSIGN_OR_RETURN(std::unique_ptr<device::Stream> stream, device.CreateStream());
  auto native = static_cast<cudaStream_t>(stream->native());
  int ordinal = 0;
  FURNACE_CUDA_RETURN_IF_ERROR(cudaStreamGetDevice(native, &ordinal));
  NcclOptions nccl;
  nccl.device = ordinal;
  nccl.stream = native;
  nccl.timeout_s = options.timeout_s;
  nccl.on_wait_tick = options.on_wait_tick;
  ASSIGN_OR_RETURN(std::unique_ptr<Communicator> transport,
                   CreateNcclCommunicator(store, prefix, name, rank, size, nccl));
  ASSIGN_OR_RETURN(std::unique_ptr<StreamCommunicator> comm,
                   StreamCommunicator::Create(std::move(transport), std::move(stream), device,
                                              std::move(watchdog)));
  return std::unique_ptr<Communicator>(std::move(comm));
#else
  (void)store;
  (void)prefix;
  (void)rank;
  (void)size;
  (void)options;
  return absl::UnavailableError(
      absl::StrCat("nccl group ", name, ": this build has no CUDA/NCCL (FURNACE_ENABLE_CUDA=OFF)"));
#endif
}

}  // namespace furnace::comm
