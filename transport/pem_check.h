// Reads and checks the PEM files named by the --tls-* flags with OpenSSL, so a missing, unreadable
// or mismatched file is an error naming the flag at start rather than a failed handshake later;
// and writes key and token files with the mode they need.
#pragma once

#include <sys/types.h>

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

}  // namespace furnace::transport
