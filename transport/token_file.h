// Bearer tokens. The controller's --token-file lists one token a line as `<token> <role> <name>`
// (role `admin`: submit, cancel and everything else; `read`: the read-only JobService methods;
// `#` starts a comment); the name is who the token stands for (the audit log's identity). A
// client's token file (the CLI's --token-file, the daemons' --join-token-file) holds the token as
// the first word of its first line that is not blank or a comment. Pure functions of the text,
// apart from the Read* wrappers that read a file first.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace furnace::transport {

enum class Role { kRead, kAdmin };

// "read" or "admin".
const char* RoleName(Role role);

struct TokenEntry {
  std::string token;
  Role role = Role::kRead;
  std::string name;
};

// Tokens are at least this many characters of printable ASCII (no spaces): a short token is a
// guessable one.
inline constexpr size_t kMinTokenLength = 16;

// Parses a controller token file. InvalidArgument names `source` (the flag and file) and the line:
// a line without three fields, an unknown role, a short or non-printable token, a token or name
// listed twice, or no token at all.
absl::StatusOr<std::vector<TokenEntry>> ParseTokenFile(absl::string_view text,
                                                       const std::string& source);
// Reads and parses the file; first PermissionDenied, naming `flag`, the file, its mode and
// `chmod 600`, when other users may read or change it (CheckSecretFileMode, pem_check.h).
absl::StatusOr<std::vector<TokenEntry>> ReadTokenFile(const std::string& path,
                                                      const std::string& flag);

// The token of a client token file (see above); InvalidArgument names `source` when there is none
// or it is not a valid token.
absl::StatusOr<std::string> ParseClientToken(absl::string_view text, const std::string& source);
// Reads and parses the file, refused as ReadTokenFile's when other users may read or change it.
absl::StatusOr<std::string> ReadClientToken(const std::string& path, const std::string& flag);

// A token as a string checks: at least kMinTokenLength printable non-space ASCII characters.
absl::Status CheckToken(absl::string_view token, const std::string& source);

}  // namespace furnace::transport
