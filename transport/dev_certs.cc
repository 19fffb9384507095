#include "transport/dev_certs.h"

#include <arpa/inet.h>
#include <openssl/bn.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <memory>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "runtime/base/file_sync.h"
#include "runtime/base/status.h"
#include "transport/credentials.h"
#include "transport/openssl_ptr.h"
#include "transport/pem_check.h"

namespace furnace::transport {
namespace {

constexpr long kValiditySeconds = 365L * 24 * 3600;

absl::Status OpenSslError(const std::string& what) {
  return absl::InternalError(absl::StrCat("OpenSSL could not ", what));
}

absl::StatusOr<Key> NewKey() {
  Key key(EVP_EC_gen("P-256"));
  if (!key) return OpenSslError("make an EC P-256 key");
  return key;
}

absl::Status AddExtension(X509* cert, X509* issuer, int nid, const std::string& value) {
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, issuer, cert, nullptr, nullptr, 0);
  X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value.c_str());
  if (ext == nullptr) return OpenSslError(absl::StrCat("make the extension ", value));
  const int added = X509_add_ext(cert, ext, -1);
  X509_EXTENSION_free(ext);
  return added == 1 ? absl::OkStatus() : OpenSslError("add an extension");
}

// A certificate for `key` named `common_name`, signed by `issuer_key` (self-signed when `issuer`
// is null), with the extensions given as (nid, value).
absl::StatusOr<Cert> MakeCertificate(EVP_PKEY* key, const std::string& common_name, X509* issuer,
                                     EVP_PKEY* issuer_key,
                                     const std::vector<std::pair<int, std::string>>& extensions) {
  Cert cert(X509_new());
  if (!cert) return OpenSslError("allocate a certificate");
  X509_set_version(cert.get(), 2);
  unsigned char serial[16];
  if (RAND_bytes(serial, sizeof serial) != 1) return OpenSslError("draw a serial number");
  serial[0] &= 0x7f;  // positive
  BIGNUM* bn = BN_bin2bn(serial, sizeof serial, nullptr);
  BN_to_ASN1_INTEGER(bn, X509_get_serialNumber(cert.get()));
  BN_free(bn);
  X509_gmtime_adj(X509_getm_notBefore(cert.get()), -3600);  // tolerate clock skew
  X509_gmtime_adj(X509_getm_notAfter(cert.get()), kValiditySeconds);
  // Every field is checked: a certificate signed without its common name would lose what the
  // controller reads from it (a host's own worker certificate limits it to that host).
  X509_NAME* name = X509_get_subject_name(cert.get());
  if (X509_NAME_add_entry_by_txt(name, "O", MBSTRING_ASC,
                                 reinterpret_cast<const unsigned char*>("Furnace development"), -1,
                                 -1, 0) != 1) {
    return OpenSslError("set the organization");
  }
  if (X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC,
                                 reinterpret_cast<const unsigned char*>(common_name.c_str()), -1,
                                 -1, 0) != 1) {
    return OpenSslError(absl::StrCat("set the common name `", common_name, "`"));
  }
  X509* signer = issuer != nullptr ? issuer : cert.get();
  if (X509_set_issuer_name(cert.get(), X509_get_subject_name(signer)) != 1 ||
      X509_set_pubkey(cert.get(), key) != 1) {
    return OpenSslError("set the issuer and the key");
  }
  for (const auto& [nid, value] : extensions) {
    RETURN_IF_ERROR(AddExtension(cert.get(), signer, nid, value));
  }
  if (X509_sign(cert.get(), issuer_key, EVP_sha256()) == 0) return OpenSslError("sign");
  return cert;
}

template <typename WriteFn>
absl::StatusOr<std::string> ToPem(WriteFn write) {
  Bio bio(BIO_new(BIO_s_mem()));
  if (!bio || write(bio.get()) != 1) return OpenSslError("write PEM");
  char* data = nullptr;
  const long size = BIO_get_mem_data(bio.get(), &data);
  return std::string(data, static_cast<size_t>(size));
}

absl::StatusOr<std::string> KeyPem(EVP_PKEY* key) {
  return ToPem([key](BIO* bio) {
    return PEM_write_bio_PrivateKey(bio, key, nullptr, nullptr, 0, nullptr, nullptr);
  });
}

absl::StatusOr<std::string> CertPem(X509* cert) {
  return ToPem([cert](BIO* bio) { return PEM_write_bio_X509(bio, cert); });
}

absl::StatusOr<std::string> NewToken() {
  unsigned char bytes[24];
  if (RAND_bytes(bytes, sizeof bytes) != 1) return OpenSslError("draw a token");
  return absl::BytesToHexString(
      absl::string_view(reinterpret_cast<const char*>(bytes), sizeof bytes));
}

// "DNS:name" or "IP:address" for a --host value.
absl::StatusOr<std::string> SanEntry(const std::string& host) {
  in_addr v4{};
  in6_addr v6{};
  if (inet_pton(AF_INET, host.c_str(), &v4) == 1 || inet_pton(AF_INET6, host.c_str(), &v6) == 1) {
    return "IP:" + host;
  }
  const bool valid = !host.empty() && std::all_of(host.begin(), host.end(), [](char c) {
    return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '.' || c == '*';
  });
  if (!valid) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--host `", host, "`: not a DNS name (letters, digits, '-', '.') or an IP address"));
  }
  return "DNS:" + host;
}

}  // namespace

