// A Communicator for the ranks of a discrete device whose transport addresses host memory only
// (Gloo, the in-process fake): every buffer of the call that is the device's memory
// (Device::IsDeviceMemory) goes through pinned host staging; host buffers pass straight through.
// This is how a rank on the emulated device (and a CUDA rank whose groups run on Gloo) talks to
// its groups, so the model, the trainer and the MoE executor hand their device buffers to a
// communicator exactly as they hand them to NCCL.
//
// Per call: each device input is copied to staging on the calling thread's current stream (none:
// the device's default stream), the stream is synchronised, the transport runs the collective on
// host memory, each device output is copied back from staging on the same stream, and the stream
// is synchronised again before the call returns. So a device buffer must be complete in the order
// of that stream when the call is made (the producing kernels were enqueued on it, or waited
// for), and the results are in device memory for any stream once the call returns.
//
// Contract (communicator.h): the transport's. Byte counters: the transport's bytes per call (the
// logical payload, as counted by the transport itself), with this call's wall time, staging
// included. Errors: the transport's; a failed staging step (a pinned allocation, a copy, a stream
// synchronisation) is returned as the device reports it and aborts the transport, so the peers
// fail at once instead of waiting out their timeout, and every later call fails fast with the
// transport's sticky error (communicator.h) instead of running a collective the peers are not in.
//
// Ownership: owns or borrows the transport (both constructors); borrows the device, which must
// outlive this. Staging buffers are grown on demand (device.AllocateHost) and kept.
// Thread-safety: one thread at a time (the transport's rule); Abort and AsyncError from any thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "runtime/comm/communicator.h"
#include "runtime/comm/pinned_staging.h"
#include "runtime/device/device.h"

namespace furnace::comm {

class StagedCommunicator final : public Communicator {
 public:
  StagedCommunicator(std::unique_ptr<Communicator> transport, device::Device& device);
  // Borrows `transport`, which must outlive this.
  StagedCommunicator(Communicator* transport, device::Device& device);
  ~StagedCommunicator() override;

  int rank() const override { return transport_->rank(); }
  int size() const override { return transport_->size(); }
  const std::string& name() const override { return transport_->name(); }

  absl::Status AllReduce(float* data, int64_t count) override;
  absl::Status ReduceScatter(const float* in, float* out, int64_t count_per_rank) override;
  absl::Status ReduceScatterV(const float* in, float* out,
                              const std::vector<int64_t>& counts) override;
  absl::Status AllGather(const void* in, void* out, int64_t bytes_per_rank) override;
  absl::Status AllGatherV(const void* in, int64_t in_bytes, void* out,
                          const std::vector<int64_t>& recv_bytes) override;
  absl::Status AllToAllV(const void* in, const std::vector<int64_t>& send_bytes, void* out,
                         const std::vector<int64_t>& recv_bytes) override;
  absl::Status Broadcast(void* data, int64_t bytes, int root) override;
  absl::Status Send(const void* data, int64_t bytes, int peer, uint32_t tag) override;
  absl::Status Recv(void* data, int64_t bytes, int peer, uint32_t tag) override;
  absl::Status WaitSends() override;
  absl::Status PostSends() override;
  absl::Status Barrier() override;
  void Abort(const std::string& reason) override { transport_->Abort(reason); }
  absl::Status AsyncError() const override { return transport_->AsyncError(); }

  Communicator& transport() const { return *transport_; }

 private:
  // Runs `call` (a transport call) and adds the transport's byte count for `op` to this
  // communicator's counters with the wall time since `timer`.
  template <typename Call>
  absl::Status Counted(CollectiveOp op, const CallTimer& timer, Call&& call);
  // `s` unchanged; when it is an error (of staging, not of the transport), the transport is
  // aborted first, naming it.
  absl::Status Staged(absl::Status s);

  std::unique_ptr<Communicator> owned_;
  Communicator* transport_;
  device::Device& device_;
  std::unique_ptr<PinnedStaging> in_, out_;
};

// The communicator a rank of `device` uses over `transport`: the transport itself when the host
// can address the device's memory (the CPU device), else a StagedCommunicator over it.
std::unique_ptr<Communicator> ForDevice(std::unique_ptr<Communicator> transport,
                                        device::Device& device);

}  // namespace furnace::comm
