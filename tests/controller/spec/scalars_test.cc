#include "controller/spec/scalars.h"

#include <gtest/gtest.h>

#include "controller/spec/suggest.h"

namespace furnace::spec {
namespace {

TEST(ParseSizeTest, AcceptsIntegersAndUnits) {
  EXPECT_EQ(*ParseSize("4096"), 4096u);
  EXPECT_EQ(*ParseSize("0"), 0u);
  EXPECT_EQ(*ParseSize("512MiB"), 512ull << 20);
  EXPECT_EQ(*ParseSize("1.5GB"), 1500000000ull);
  EXPECT_EQ(*ParseSize("4KiB"), 4096u);
  EXPECT_EQ(*ParseSize("4KB"), 4000u);
  EXPECT_EQ(*ParseSize("2MB"), 2000000u);
  EXPECT_EQ(*ParseSize("1GiB"), 1ull << 30);
  EXPECT_EQ(*ParseSize("7B"), 7u);
  EXPECT_EQ(*ParseSize("1 GiB"), 1ull << 30);
  EXPECT_EQ(*ParseSize("0.5KiB"), 512u);
  EXPECT_EQ(*ParseSize("16000000000GiB"), 16000000000ull << 30);
}

TEST(ParseSizeTest, RejectsBadSizes) {
  absl::StatusOr<uint64_t> bad_unit = ParseSize("4XB");
  ASSERT_FALSE(bad_unit.ok());
  EXPECT_NE(bad_unit.status().message().find("unknown size unit 'XB'"), std::string::npos)
      << bad_unit.status();
  EXPECT_FALSE(ParseSize("4kib").ok());  // units are case-sensitive
  EXPECT_FALSE(ParseSize("").ok());
  EXPECT_FALSE(ParseSize("MiB").ok());
  EXPECT_FALSE(ParseSize("1.5").ok());     // fractional bytes
  EXPECT_FALSE(ParseSize("0.3B").ok());    // fractional bytes
  EXPECT_FALSE(ParseSize("0.1KiB").ok());  // 102.4 bytes
  EXPECT_FALSE(ParseSize("-1KiB").ok());
  EXPECT_FALSE(ParseSize("1..5GB").ok());
  EXPECT_FALSE(ParseSize("20000000000GiB").ok());  // > uint64
  EXPECT_FALSE(ParseSize("99999999999999999999999").ok());
}

TEST(FormatSizeTest, PicksExactUnit) {
  EXPECT_EQ(FormatSize(4096), "4KiB");
  EXPECT_EQ(FormatSize(4ull << 20), "4MiB");
  EXPECT_EQ(FormatSize(1ull << 30), "1GiB");
  EXPECT_EQ(FormatSize(3000), "3KB");
  EXPECT_EQ(FormatSize(6), "6");
}

TEST(ParseIntegerTest, StrictDecimal) {
  EXPECT_EQ(ParseInteger("42")->magnitude, 42u);
  EXPECT_FALSE(ParseInteger("42")->negative);
  EXPECT_TRUE(ParseInteger("-2")->negative);
  EXPECT_EQ(ParseInteger("+7")->magnitude, 7u);
  EXPECT_EQ(ParseInteger("18446744073709551615")->magnitude, 18446744073709551615ull);
  EXPECT_EQ(ParseInteger("18446744073709551616").status().code(), absl::StatusCode::kOutOfRange);
  for (const char* bad : {"", "-", "1.5", "1e3", "true", "abc", "0x10", "1_000", " 1"}) {
    EXPECT_EQ(ParseInteger(bad).status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
}

TEST(ParseNumberTest, FiniteDecimalOnly) {
  EXPECT_DOUBLE_EQ(*ParseNumber("3e-4"), 3e-4);
  EXPECT_DOUBLE_EQ(*ParseNumber("0.5"), 0.5);
  EXPECT_DOUBLE_EQ(*ParseNumber(".5"), 0.5);
  EXPECT_DOUBLE_EQ(*ParseNumber("-1"), -1.0);
  EXPECT_DOUBLE_EQ(*ParseNumber("+2"), 2.0);
  for (const char* bad : {"", "inf", "nan", ".inf", "true", "1.0.0", "0x1p3", "1e999", "abc"}) {
    EXPECT_FALSE(ParseNumber(bad).ok()) << bad;
  }
  // A number a double cannot hold says so (it said "expected a number").
  EXPECT_EQ(ParseNumber("1e-400").status().message(),
            "too small: it would be 0 as a double (the smallest is about 2.2e-308)");
  EXPECT_EQ(ParseNumber("1e999").status().message(),
            "too large for a double (the largest is about 1.8e308)");
}

TEST(ParseBoolTest, OnlyTrueAndFalse) {
  EXPECT_TRUE(*ParseBool("true"));
  EXPECT_FALSE(*ParseBool("false"));
  for (const char* bad : {"yes", "no", "on", "True", "1", "0", ""}) {
    EXPECT_FALSE(ParseBool(bad).ok()) << bad;
  }
}

TEST(ClosestMatchTest, SuggestsPlausibleTypos) {
  const std::vector<std::string> keys = {"model", "parallel", "moe", "train"};
  EXPECT_EQ(ClosestMatch("modle", keys), "model");
  EXPECT_EQ(ClosestMatch("paralel", keys), "parallel");
  EXPECT_EQ(ClosestMatch("mo", keys), "moe");
  EXPECT_EQ(ClosestMatch("checkpoint", keys), "");
  EXPECT_EQ(ClosestMatch("x", keys), "");
}

}  // namespace
}  // namespace furnace::spec
