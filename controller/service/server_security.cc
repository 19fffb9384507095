#include "controller/service/server_security.h"

#include <grpc/grpc.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "controller/service/auth_processor.h"
#include "runtime/base/status.h"
#include "transport/credentials.h"
#include "transport/listen_address.h"
#include "transport/token_file.h"

namespace furnace::controller {

absl::StatusOr<ServerSecurity> MakeServerSecurity(const ControllerFlags& flags) {
  ServerSecurity out;
  const transport::TlsFiles tls{flags.tls_ca, flags.tls_cert, flags.tls_key};
  out.tls = tls.enabled();
  out.tokens = !flags.token_file.empty();
  out.insecure = flags.insecure;
  if (!out.tls && (out.tokens || !flags.join_token_file.empty())) {
    return absl::InvalidArgumentError(
        absl::StrCat(out.tokens ? "--token-file" : "--join-token-file",
                     " needs TLS (--tls-cert, --tls-key, --tls-ca): a bearer token is never "
                     "accepted in the clear"));
  }

  // The listen rule.
  std::vector<std::string> missing;
  if (!out.tls) missing.push_back("--tls-cert, --tls-key, --tls-ca");
  if (!out.tokens) missing.push_back("--token-file");
  if (flags.join_token_file.empty()) missing.push_back("--join-token-file");
  if (!transport::IsLoopbackAddress(flags.listen) && !missing.empty()) {
    const std::string what = absl::StrCat("--listen ", flags.listen,
                                          " is not a loopback address and the controller has no ",
                                          absl::StrJoin(missing, ", "));
    if (!flags.insecure) {
      return absl::InvalidArgumentError(
          absl::StrCat(what,
                       ": give them (`furnace certs init DIR` makes development ones), listen on "
                       "127.0.0.1, or pass --insecure to run it open to anyone who can reach it"));
    }
    out.warnings.push_back(absl::StrCat(what, ": anyone who can reach it can submit jobs"));
  }
  // The HTTP listener has no TLS: Debian's civetweb 1.15 loads libssl at run time with an OpenSSL
  // 1.1 function table, and under OpenSSL 3 its first TLS connection calls a null function
  // (seen in gdb: a segfault in a civetweb worker thread). So beyond loopback it needs --insecure;
  // put a TLS reverse proxy in front of it, or scrape it on the host.
  if (!flags.metrics_listen.empty() && !transport::IsLoopbackAddress(flags.metrics_listen)) {
    const std::string what = absl::StrCat("--metrics-listen ", flags.metrics_listen,
                                          " is not a loopback address and the metrics/dashboard "
                                          "listener has no TLS");
    if (!flags.insecure) {
      return absl::InvalidArgumentError(absl::StrCat(
          what,
          ": listen on 127.0.0.1 (behind a TLS reverse proxy), or pass --insecure to serve "
          "plain HTTP"));
    }
    out.warnings.push_back(absl::StrCat(what, ": /metrics and the dashboard are plain HTTP"));
  }

  ASSIGN_OR_RETURN(out.credentials, transport::MakeServerCredentials(tls));
  if (out.tls) {
    AuthPolicy policy;
    if (out.tokens) {
      ASSIGN_OR_RETURN(policy.tokens, transport::ReadTokenFile(flags.token_file, "--token-file"));
    }
    if (!flags.join_token_file.empty()) {
      ASSIGN_OR_RETURN(policy.join_token,
                       transport::ReadClientToken(flags.join_token_file, "--join-token-file"));
    }
    if (out.tokens) out.refusals = std::make_shared<AuthRefusals>();
    out.credentials->SetAuthMetadataProcessor(
        std::make_shared<TokenAuthProcessor>(std::move(policy), out.refusals));
  }
  return out;
}

absl::StatusOr<std::string> AdvertiseAddress(const ControllerFlags& flags) {
  const auto port_zero = [](const std::string& address) {
    return address.size() > 2 && address.ends_with(":0");
  };
  const std::string allowed =
      "give --advertise HOST:PORT, the name or address workers and ranks reach this controller at "
      "(one its TLS certificate names)";
  if (!flags.advertise.empty()) {
    if (port_zero(flags.advertise) || transport::IsWildcardAddress(flags.advertise)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--advertise ", flags.advertise, " is no address a worker can dial; ", allowed));
    }
    return flags.advertise;
  }
  if (port_zero(flags.listen)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--listen ", flags.listen,
                     " with port 0 needs --advertise (the port is chosen at bind); ", allowed));
  }
  if (transport::IsWildcardAddress(flags.listen)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--listen ", flags.listen,
        " listens on every interface, which is no address a worker can dial (its ranks would "
        "dial their own machine for rendezvous, and TLS name checks fail): ",
        allowed));
  }
  return flags.listen;
}

void ConfigureServerLimits(grpc::ServerBuilder& builder, const ControllerFlags& flags) {
  builder.SetMaxReceiveMessageSize(static_cast<int>(flags.max_request_bytes));
  // The synchronous methods' threads (JobService; AgentService is on completion queues): gRPC's
  // default keeps at most 2 idle pollers and ends the rest, so every burst created and destroyed
  // threads; more idle pollers are kept instead (bench/controlplane).
  builder.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::MIN_POLLERS, 2);
  builder.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::MAX_POLLERS, 16);
  // gRPC sets SO_REUSEPORT by default: a second controller on a port in use would start and share
  // the connections with the first (workers and clients talking to either at random). Refused.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
}

std::string InsecureGaugeText(bool insecure) {
  return absl::StrCat(
      "# HELP furnace_controller_insecure 1 when the controller runs with --insecure (a "
      "non-loopback listener may lack TLS or tokens)\n"
      "# TYPE furnace_controller_insecure gauge\n"
      "furnace_controller_insecure ",
      insecure ? 1 : 0, "\n");
}

}  // namespace furnace::controller
