// The gRPC channel from a worker process (agent or rank) to the controller. The controller may
// restart at any time, so the channel retries connecting quickly (0.2..1 s) instead of gRPC's
// default backoff of up to two minutes, which would leave ranks and agents waiting long after the
// controller is back. Thread-safe (a gRPC channel).
#pragma once

#include <memory>
#include <string>

#include "grpcpp/channel.h"

namespace furnace::worker {

std::shared_ptr<grpc::Channel> MakeControllerChannel(const std::string& address);

}  // namespace furnace::worker
