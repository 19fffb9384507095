// TokenizerIdentity and the SHA-256 helpers (tokenizer.h): the part of the tokenizer interface
// that needs no SentencePiece, so furnace_data (and the worker) can check a token file's tokenizer.
#include <openssl/evp.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>

#include "absl/strings/str_cat.h"
#include "runtime/base/file_error.h"
#include "runtime/base/status.h"
#include "runtime/data/byte_tokenizer.h"
#include "runtime/data/tokenizer.h"

namespace furnace::data {
namespace {

// An incremental SHA-256 (OpenSSL's EVP digest).
class Sha256 {
 public:
  Sha256() : ctx_(EVP_MD_CTX_new(), &EVP_MD_CTX_free) {
    EVP_DigestInit_ex(ctx_.get(), EVP_sha256(), nullptr);
  }
  void Update(const void* data, size_t n) { EVP_DigestUpdate(ctx_.get(), data, n); }
  std::string HexDigest() {
    unsigned char digest[EVP_MAX_MD_SIZE];
    unsigned int n = 0;
    EVP_DigestFinal_ex(ctx_.get(), digest, &n);
    static constexpr char kHex[] = "0123456789abcdef";
    std::string hex;
    for (unsigned int i = 0; i < n; ++i) {
      hex.push_back(kHex[digest[i] >> 4]);
      hex.push_back(kHex[digest[i] & 15]);
    }
    return hex;
  }

 private:
  std::unique_ptr<EVP_MD_CTX, void (*)(EVP_MD_CTX*)> ctx_;
};

}  // namespace

std::string Sha256Hex(absl::string_view bytes) {
  Sha256 sha;
  sha.Update(bytes.data(), bytes.size());
  return sha.HexDigest();
}

absl::StatusOr<std::string> Sha256OfFile(const std::string& path) {
  ASSIGN_OR_RETURN(const int fd, OpenRegularFile("", path));
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> f(::fdopen(fd, "rb"), &std::fclose);
  if (f == nullptr) {
    const int error = errno;
    ::close(fd);
    return CannotOpenError("", path, error);
  }
  Sha256 sha;
  std::vector<char> block(1 << 16);
  size_t got;
  while ((got = std::fread(block.data(), 1, block.size(), f.get())) > 0)
    sha.Update(block.data(), got);
  if (std::ferror(f.get()) != 0) {
    return UnreadableFileError(absl::StrCat(path, ": read error: ", std::strerror(errno)));
  }
  return sha.HexDigest();
}

absl::StatusOr<std::string> TokenizerIdentity(const std::string& path_or_byte) {
  if (path_or_byte == kByteTokenizerName) return std::string(kByteTokenizerName);
  absl::StatusOr<std::string> hash = Sha256OfFile(path_or_byte);
  if (!hash.ok()) {
    return absl::Status(hash.status().code(), absl::StrCat("tokenizer ", hash.status().message()));
  }
  return absl::StrCat("sentencepiece:", *hash);
}

}  // namespace furnace::data
