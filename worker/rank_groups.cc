#include "worker/rank_groups.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "runtime/base/status.h"
#include "runtime/comm/comm_watchdog.h"
#include "runtime/comm/device_staging.h"
#include "runtime/comm/emulated_transport.h"
#include "runtime/comm/gloo_communicator.h"
#include "runtime/comm/nccl_stream.h"
#include "runtime/device/emulated_device.h"
#include "spdlog/spdlog.h"
#include "worker/controller_channel.h"
#include "worker/grpc_kv_store.h"

namespace furnace::worker {

absl::StatusOr<topology::Topology> TopologyFromTask(const furnace::v1::RankTask& task,
                                                    const model::ModelConfig& config) {
  const auto& p = task.spec().parallel();
  topology::ParallelSizes sizes;
  sizes.pp = static_cast<int>(std::max<uint32_t>(1, p.pp()));
  sizes.dp = static_cast<int>(std::max<uint32_t>(1, p.dp()));
  sizes.tp = static_cast<int>(std::max<uint32_t>(1, p.tp()));
  sizes.ep = static_cast<int>(std::max<uint32_t>(1, p.ep()));
  sizes.esp = static_cast<int>(std::max<uint32_t>(1, p.esp()));
  if (!p.order().empty()) sizes.order = p.order();
  return topology::Topology::Create(sizes, static_cast<int>(task.world_size()),
                                    train::DimsOf(config));
}

absl::StatusOr<Rendezvous> OpenRendezvous(const furnace::v1::RankTask& task, double timeout_s) {
  if (task.controller_address().empty()) {
    return absl::FailedPreconditionError("the task names no controller address for rendezvous");
  }
  furnace::v1::KvScope scope;
  scope.set_job_id(task.job_id());
  scope.set_attempt(task.attempt());
  ASSIGN_OR_RETURN(auto channel, MakeControllerChannel(task.controller_address(),
                                                       task.channel_security(), task.worker_id()));
  Rendezvous out;
  out.store =
      std::make_shared<GrpcKvStore>(furnace::v1::AgentService::NewStub(channel), scope, timeout_s);
  out.host = task.host().empty() ? "127.0.0.1" : task.host();
  spdlog::info("rendezvous: rank {} of {} on {} via {} (timeout {} s)", task.rank(),
               task.world_size(), out.host, task.controller_address(), timeout_s);
  return out;
}

namespace {

// How a rank's groups are made on its device (the comment of ConnectRankGroups): one factory for
// the train layout's groups and for the world group of a commcheck or health check. The
// watchdog (discrete devices only) is shared by every group the factory makes; the factory
// holds the rendezvous store, and must not outlive `device`.
struct GroupTimeouts {
  double connect_s;  // the rendezvous (and NCCL's host-side waits: Barrier, WaitSends)
  double op_s;       // each collective (Gloo's timeout, the watchdog's)
};

absl::StatusOr<train::CommFactory> MakeGroupFactory(const Rendezvous& rendezvous,
                                                    device::Device& device, GroupTimeouts timeouts,
                                                    const std::function<void()>& on_wait) {
  if (device.kind() == device::Kind::kCuda && !comm::NcclAvailable()) {
    return absl::UnavailableError(
        "resources.device cuda: this worker was built without CUDA/NCCL (FURNACE_ENABLE_CUDA)");
  }
  // A discrete device's groups run on communication streams of their own, under one watchdog
  // that holds their collectives to the same timeout Gloo's get and aborts all of them on a
  // timeout or a peer's failure (each communicator shares it; it lives as long as they do).
  std::shared_ptr<comm::CommWatchdog> watchdog;
  if (!device::HostAddressable(device)) {
    comm::CommWatchdogOptions watch;
    watch.timeout_s = timeouts.op_s;
    ASSIGN_OR_RETURN(watchdog, comm::CommWatchdog::Create(watch));
  }
  if (device.kind() == device::Kind::kCuda) {
    // NCCL on each group's stream.
    spdlog::info("rendezvous: NCCL groups on {} (collective timeout {} s)", device.name(),
                 timeouts.op_s);
    return train::CommFactory(
        [&rendezvous, &device, watchdog, timeouts, on_wait](
            const std::string& prefix, const std::string& name, int rank, int size) {
          comm::NcclGroupOptions options;
          options.timeout_s = timeouts.connect_s;
          options.on_wait_tick = on_wait;
          return comm::CreateNcclStreamCommunicator(*rendezvous.store, prefix, name, rank, size,
                                                    device, watchdog, options);
        });
  }
  return train::CommFactory([&rendezvous, &device, watchdog, timeouts, on_wait](
                                const std::string& prefix, const std::string& name, int rank,
                                int size) -> absl::StatusOr<std::unique_ptr<comm::Communicator>> {
    comm::GlooOptions options;
    options.rank = rank;
    options.size = size;
    options.host = rendezvous.host;
    options.timeout_s = timeouts.connect_s;
    options.op_timeout_s = timeouts.op_s;
    options.on_wait_tick = on_wait;
    ASSIGN_OR_RETURN(
        std::unique_ptr<comm::Communicator> gloo,
        comm::CreateGlooCommunicator(*rendezvous.store, prefix, name, rank, size, options));
    if (auto* emulated = dynamic_cast<device::EmulatedDevice*>(&device); emulated != nullptr) {
      // The emulated device runs its groups the way a CUDA rank runs NCCL: Gloo on each
      // group's communication stream (the emulated transport), ordered with the compute
      // stream by events.
      return comm::CreateEmulatedStreamCommunicator(std::move(gloo), *emulated, watchdog,
                                                    {.timeout_s = timeouts.op_s});
    }
    return comm::ForDevice(std::move(gloo), device);  // the transport itself on the CPU
  });
}

}  // namespace

absl::StatusOr<std::unique_ptr<train::RankLayout>> ConnectRankGroups(
    const furnace::v1::RankTask& task, const topology::Topology& topology,
    const model::ModelConfig& config, const std::function<void()>& on_wait,
    device::Device& device) {
  // Connecting and every later operation get one timeout. A collective may
  // legitimately wait for a slow peer (a large checkpoint shard being fsynced, a long pipeline
  // warm-up), so it gets the hang timeout when that is longer: a rank that is really stuck is the
  // agent's hang watchdog's to catch.
  const double timeout_s = std::max(StartTimeoutS(task), task.spec().recovery().hang_timeout_s());
  ASSIGN_OR_RETURN(const Rendezvous rendezvous, OpenRendezvous(task, timeout_s));
  ASSIGN_OR_RETURN(const train::CommFactory factory,
                   MakeGroupFactory(rendezvous, device, {timeout_s, timeout_s}, on_wait));
  return train::BuildRankLayout(topology, static_cast<int>(task.rank()), config, factory);
}

absl::StatusOr<std::unique_ptr<comm::Communicator>> ConnectWorldGroup(
    const furnace::v1::RankTask& task, const Rendezvous& rendezvous, const std::string& prefix,
    double connect_timeout_s, double op_timeout_s, const std::function<void()>& on_wait,
    device::Device& device) {
  const int world = static_cast<int>(task.world_size());
  ASSIGN_OR_RETURN(
      const train::CommFactory factory,
      MakeGroupFactory(rendezvous, device, {connect_timeout_s, op_timeout_s}, on_wait));
  return factory(prefix, absl::StrCat("world[0..", world - 1, "]"), static_cast<int>(task.rank()),
                 world);
}

}  // namespace furnace::worker
