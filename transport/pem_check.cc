#include "transport/pem_check.h"

#include <fcntl.h>
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "runtime/base/status.h"
#include "transport/openssl_ptr.h"

namespace furnace::transport {
namespace {

Bio MemoryBio(const std::string& text) {
  return Bio(BIO_new_mem_buf(text.data(), static_cast<int>(text.size())));
}

// OpenSSL's per-thread error queue is left empty: gRPC's own TLS code on this thread reads it.
Cert FirstCertificate(const std::string& pem) {
  auto bio = MemoryBio(pem);
  Cert cert(PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr));
  ERR_clear_error();
  return cert;
}

}  // namespace

absl::StatusOr<std::string> ReadFileForFlag(const std::string& path, const std::string& flag) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(
        absl::StrCat(flag, " ", path, ": cannot read the file (", std::strerror(errno), ")"));
  }
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

absl::Status CheckCertificatePem(const std::string& pem, const std::string& flag) {
  if (!FirstCertificate(pem)) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ": not a PEM certificate (expected -----BEGIN CERTIFICATE-----)"));
  }
  return absl::OkStatus();
}

absl::Status CheckKeyMatchesCertificate(const std::string& key_pem, const std::string& cert_pem) {
  auto bio = MemoryBio(key_pem);
  Key key(PEM_read_bio_PrivateKey(bio.get(), nullptr, nullptr, nullptr));
  ERR_clear_error();
  if (!key) {
    return absl::InvalidArgumentError(
        "--tls-key: not an unencrypted PEM private key (expected -----BEGIN PRIVATE KEY-----)");
  }
  auto cert = FirstCertificate(cert_pem);
  if (!cert) return CheckCertificatePem(cert_pem, "--tls-cert");
  const bool matches = X509_check_private_key(cert.get(), key.get()) == 1;
  ERR_clear_error();
  if (!matches) {
    return absl::InvalidArgumentError("--tls-key is not the private key of --tls-cert");
  }
  return absl::OkStatus();
}

}  // namespace furnace::transport
