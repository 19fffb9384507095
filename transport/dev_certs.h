// `furnace certs init DIR`: a development certificate authority and what a TLS cluster needs,
// made with OpenSSL's C API (ECDSA P-256 keys, SHA-256 signatures, one year of validity):
//   ca.pem ca.key                  the CA (its key signs the others; keep it off the cluster)
//   controller.pem controller.key  the controller's certificate: SAN localhost, 127.0.0.1, ::1
//                                  and each `hosts` entry; server and client usage (the
//                                  controller's --local-workers dial it with the same files)
//   worker.pem worker.key          a client certificate for worker agents (and their ranks),
//                                  shared by the fleet: it may act as any worker
//   worker-<host>.pem/.key         for each `worker_hosts` entry: that host's own certificate
//                                  (common name furnace-worker:<host>), which the controller lets
//                                  act only as the workers of that host (<host>, <host>/<slot>)
//   cli.pem cli.key                a client certificate for `furnace` (optional: tokens suffice)
//   tokens                         the controller's --token-file: an admin and a read token
//   admin.token read.token         the same tokens alone, for `furnace --token-file`
//   join.token                     the agents' join token (--join-token-file on both daemons)
// Keys and tokens are written 0600, certificates 0644. Not for production: a real deployment's CA
// lives elsewhere (README "Security").
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace furnace::transport {

struct DevCertsOptions {
  std::string dir;                        // created when missing
  std::vector<std::string> hosts;         // extra names or IP addresses of the controller
  std::vector<std::string> worker_hosts;  // hosts that get a worker certificate of their own
  bool force = false;                     // overwrite files that exist
};

// Writes the files above (each atomically) and returns their paths. Without `force`, refuses
// (FailedPrecondition naming them) when any of them exists, and writes none. Refuses too
// (FailedPrecondition) a directory that is not the caller's or that everyone may write.
// InvalidArgument for a host that is empty or has characters a DNS name or IP address cannot have
// (for a worker host: a host name as a worker id starts with it, letters, digits, '-', '.', '_').
absl::StatusOr<std::vector<std::string>> WriteDevCerts(const DevCertsOptions& options);

}  // namespace furnace::transport
