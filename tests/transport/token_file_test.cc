#include "transport/token_file.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "transport/pem_check.h"

namespace furnace::transport {
namespace {

using ::testing::HasSubstr;

constexpr char kAdmin[] = "0123456789abcdef0123";
constexpr char kRead[] = "fedcba9876543210fedc";

TEST(ParseTokenFile, ReadsRolesAndNamesSkippingCommentsAndBlankLines) {
  const std::string text = std::string("# tokens\n\n") + kAdmin + " admin alice  # ops\n" + kRead +
                           "\tread  grafana\r\n";
  auto entries = ParseTokenFile(text, "--token-file t");
  ASSERT_TRUE(entries.ok()) << entries.status();
  ASSERT_EQ(entries->size(), 2u);
  EXPECT_EQ((*entries)[0].token, kAdmin);
  EXPECT_EQ((*entries)[0].role, Role::kAdmin);
  EXPECT_EQ((*entries)[0].name, "alice");
  EXPECT_EQ((*entries)[1].role, Role::kRead);
  EXPECT_EQ((*entries)[1].name, "grafana");
}

TEST(ParseTokenFile, ErrorsNameTheFileLineAndAllowedValues) {
  auto bad_role = ParseTokenFile(std::string(kAdmin) + " root alice\n", "--token-file t");
  EXPECT_EQ(bad_role.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad_role.status().message(), HasSubstr("--token-file t line 1"));
  EXPECT_THAT(bad_role.status().message(), HasSubstr("admin, read"));
  // Columns out of order: the token in the role's place is not echoed into the error.
  auto swapped = ParseTokenFile(std::string("ci-pipeline-deployer ") + kAdmin + " admin\n", "f");
  EXPECT_THAT(swapped.status().message(), HasSubstr("not a role"));
  EXPECT_THAT(swapped.status().message(), ::testing::Not(HasSubstr(kAdmin)));

  auto fields = ParseTokenFile(std::string("\n") + kAdmin + " admin\n", "f");
  EXPECT_THAT(fields.status().message(), HasSubstr("f line 2"));
  EXPECT_THAT(fields.status().message(), HasSubstr("<token> <role> <name>"));

  EXPECT_THAT(ParseTokenFile("short admin alice\n", "f").status().message(),
              HasSubstr("at least 16"));
  EXPECT_THAT(ParseTokenFile(std::string(kAdmin) + " admin a\n" + kAdmin + " read b\n", "f")
                  .status()
                  .message(),
              HasSubstr("listed twice"));
  EXPECT_THAT(ParseTokenFile(std::string(kAdmin) + " admin a\n" + kRead + " read a\n", "f")
                  .status()
                  .message(),
              HasSubstr("`a` is listed twice"));
  EXPECT_THAT(ParseTokenFile("# nothing\n", "f").status().message(), HasSubstr("no token"));
}

// A comment starts a field; a '#' inside a token is the token's (CheckToken allows it).
TEST(ParseTokenFile, AHashInsideATokenIsPartOfIt) {
  const std::string hashed = "abcdefghijklmnopq#rs";
  auto entries = ParseTokenFile(hashed + " admin alice #comment\n", "f");
  ASSERT_TRUE(entries.ok()) << entries.status();
  EXPECT_EQ((*entries)[0].token, hashed);
  auto client = ParseClientToken(hashed + "\n", "f");
  ASSERT_TRUE(client.ok()) << client.status();
  EXPECT_EQ(*client, hashed);
}

TEST(ParseClientToken, TakesTheFirstWordOfTheFirstLineThatIsNotAComment) {
  auto token = ParseClientToken(std::string("# mine\n  ") + kRead + "  \n", "--token-file f");
  ASSERT_TRUE(token.ok()) << token.status();
  EXPECT_EQ(*token, kRead);
  EXPECT_THAT(ParseClientToken("\n# none\n", "--token-file f").status().message(),
              HasSubstr("--token-file f: no token"));
  EXPECT_FALSE(ParseClientToken("tooshort\n", "f").ok());
}

TEST(CheckToken, RefusesNonPrintableCharacters) {
  EXPECT_TRUE(CheckToken(kAdmin, "x").ok());
  EXPECT_THAT(CheckToken("0123456789abcdef\x01", "FURNACE_TOKEN").message(),
              HasSubstr("FURNACE_TOKEN: a token is printable ASCII"));
}

TEST(ReadTokenFile, AMissingFileNamesTheFlag) {
  auto missing = ReadTokenFile("/nonexistent/tokens", "--token-file");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);  // unreadable, not malformed
  EXPECT_THAT(missing.status().message(), HasSubstr("--token-file /nonexistent/tokens"));
}

// A token file other users may read hands them its tokens: refused, naming the file, its mode
// and the fix. The one allowed exception is a Kubernetes Secret's file (root's, 0440, read through
// the pod's group).
TEST(ReadTokenFile, AFileOtherUsersMayReadIsRefused) {
  const std::string dir = ::testing::TempDir() + "/token_mode_" + std::to_string(getpid());
  std::filesystem::create_directories(dir);
  const std::string tokens = dir + "/tokens", client = dir + "/admin.token";
  std::ofstream(tokens) << kAdmin << " admin alice\n";
  std::ofstream(client) << kAdmin << "\n";
  for (const mode_t mode : {0644, 0640, 0604, 0620, 0660, 0666}) {
    for (const std::string& path : {tokens, client}) {
      ASSERT_EQ(chmod(path.c_str(), mode), 0);
    }
    char shown[8];
    std::snprintf(shown, sizeof(shown), "%04o", static_cast<unsigned>(mode));
    const absl::Status server = ReadTokenFile(tokens, "--token-file").status();
    EXPECT_EQ(server.code(), absl::StatusCode::kPermissionDenied) << shown;
    EXPECT_THAT(server.message(), HasSubstr(absl::StrCat("--token-file ", tokens, ": mode ", shown,
                                                         " lets users other than its owner")));
    EXPECT_THAT(server.message(), HasSubstr(absl::StrCat("`chmod 600 ", tokens, "`")));
    const absl::Status cli = ReadClientToken(client, "--token-file").status();
    EXPECT_EQ(cli.code(), absl::StatusCode::kPermissionDenied) << shown;
  }
  for (const mode_t mode : {0600, 0400}) {
    ASSERT_EQ(chmod(tokens.c_str(), mode), 0);
    ASSERT_EQ(chmod(client.c_str(), mode), 0);
    EXPECT_TRUE(ReadTokenFile(tokens, "--token-file").ok());
    EXPECT_TRUE(ReadClientToken(client, "--token-file").ok());
  }
  // Group-readable is refused on the caller's own file (chmod it), allowed on a file another user
  // owns: a Secret's file, root:fsGroup 0440. Only root can make one here.
  ASSERT_EQ(chmod(tokens.c_str(), 0440), 0);
  EXPECT_EQ(ReadTokenFile(tokens, "--token-file").status().code(),
            absl::StatusCode::kPermissionDenied);
  if (geteuid() == 0) {
    ASSERT_EQ(chown(tokens.c_str(), 65534, 0), 0);
    EXPECT_TRUE(CheckSecretFileMode(tokens, "--token-file").ok());
    ASSERT_EQ(chmod(tokens.c_str(), 0444), 0);  // but not to everyone
    EXPECT_EQ(CheckSecretFileMode(tokens, "--token-file").code(),
              absl::StatusCode::kPermissionDenied);
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace furnace::transport
