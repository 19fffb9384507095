#include "transport/token_file.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

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

}  // namespace
}  // namespace furnace::transport
