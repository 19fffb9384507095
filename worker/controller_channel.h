// The gRPC channel from a worker process (agent or rank) to the controller. The controller may
// restart at any time, so the channel retries connecting quickly (0.2..1 s) instead of gRPC's
// default backoff of up to two minutes, which would leave ranks and agents waiting long after the
// controller is back. Over TLS (transport/credentials.h) when the ChannelSecurity names files: the
// agent's flags, or for a rank the copy its RankTask carries. Thread-safe (a gRPC channel).
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "furnace/v1/agent.pb.h"
#include "grpcpp/channel.h"

namespace furnace::worker {

// Plaintext (local mode, tests).
std::shared_ptr<grpc::Channel> MakeControllerChannel(const std::string& address);

// The address this machine sends from toward the controller at `address` (host:port,
// [v6]:port): the one other machines of its network reach it at. A UDP socket "connected" to the
// controller asks the kernel's routing table; no packet is sent. Unavailable when the name does
// not resolve or no route leads there.
absl::StatusOr<std::string> SourceAddressToward(const std::string& address);

// With the TLS files and join token of `security` (read now: InvalidArgument names the flag and
// file at fault); every call carries `worker_id` so the controller can name the caller.
absl::StatusOr<std::shared_ptr<grpc::Channel>> MakeControllerChannel(
    const std::string& address, const furnace::v1::ChannelSecurity& security,
    const std::string& worker_id);

}  // namespace furnace::worker
