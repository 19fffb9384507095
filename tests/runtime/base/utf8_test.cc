#include "runtime/base/utf8.h"

#include <string>

#include "gtest/gtest.h"

namespace furnace {
namespace {

TEST(Utf8Test, ValidTextHasNoBadByte) {
  EXPECT_EQ(FirstInvalidUtf8(""), std::nullopt);
  EXPECT_EQ(FirstInvalidUtf8("name: demo\n"), std::nullopt);
  EXPECT_EQ(FirstInvalidUtf8("caf\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x94\xA5"), std::nullopt);
  EXPECT_EQ(FirstInvalidUtf8("\xF4\x8F\xBF\xBF"), std::nullopt);  // U+10FFFF
  EXPECT_EQ(FirstInvalidUtf8(std::string("a\0b", 3)), std::nullopt);
}

TEST(Utf8Test, ReportsTheOffsetOfTheFirstBadSequence) {
  EXPECT_EQ(FirstInvalidUtf8("abc\xFF"), 3u);               // never valid
  EXPECT_EQ(FirstInvalidUtf8("ab\x80"), 2u);                // continuation without a lead
  EXPECT_EQ(FirstInvalidUtf8("x\xC0\xAF"), 1u);             // overlong '/'
  EXPECT_EQ(FirstInvalidUtf8("\xE0\x80\xAF"), 0u);          // overlong, 3 bytes
  EXPECT_EQ(FirstInvalidUtf8("ok\xED\xA0\x80"), 2u);        // a surrogate
  EXPECT_EQ(FirstInvalidUtf8("\xF4\x90\x80\x80"), 0u);      // above U+10FFFF
  EXPECT_EQ(FirstInvalidUtf8("\xF5\x80\x80\x80"), 0u);      // lead beyond F4
  EXPECT_EQ(FirstInvalidUtf8("caf\xC3"), 3u);               // text ends inside a character
  EXPECT_EQ(FirstInvalidUtf8("\xE2\x82 x"), 0u);            // broken in the middle
  EXPECT_EQ(FirstInvalidUtf8("\xC3\xA9\xC3\xA9\xFE"), 4u);  // after valid multi-byte text
}

TEST(Utf8Test, SanitizeReplacesBadBytesAndCutsAtACharacter) {
  EXPECT_EQ(SanitizeUtf8("a\xFF\xFE"
                         "b",
                         100),
            "a??b");
  EXPECT_EQ(SanitizeUtf8("caf\xC3\xA9", 100), "caf\xC3\xA9");
  const std::string cut = SanitizeUtf8("\xC3\xA9\xC3\xA9\xC3\xA9\xC3\xA9", 6);
  EXPECT_EQ(cut, "\xC3\xA9...");
  EXPECT_EQ(FirstInvalidUtf8(cut), std::nullopt);
}

}  // namespace
}  // namespace furnace
