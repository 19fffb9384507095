// gRPC credentials from the --tls-ca / --tls-cert / --tls-key flags and a bearer token: the one
// maker every gRPC link of Furnace uses (the controller's server, the agents' and ranks' channels
// to it, the CLI's channel). Files are read and checked here (PEM parses, the key matches the
// certificate), so a bad file is refused at start with the flag named, not at the first handshake.
// With no TLS file given the credentials are plaintext, which is what local mode runs on.
// Stateless functions; thread-safe.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"

namespace furnace::transport {

// The PEM files of one end of a TLS link, as the flags name them.
struct TlsFiles {
  std::string ca;    // --tls-ca: the CA that signed the other end's certificate
  std::string cert;  // --tls-cert: this end's certificate chain
  std::string key;   // --tls-key: the private key of `cert`
  bool enabled() const { return !ca.empty() || !cert.empty() || !key.empty(); }
};

// What a client presents: TLS files (all empty: plaintext), the bearer token sent as
// `authorization: Bearer <token>` on every call (empty: none), and for agents and ranks the worker
// id sent as `furnace-worker-id` (the controller names the caller `agent:<worker id>`).
struct ClientSecurity {
  TlsFiles tls;
  std::string token;
  std::string worker_id;
};

// The metadata keys the credentials below send and the controller's auth processor reads.
inline constexpr char kAuthorizationKey[] = "authorization";
inline constexpr char kWorkerIdKey[] = "furnace-worker-id";
// The common name of a worker certificate that names the host whose workers it may act as
// (`furnace-worker:<host>`; the controller holds agents to it:
// controller/service/auth_processor.h).
inline constexpr char kWorkerCertPrefix[] = "furnace-worker:";
// The longest host such a certificate can name: X.509 caps a common name at 64 characters.
inline constexpr size_t kMaxWorkerHostLength = 64 - (sizeof(kWorkerCertPrefix) - 1);

// Server credentials: plaintext when `tls` is not enabled; otherwise --tls-cert, --tls-key and
// --tls-ca are all required. Client certificates are requested and, when presented, verified
// against --tls-ca (a certificate the CA did not sign fails the handshake); they are not required,
// so a CLI with only a token can connect. The controller's auth processor then demands a verified
// client certificate for AgentService calls (controller/service/auth_processor.h): agents are
// mutually authenticated, users by token. InvalidArgument names the flag and file at fault.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(const TlsFiles& tls);

// Channel credentials: plaintext when TLS is not enabled, else TLS verifying the server against
// --tls-ca (required) with --tls-cert/--tls-key as the client certificate (both or neither). A
// token or worker id is attached to every call; a token needs TLS (a bearer token is never sent in
// the clear), else InvalidArgument.
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(
    const ClientSecurity& security);

}  // namespace furnace::transport
