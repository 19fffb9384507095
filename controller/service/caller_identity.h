// Who made a call to the controller, for the audit log and for messages: the AuthContext property
// `furnace.identity` that the auth processor sets (auth_processor.h: a token's name, or
// `agent:<worker id>`, or `anonymous` over TLS without tokens). A plaintext server has no
// processor: then `local` for a loopback peer, else the peer's host (PeerHost).
#pragma once

#include <string>

#include "grpcpp/server_context.h"

namespace furnace::controller {

// "ipv4:10.0.0.1:5000" -> "ipv4:10.0.0.1", "ipv6:[::1]:5000" -> "ipv6:[::1]"; other forms
// (unix:/path) as they are. Each CLI run connects from a new port, so a caller known only by its
// address is counted by host (the submission rate limit would otherwise limit nothing).
std::string PeerHost(const std::string& peer);

std::string CallerIdentity(const grpc::ServerContext& context);

// The worker a call says it comes from: its own furnace-worker-id header, which the auth processor
// checked for this call against a host's own certificate (auth_processor.h); empty when it names
// none (agents send it over TLS only; a client that shares one channel among many agents, as the
// control-plane bench does, names none).
std::string CallerWorker(const grpc::ServerContext& context);

}  // namespace furnace::controller
