#include "runtime/base/log_text.h"

#include <string>
#include <utility>

#include "gtest/gtest.h"

namespace furnace {
namespace {

// What a submitted file name did to the controller's log before: cleared the screen, coloured a
// line and forged another (`\r\n`) that reads like an audit entry.
constexpr char kForged[] =
    "\x1b[2J\x1b[1;1H\x1b[32mall good\x1b[0m\r\nFAKE  admin  cancel  job-9  "
    "accepted\x1b]0;t\x07.yaml";

TEST(EscapeForLogTest, ControlCharactersStayOnTheLineAndPrintAsThemselves) {
  const std::string escaped = EscapeForLog(kForged);
  EXPECT_EQ(escaped,
            "\\x1b[2J\\x1b[1;1H\\x1b[32mall good\\x1b[0m\\r\\nFAKE  admin  cancel  job-9  "
            "accepted\\x1b]0;t\\x07.yaml");
  for (const char c : escaped) EXPECT_FALSE(c < 0x20 || c == 0x7f) << static_cast<int>(c);
  EXPECT_EQ(EscapeForLog("a\tb\x7f"), "a\\tb\\x7f");
  EXPECT_EQ(EscapeForLog(std::string("nul\0x", 5)), "nul\\x00x");
}

TEST(EscapeForLogTest, PrintableTextIsUnchanged) {
  EXPECT_EQ(EscapeForLog(""), "");
  EXPECT_EQ(EscapeForLog("data/train.bin: outside --data-root /srv"),
            "data/train.bin: outside --data-root /srv");
  EXPECT_EQ(EscapeForLog("caf\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x94\xA5 a\\nb"),
            "caf\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x94\xA5 a\\nb");
}

TEST(EscapeForLogTest, C1ControlsBidiOverridesAndBadBytesAreEscaped) {
  // (A hex escape in a literal runs on through hex digits: the text after one is a string of its
  // own.)
  const std::pair<std::string, std::string> cases[] = {
      {std::string("x\xC2\x9B") + "31m", "x\\u009b31m"},      // 8-bit CSI
      {std::string("a\xE2\x80\xAE") + "cba", "a\\u202ecba"},  // right-to-left override
      {"\xE2\x81\xA6x", "\\u2066x"},                          // left-to-right isolate
      {"ok\x9B\xFF", "ok\\x9b\\xff"},                         // not UTF-8
      {"caf\xC3", "caf\\xc3"},                                // ends inside a character
  };
  for (const auto& [text, escaped] : cases) EXPECT_EQ(EscapeForLog(text), escaped) << escaped;
}

TEST(PrintableBaseNameTest, KeepsThePrintableLastComponent) {
  EXPECT_EQ(PrintableBaseName("configs/demo.yaml", 255), "demo.yaml");
  EXPECT_EQ(PrintableBaseName("/abs/path/to/job.yaml", 255), "job.yaml");
  EXPECT_EQ(PrintableBaseName("job.yaml", 255), "job.yaml");
  EXPECT_EQ(PrintableBaseName("d/caf\xC3\xA9.yaml", 255), "caf\xC3\xA9.yaml");
  EXPECT_EQ(PrintableBaseName(kForged, 255),
            "?[2J?[1;1H?[32mall good?[0m??FAKE  admin  cancel  job-9  accepted?]0;t?.yaml");
  EXPECT_EQ(PrintableBaseName("a\xE2\x80\xAEz\xFF.yaml", 255), "a?z?.yaml");
  for (const char* nothing : {"", "dir/", ".", "..", "a/.."}) {
    EXPECT_EQ(PrintableBaseName(nothing, 255), "") << nothing;
  }
  const std::string cut = PrintableBaseName(std::string(1000, 'x') + ".yaml", 255);
  EXPECT_EQ(cut.size(), 255u);
  EXPECT_EQ(cut.substr(252), "...");
}

}  // namespace
}  // namespace furnace
