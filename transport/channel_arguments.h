// How every client of the controller (the agents, the ranks, the CLI) reconnects: one policy, so
// a controller restart looks the same to all of them.
#pragma once

#include "grpcpp/support/channel_arguments.h"

namespace furnace::transport {

// Reconnects 0.2 s after a failure, then at most every second (gRPC's default, 1 s growing 1.6x
// and jittered, put the tries after a controller restart near 1, 2.6, 5.2, 9.3 and 15.8 s, past
// the 10 s that `furnace watch` rides out). GRPC_ARG_MIN_RECONNECT_BACKOFF_MS is also the shortest
// time gRPC gives one connection attempt (TCP and TLS handshakes): 5 s, not 0.2 (a handshake over
// a slow link must be able to finish) nor the default 20 (an attempt whose SYN a cut link
// swallowed would hold reconnection back that long once the link is back).
grpc::ChannelArguments ControllerChannelArguments();

}  // namespace furnace::transport
