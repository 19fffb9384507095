#include "transport/token_file.h"

#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "runtime/base/status.h"
#include "transport/pem_check.h"

namespace furnace::transport {
namespace {

// The fields of a line, or none for a blank line or a comment. A comment is a field that starts
// with '#' and the rest of the line; a '#' inside a field is part of it (a token may hold one).
std::vector<absl::string_view> Fields(absl::string_view line) {
  std::vector<absl::string_view> fields;
  for (const absl::string_view field :
       absl::StrSplit(line, absl::ByAnyChar(" \t\r"), absl::SkipEmpty())) {
    if (absl::StartsWith(field, "#")) break;
    fields.push_back(field);
  }
  return fields;
}

}  // namespace

const char* RoleName(Role role) { return role == Role::kAdmin ? "admin" : "read"; }

absl::Status CheckToken(absl::string_view token, const std::string& source) {
  if (token.size() < kMinTokenLength) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": a token has at least ",
                                                   kMinTokenLength, " characters (this one ",
                                                   token.size(), ")"));
  }
  for (const char c : token) {
    if (c <= ' ' || c > '~') {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": a token is printable ASCII without spaces"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<TokenEntry>> ParseTokenFile(absl::string_view text,
                                                       const std::string& source) {
  std::vector<TokenEntry> entries;
  std::set<absl::string_view> tokens, names;
  int line_number = 0;
  for (const absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_number;
    const std::vector<absl::string_view> fields = Fields(line);
    if (fields.empty()) continue;
    const std::string where = absl::StrCat(source, " line ", line_number);
    if (fields.size() != 3) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": expected `<token> <role> <name>` (role admin or read), found ",
                       fields.size(), " fields"));
    }
    TokenEntry entry;
    RETURN_IF_ERROR(CheckToken(fields[0], where));
    entry.token = std::string(fields[0]);
    if (fields[1] == "admin") {
      entry.role = Role::kAdmin;
    } else if (fields[1] == "read") {
      entry.role = Role::kRead;
    } else {
      // Not quoted: with the columns out of order, the second field may be the token itself.
      return absl::InvalidArgumentError(
          absl::StrCat(where,
                       ": the second field is not a role (one of: admin, read); lines are `<token> "
                       "<role> <name>`"));
    }
    entry.name = std::string(fields[2]);
    if (!tokens.insert(fields[0]).second) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": this token is listed twice"));
    }
    if (!names.insert(fields[2]).second) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": the name `", fields[2], "` is listed twice"));
    }
    entries.push_back(std::move(entry));
  }
  if (entries.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": no token (lines are `<token> <role> <name>`)"));
  }
  return entries;
}

absl::StatusOr<std::vector<TokenEntry>> ReadTokenFile(const std::string& path,
                                                      const std::string& flag) {
  RETURN_IF_ERROR(CheckSecretFileMode(path, flag));
  ASSIGN_OR_RETURN(const std::string text, ReadFileForFlag(path, flag));
  return ParseTokenFile(text, absl::StrCat(flag, " ", path));
}

absl::StatusOr<std::string> ParseClientToken(absl::string_view text, const std::string& source) {
  for (const absl::string_view line : absl::StrSplit(text, '\n')) {
    const std::vector<absl::string_view> fields = Fields(line);
    if (fields.empty()) continue;
    RETURN_IF_ERROR(CheckToken(fields[0], source));
    return std::string(fields[0]);
  }
  return absl::InvalidArgumentError(absl::StrCat(source, ": no token in the file"));
}

absl::StatusOr<std::string> ReadClientToken(const std::string& path, const std::string& flag) {
  RETURN_IF_ERROR(CheckSecretFileMode(path, flag));
  ASSIGN_OR_RETURN(const std::string text, ReadFileForFlag(path, flag));
  return ParseClientToken(text, absl::StrCat(flag, " ", path));
}

}  // namespace furnace::transport
