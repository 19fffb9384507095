#include "controller/service/server_security.h"

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "controller/service/auth_processor.h"
#include "runtime/base/status.h"
#include "transport/credentials.h"
#include "transport/listen_address.h"
#include "transport/pem_check.h"
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
  if (!flags.metrics_listen.empty() && !transport::IsLoopbackAddress(flags.metrics_listen) &&
      !out.tls) {
    const std::string what =
        absl::StrCat("--metrics-listen ", flags.metrics_listen,
                     " is not a loopback address and there is no --tls-cert/--tls-key for HTTPS");
    if (!flags.insecure) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, ": give them, listen on 127.0.0.1, or pass --insecure to serve plain HTTP"));
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
    out.credentials->SetAuthMetadataProcessor(
        std::make_shared<TokenAuthProcessor>(std::move(policy)));
  }
  return out;
}

absl::StatusOr<std::string> WriteHttpsCertificate(const ControllerFlags& flags,
                                                  const std::string& dir) {
  ASSIGN_OR_RETURN(const std::string key, transport::ReadFileForFlag(flags.tls_key, "--tls-key"));
  ASSIGN_OR_RETURN(const std::string cert,
                   transport::ReadFileForFlag(flags.tls_cert, "--tls-cert"));
  const std::string path = (std::filesystem::path(dir) / "https.pem").string();
  RETURN_IF_ERROR(transport::WriteFileWithMode(path, key + cert, 0600));
  return path;
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
