// Who made a call to the controller, for the audit log and for messages: the AuthContext property
// `furnace.identity` that the auth processor sets (auth_processor.h: a token's name, or
// `agent:<worker id>`, or `anonymous` over TLS without tokens). A plaintext server has no
// processor: then `local` for a loopback peer, else `anonymous`.
#pragma once

#include <string>

#include "grpcpp/server_context.h"

namespace furnace::controller {

std::string CallerIdentity(const grpc::ServerContext& context);

}  // namespace furnace::controller
