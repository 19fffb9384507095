// Who is calling a gRPC service: what the audit log records and the submission rate limit counts
// by. The transport layer (TLS and bearer tokens) puts the caller's identity in the AuthContext
// property `furnace.identity` (a token's name, `agent:<worker id>`, or `anonymous` / `local` when
// auth is off); without it, the peer address ("ipv4:127.0.0.1:53412") stands in.
//
// Header-only; call from a handler's thread while its ServerContext lives.
#pragma once

#include <grpcpp/grpcpp.h>

#include <string>

namespace furnace::controller {

inline std::string CallerIdentity(const grpc::ServerContext& context) {
  const std::shared_ptr<const grpc::AuthContext> auth = context.auth_context();
  if (auth != nullptr) {
    const std::vector<grpc::string_ref> values = auth->FindPropertyValues("furnace.identity");
    if (!values.empty()) return std::string(values.front().data(), values.front().size());
  }
  return context.peer();
}

}  // namespace furnace::controller
