// ForwardingCommunicator: a comm::Communicator that hands every call to another one. A test
// derives from it and overrides the calls it watches or changes; the others pass straight through.
// Ownership: owns the inner communicator. Thread-safety: the inner one's.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "runtime/comm/communicator.h"

namespace furnace::testing {

class ForwardingCommunicator : public comm::Communicator {
 public:
  explicit ForwardingCommunicator(std::unique_ptr<comm::Communicator> inner)
      : inner_(std::move(inner)) {}

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  const std::string& name() const override { return inner_->name(); }
  absl::Status AllReduce(float* data, int64_t count) override {
    return inner_->AllReduce(data, count);
  }
  absl::Status ReduceScatter(const float* in, float* out, int64_t count_per_rank) override {
    return inner_->ReduceScatter(in, out, count_per_rank);
  }
  absl::Status ReduceScatterV(const float* in, float* out,
                              const std::vector<int64_t>& counts) override {
    return inner_->ReduceScatterV(in, out, counts);
  }
  absl::Status AllGather(const void* in, void* out, int64_t bytes_per_rank) override {
    return inner_->AllGather(in, out, bytes_per_rank);
  }
  absl::Status AllGatherV(const void* in, int64_t in_bytes, void* out,
                          const std::vector<int64_t>& recv_bytes) override {
    return inner_->AllGatherV(in, in_bytes, out, recv_bytes);
  }
  absl::Status AllToAllV(const void* in, const std::vector<int64_t>& send_bytes, void* out,
                         const std::vector<int64_t>& recv_bytes) override {
    return inner_->AllToAllV(in, send_bytes, out, recv_bytes);
  }
  absl::Status Broadcast(void* data, int64_t bytes, int root) override {
    return inner_->Broadcast(data, bytes, root);
  }
  absl::Status Send(const void* data, int64_t bytes, int peer, uint32_t tag) override {
    return inner_->Send(data, bytes, peer, tag);
  }
  absl::Status Recv(void* data, int64_t bytes, int peer, uint32_t tag) override {
    return inner_->Recv(data, bytes, peer, tag);
  }
  absl::Status WaitSends() override { return inner_->WaitSends(); }
  absl::Status PostSends() override { return inner_->PostSends(); }
  absl::Status Barrier() override { return inner_->Barrier(); }
  void Abort(const std::string& reason) override { inner_->Abort(reason); }
  absl::Status AsyncError() const override { return inner_->AsyncError(); }

 private:
  std::unique_ptr<comm::Communicator> inner_;
};

}  // namespace furnace::testing
