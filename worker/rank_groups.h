// The parallel layout of a train rank, from its RankTask: the topology of the job's `parallel:`
// section (validated against the model: a bad layout is bad input, exit 4) and the rank's groups,
// connected through the controller's rendezvous store (scoped by job and attempt, so a rank of an
// earlier attempt can never join these groups): with Gloo on the CPU and emulated devices, with
// NCCL on a CUDA device (one communicator and one communication stream per group, ordered with the
// compute by events, under one watchdog per rank that aborts them all when a collective does not
// complete within the collective timeout: runtime/comm/nccl_stream.h, comm_watchdog.h).
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "furnace/v1/agent.pb.h"
#include "runtime/comm/communicator.h"
#include "runtime/device/device.h"
#include "runtime/model/config.h"
#include "runtime/topology/topology.h"
#include "runtime/train/rank_layout.h"
#include "worker/grpc_kv_store.h"
#include "worker/rank_supervisor.h"  // StartTimeoutS

namespace furnace::worker {

// Where a rank meets its peers: the controller's rendezvous store, scoped by (job, attempt) so a
// rank of an earlier attempt can never join, and the host its Gloo pairs listen on. Every store
// wait gives up after `timeout_s`. FailedPrecondition when the task names no controller address.
struct Rendezvous {
  std::shared_ptr<GrpcKvStore> store;
  std::string host;
};
absl::StatusOr<Rendezvous> OpenRendezvous(const furnace::v1::RankTask& task, double timeout_s);

// InvalidArgument naming the field when the layout does not fit the model or the world size.
absl::StatusOr<topology::Topology> TopologyFromTask(const furnace::v1::RankTask& task,
                                                    const model::ModelConfig& config);

// Blocks until every group of this rank is connected, calling on_wait at least once a second while
// it waits. The groups connect one after another, each within max(start_timeout_s,
// hang_timeout_s) (the timeout every later operation gets too): a peer that dies mid-rendezvous
// fails the group being connected after that long. The groups take buffers of `device` (the rank's;
// it must outlive the layout). On a discrete device every group is a comm::StreamCommunicator on a
// communication stream of its own under one watchdog for the rank: NCCL on a CUDA device
// (Unavailable in a build without NCCL), Gloo through the emulated transport on the emulated one.
// On the CPU, Gloo.
absl::StatusOr<std::unique_ptr<train::RankLayout>> ConnectRankGroups(
    const furnace::v1::RankTask& task, const topology::Topology& topology,
    const model::ModelConfig& config, const std::function<void()>& on_wait, device::Device& device);

// The group of every rank of the task (world_size ranks, this one task.rank()) on `device`, made
// as ConnectRankGroups makes each of its groups (NCCL on a CUDA device, Gloo on the emulated
// transport's streams on the emulated one, Gloo on the CPU), its rendezvous keys under `prefix`
// of `rendezvous` (used while connecting). Connecting is bounded by connect_timeout_s (and so are
// NCCL's host-side waits, Barrier and WaitSends), each collective by op_timeout_s. For the
// commcheck and the health check.
absl::StatusOr<std::unique_ptr<comm::Communicator>> ConnectWorldGroup(
    const furnace::v1::RankTask& task, const Rendezvous& rendezvous, const std::string& prefix,
    double connect_timeout_s, double op_timeout_s, const std::function<void()>& on_wait,
    device::Device& device);

}  // namespace furnace::worker
