// Reads and checks the PEM files named by the --tls-* flags with OpenSSL, so a missing, unreadable
// or mismatched file is an error naming the flag at start rather than a failed handshake later; an
// expired certificate is said at start too; and checks that a file of secrets (a token file) is
// kept from other users.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"

namespace furnace::transport {

// The whole file at `path`; NotFound names `flag`, the path and the reason when it cannot be read
// (missing, or not readable by this user).
absl::StatusOr<std::string> ReadFileForFlag(const std::string& path, const std::string& flag);

// `pem` holds at least one X.509 certificate (`flag` names the source in the error).
absl::Status CheckCertificatePem(const std::string& pem, const std::string& flag);

// `key_pem` is a private key that belongs to the first certificate of `cert_pem`.
absl::Status CheckKeyMatchesCertificate(const std::string& key_pem, const std::string& cert_pem);

// The validity period of the first certificate in `pem`, in unix seconds.
struct CertificateDates {
  int64_t not_before = 0;
  int64_t not_after = 0;
};
absl::StatusOr<CertificateDates> ReadCertificateDates(const std::string& pem,
                                                      const std::string& flag);

// "valid from 2026-12-06 14:07 UTC until 2027-12-06 14:07 UTC".
std::string DescribeCertificateDates(const CertificateDates& dates);

// What an operator must hear about a certificate's dates at `now` (unix seconds), naming `flag`:
// it has expired, is not valid yet, or expires within kCertificateExpiryWarningS; nullopt when
// none. Judged by this machine's clock, which the peer's may differ from: a warning, not a refusal.
inline constexpr int64_t kCertificateExpiryWarningS = 14 * 86400;
std::optional<std::string> CertificateDateProblem(const CertificateDates& dates, int64_t now,
                                                  const std::string& flag);

// A file that holds secrets (a token file) must not be readable or writable by other users:
// PermissionDenied naming `flag`, the file, its mode and `chmod 600` when its mode has any of the
// group or other bits (mode & 077). One form is allowed: read-only for the group (0440 or 0040
// plus the owner's bits) on a file another user owns, which is how the file of a Kubernetes Secret
// reaches a container's user (owned by root, group the pod's fsGroup: deploy/k8s); the file's
// owner chose that group. NotFound when the file cannot be examined.
absl::Status CheckSecretFileMode(const std::string& path, const std::string& flag);

}  // namespace furnace::transport
