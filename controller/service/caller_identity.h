// Who is calling a gRPC service: what the audit log records and the submission rate limit counts
// by. The transport layer (TLS and bearer tokens) puts the caller's identity in the AuthContext
// property `furnace.identity` (a token's name, `agent:<worker id>`, or `anonymous` / `local` when
// auth is off); without it, the peer's address without its port ("ipv4:127.0.0.1",
// "ipv6:[::1]") stands in: each CLI run connects from a new port, and a rate limit per connection
// would limit nothing.
//
// Header-only; call from a handler's thread while its ServerContext lives.
#pragma once

#include <grpcpp/grpcpp.h>

#include <string>

namespace furnace::controller {

// "ipv4:10.0.0.1:5000" -> "ipv4:10.0.0.1", "ipv6:[::1]:5000" -> "ipv6:[::1]"; other forms
// (unix:/path) as they are.
inline std::string PeerHost(const std::string& peer) {
  if (peer.rfind("ipv4:", 0) != 0 && peer.rfind("ipv6:", 0) != 0) return peer;
  const size_t colon = peer.rfind(':');
  const size_t bracket = peer.rfind(']');
  if (colon <= 4 || (bracket != std::string::npos && colon < bracket)) return peer;
  return peer.substr(0, colon);
}

inline std::string CallerIdentity(const grpc::ServerContext& context) {
  const std::shared_ptr<const grpc::AuthContext> auth = context.auth_context();
  if (auth != nullptr) {
    const std::vector<grpc::string_ref> values = auth->FindPropertyValues("furnace.identity");
    if (!values.empty()) return std::string(values.front().data(), values.front().size());
  }
  return PeerHost(context.peer());
}

}  // namespace furnace::controller
