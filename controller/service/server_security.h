// The controller's listen rule and server credentials, from its flags. An address other
// machines can reach (not loopback: transport/listen_address.h) needs TLS (--tls-cert, --tls-key,
// --tls-ca), a --token-file and a --join-token-file; the HTTP metrics/dashboard listener has no
// TLS (server_security.cc says why) and so must stay on loopback. --insecure lifts the rule, and
// then the controller says so loudly at start and in /metrics (furnace_controller_insecure 1).
// Tokens need TLS on any address: a bearer token never travels in the clear. Without TLS and tokens
// on loopback (local mode) nothing changes: plaintext, no auth.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "controller/service/auth_processor.h"
#include "controller/service/options.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server_builder.h"

namespace furnace::controller {

struct ServerSecurity {
  std::shared_ptr<grpc::ServerCredentials> credentials;  // with the auth processor under TLS
  bool tls = false;
  bool tokens = false;    // --token-file given: JobService needs a token
  bool insecure = false;  // --insecure given
  // With tokens: the state-changing JobService calls the auth processor refused, for the audit
  // log (the daemon's main loop hands them to Controller::AuditRefused).
  std::shared_ptr<AuthRefusals> refusals;
  std::vector<std::string> warnings;  // what --insecure leaves open, for the log at start
};

// Checks the listen rule and reads the files (errors name the flag and, for the rule, every flag
// that would satisfy it). InvalidArgument on any refusal.
absl::StatusOr<ServerSecurity> MakeServerSecurity(const ControllerFlags& flags);

// The address agents and ranks dial: --advertise, else --listen. InvalidArgument naming
// --advertise when that address cannot be dialed: port 0 (the kernel picks one at bind), or a
// wildcard host (0.0.0.0, [::]: transport/listen_address.h), which binds every interface but
// sends each worker's ranks to their own machine for rendezvous and matches no certificate.
absl::StatusOr<std::string> AdvertiseAddress(const ControllerFlags& flags);

// The gRPC server's limits from the flags: the largest request any RPC accepts
// (--max-request-bytes; a larger one is refused with RESOURCE_EXHAUSTED before any handler runs),
// and the threads of the synchronous JobService.
void ConfigureServerLimits(grpc::ServerBuilder& builder, const ControllerFlags& flags);

// The Prometheus lines of the furnace_controller_insecure gauge (1 when --insecure was given).
std::string InsecureGaugeText(bool insecure);

}  // namespace furnace::controller