absl::StatusOr<std::vector<std::string>> WriteDevCerts(const DevCertsOptions& options) {
  namespace fs = std::filesystem;
  std::vector<std::string> san = {"DNS:localhost", "IP:127.0.0.1", "IP:::1"};
  for (const std::string& host : options.hosts) {
    ASSIGN_OR_RETURN(std::string entry, SanEntry(host));
    san.push_back(std::move(entry));
  }
  const fs::path dir(options.dir);
  std::vector<std::pair<std::string, std::string>> files;  // name, contents
  std::vector<mode_t> modes;
  const auto add = [&](const std::string& name, std::string text, mode_t mode) {
    files.emplace_back(name, std::move(text));
    modes.push_back(mode);
  };

  ASSIGN_OR_RETURN(Key ca_key, NewKey());
  ASSIGN_OR_RETURN(Cert ca,
                   MakeCertificate(ca_key.get(), "Furnace development CA", nullptr, ca_key.get(),
                                   {{NID_basic_constraints, "critical,CA:TRUE"},
                                    {NID_key_usage, "critical,keyCertSign,cRLSign"},
                                    {NID_subject_key_identifier, "hash"}}));
  ASSIGN_OR_RETURN(std::string ca_pem, CertPem(ca.get()));
  ASSIGN_OR_RETURN(std::string ca_key_pem, KeyPem(ca_key.get()));
  add("ca.pem", ca_pem, 0644);
  add("ca.key", ca_key_pem, 0600);

  struct Leaf {
    std::string file;
    std::string common_name;
    const char* usage;
    bool server;
  };
  std::vector<Leaf> leaves = {{"controller", "furnace-controller", "serverAuth,clientAuth", true},
                              {"worker", "furnace-worker", "clientAuth", false},
                              {"cli", "furnace-cli", "clientAuth", false}};
  for (const std::string& host : options.worker_hosts) {
    const bool valid = !host.empty() && std::all_of(host.begin(), host.end(), [](char c) {
      return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '.' || c == '_';
    });
    if (!valid) {
      return absl::InvalidArgumentError(
          absl::StrCat("--worker-host `", host,
                       "`: not a host name (letters, digits, '-', '.', '_'; the part of a worker "
                       "id before its '/')"));
    }
    // X.509 caps a common name at 64 characters, and the host goes into it after the prefix.
    if (host.size() > kMaxWorkerHostLength) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--worker-host `", host, "`: ", host.size(), " characters, at most ",
          kMaxWorkerHostLength, " (the certificate's common name is `", kWorkerCertPrefix,
          "<host>`, 64 characters at most); use the short host name as the worker id's host"));
    }
    leaves.push_back({absl::StrCat("worker-", host), absl::StrCat(kWorkerCertPrefix, host),
                      "clientAuth", false});
  }
  for (const Leaf& leaf : leaves) {
    ASSIGN_OR_RETURN(Key key, NewKey());
    std::vector<std::pair<int, std::string>> extensions = {
        {NID_basic_constraints, "critical,CA:FALSE"},
        {NID_key_usage, "critical,digitalSignature,keyAgreement"},
        {NID_ext_key_usage, leaf.usage},
        {NID_subject_key_identifier, "hash"},
        {NID_authority_key_identifier, "keyid"}};
    if (leaf.server) extensions.emplace_back(NID_subject_alt_name, absl::StrJoin(san, ","));
    ASSIGN_OR_RETURN(Cert cert, MakeCertificate(key.get(), leaf.common_name, ca.get(), ca_key.get(),
                                                extensions));
    ASSIGN_OR_RETURN(std::string cert_pem, CertPem(cert.get()));
    ASSIGN_OR_RETURN(std::string key_pem, KeyPem(key.get()));
    add(absl::StrCat(leaf.file, ".pem"), cert_pem, 0644);
    add(absl::StrCat(leaf.file, ".key"), key_pem, 0600);
  }

  ASSIGN_OR_RETURN(const std::string admin, NewToken());
  ASSIGN_OR_RETURN(const std::string read, NewToken());
  ASSIGN_OR_RETURN(const std::string join, NewToken());
  add("tokens",
      absl::StrCat("# furnace-controller --token-file: <token> <role> <name>\n", admin,
                   " admin admin\n", read, " read reader\n"),
      0600);
  add("admin.token", admin + "\n", 0600);
  add("read.token", read + "\n", 0600);
  add("join.token", join + "\n", 0600);

  std::vector<std::string> existing;
  for (const auto& [name, text] : files) {
    if (fs::exists(dir / name)) existing.push_back((dir / name).string());
  }
  if (!existing.empty() && !options.force) {
    return absl::FailedPreconditionError(
        absl::StrCat("will not overwrite ", absl::StrJoin(existing, ", "), " (pass --force)"));
  }
  std::error_code error;
  fs::create_directories(dir, error);
  if (error) return absl::InternalError(absl::StrCat(options.dir, ": ", error.message()));
  // Whoever else may write the directory could replace the CA or the tokens after they are made
  // (a directory another user made in a shared /tmp).
  struct stat st {};
  if (::stat(options.dir.c_str(), &st) != 0) {
    return absl::InternalError(absl::StrCat(options.dir, ": ", std::strerror(errno)));
  }
  if (st.st_uid != ::geteuid() || (st.st_mode & S_IWOTH) != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        options.dir, ": owned by uid ", st.st_uid, " with mode ",
        absl::StrFormat("%03o", st.st_mode & 0777),
        ": another user could replace the CA or the tokens written there; use a directory that "
        "is yours and not writable by everyone"));
  }
  std::vector<std::string> written;
  for (size_t i = 0; i < files.size(); ++i) {
    const std::string path = (dir / files[i].first).string();
    RETURN_IF_ERROR(WriteFileAtomically(path, files[i].second, modes[i]));  // keys 0600 at once
    written.push_back(path);
  }
  return written;
}

}  // namespace furnace::transport
