#include "transport/credentials.h"

#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "runtime/base/status.h"
#include "transport/pem_check.h"

namespace furnace::transport {
namespace {

// Adds fixed metadata (the bearer token, the worker id) to every call of a channel.
class StaticMetadataPlugin : public grpc::MetadataCredentialsPlugin {
 public:
  explicit StaticMetadataPlugin(std::multimap<std::string, std::string> metadata)
      : metadata_(std::move(metadata)) {}
  bool IsBlocking() const override { return false; }
  const char* GetType() const override { return "furnace-static-metadata"; }
  grpc::Status GetMetadata(grpc::string_ref, grpc::string_ref, const grpc::AuthContext&,
                           std::multimap<grpc::string, grpc::string>* metadata) override {
    metadata->insert(metadata_.begin(), metadata_.end());
    return grpc::Status::OK;
  }

 private:
  const std::multimap<std::string, std::string> metadata_;
};

struct KeyCertPair {
  std::string key;
  std::string cert;
};

// Reads --tls-cert and --tls-key (both or neither: `required` says which) and checks they match.
absl::StatusOr<KeyCertPair> ReadKeyCert(const TlsFiles& tls, bool required) {
  if (tls.cert.empty() != tls.key.empty() || (required && tls.cert.empty())) {
    return absl::InvalidArgumentError(
        required ? "TLS needs --tls-cert, --tls-key and --tls-ca together"
                 : "--tls-cert and --tls-key go together (a client certificate and its key)");
  }
  KeyCertPair pair;
  if (tls.cert.empty()) return pair;
  ASSIGN_OR_RETURN(pair.cert, ReadFileForFlag(tls.cert, "--tls-cert"));
  ASSIGN_OR_RETURN(pair.key, ReadFileForFlag(tls.key, "--tls-key"));
  RETURN_IF_ERROR(CheckCertificatePem(pair.cert, "--tls-cert " + tls.cert));
  RETURN_IF_ERROR(CheckKeyMatchesCertificate(pair.key, pair.cert));
  return pair;
}

absl::StatusOr<std::string> ReadCa(const TlsFiles& tls, const std::string& why) {
  if (tls.ca.empty()) return absl::InvalidArgumentError(absl::StrCat("TLS needs --tls-ca ", why));
  ASSIGN_OR_RETURN(std::string ca, ReadFileForFlag(tls.ca, "--tls-ca"));
  RETURN_IF_ERROR(CheckCertificatePem(ca, "--tls-ca " + tls.ca));
  return ca;
}

}  // namespace

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const TlsFiles& tls) {
  if (!tls.enabled()) return grpc::InsecureServerCredentials();
  ASSIGN_OR_RETURN(const KeyCertPair pair, ReadKeyCert(tls, /*required=*/true));
  ASSIGN_OR_RETURN(std::string ca, ReadCa(tls, "(the CA that signs the agents' certificates)"));
  // Request, don't require: the CLI authenticates with a token and may have no certificate. A
  // certificate that is presented must verify, and AgentService demands one (auth_processor.h).
  grpc::SslServerCredentialsOptions options(GRPC_SSL_REQUEST_CLIENT_CERTIFICATE_AND_VERIFY);
  options.pem_root_certs = std::move(ca);
  options.pem_key_cert_pairs.push_back({pair.key, pair.cert});
  return grpc::SslServerCredentials(options);
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(
    const ClientSecurity& security) {
  const TlsFiles& tls = security.tls;
  if (!tls.enabled()) {
    if (!security.token.empty()) {
      return absl::InvalidArgumentError(
          "a token is only sent over TLS: give --tls-ca (the CA of the controller's certificate)");
    }
    return grpc::InsecureChannelCredentials();
  }
  ASSIGN_OR_RETURN(const KeyCertPair pair, ReadKeyCert(tls, /*required=*/false));
  grpc::SslCredentialsOptions options;
  ASSIGN_OR_RETURN(options.pem_root_certs, ReadCa(tls, "(the CA of the controller's certificate)"));
  options.pem_cert_chain = pair.cert;
  options.pem_private_key = pair.key;
  std::shared_ptr<grpc::ChannelCredentials> channel = grpc::SslCredentials(options);
  std::multimap<std::string, std::string> metadata;
  if (!security.token.empty()) metadata.emplace(kAuthorizationKey, "Bearer " + security.token);
  if (!security.worker_id.empty()) metadata.emplace(kWorkerIdKey, security.worker_id);
  if (metadata.empty()) return channel;
  return grpc::CompositeChannelCredentials(
      channel, grpc::MetadataCredentialsFromPlugin(
                   std::make_unique<StaticMetadataPlugin>(std::move(metadata))));
}

}  // namespace furnace::transport
