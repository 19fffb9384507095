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
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <memory>
#include <sstream>
#include <utility>

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

absl::StatusOr<CertificateDates> ReadCertificateDates(const std::string& pem,
                                                      const std::string& flag) {
  auto cert = FirstCertificate(pem);
  if (!cert) return CheckCertificatePem(pem, flag);
  CertificateDates dates;
  for (auto [time, out] : {std::pair{X509_get0_notBefore(cert.get()), &dates.not_before},
                           std::pair{X509_get0_notAfter(cert.get()), &dates.not_after}}) {
    std::tm tm{};
    if (time == nullptr || ASN1_TIME_to_tm(time, &tm) != 1) {
      ERR_clear_error();
      return absl::InvalidArgumentError(
          absl::StrCat(flag, ": the certificate's validity dates cannot be read"));
    }
    *out = static_cast<int64_t>(timegm(&tm));
  }
  return dates;
}

namespace {

std::string Utc(int64_t unix_seconds) {
  const auto t = static_cast<time_t>(unix_seconds);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char text[32];
  std::strftime(text, sizeof(text), "%Y-%m-%d %H:%M UTC", &tm);
  return text;
}

std::string Days(int64_t seconds) {
  const int64_t days = seconds / 86400;
  return days == 1 ? "1 day" : absl::StrCat(days, " days");
}

}  // namespace

std::string DescribeCertificateDates(const CertificateDates& dates) {
  return absl::StrCat("valid from ", Utc(dates.not_before), " until ", Utc(dates.not_after));
}

std::optional<std::string> CertificateDateProblem(const CertificateDates& dates, int64_t now,
                                                  const std::string& flag) {
  if (now > dates.not_after) {
    return absl::StrCat(flag, ": the certificate expired ", Days(now - dates.not_after), " ago (",
                        DescribeCertificateDates(dates),
                        "): the controller refuses it in the TLS handshake; renew it");
  }
  if (now < dates.not_before) {
    return absl::StrCat(flag, ": the certificate is not valid yet (",
                        DescribeCertificateDates(dates),
                        "): the controller refuses it in the TLS handshake until then; is this "
                        "machine's clock right?");
  }
  if (dates.not_after - now < kCertificateExpiryWarningS) {
    return absl::StrCat(flag, ": the certificate expires in ", Days(dates.not_after - now), " (",
                        DescribeCertificateDates(dates), "); renew it before then");
  }
  return std::nullopt;
}

absl::Status CheckSecretFileMode(const std::string& path, const std::string& flag) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    return absl::NotFoundError(
        absl::StrCat(flag, " ", path, ": cannot read the file (", std::strerror(errno), ")"));
  }
  const mode_t shared = st.st_mode & 077;
  if (shared == 0) return absl::OkStatus();
  // A Kubernetes Secret's file: root's, read-only to the pod's group (see the header).
  if (shared == 040 && st.st_uid != geteuid()) return absl::OkStatus();
  char mode[8];
  std::snprintf(mode, sizeof(mode), "%04o", static_cast<unsigned>(st.st_mode & 07777));
  return absl::PermissionDeniedError(
      absl::StrCat(flag, " ", path, ": mode ", mode,
                   " lets users other than its owner read or change the tokens in it; `chmod 600 ",
                   path, "` (readable and writable by its owner only)"));
}

}  // namespace furnace::transport
