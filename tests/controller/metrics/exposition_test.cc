#include "controller/metrics/exposition.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

namespace furnace::controller::metrics {
namespace {

TEST(FormatValue, IntegersPrintExactly) {
  EXPECT_EQ(FormatValue(0), "0");
  EXPECT_EQ(FormatValue(-0.0), "0");
  EXPECT_EQ(FormatValue(3), "3");
  EXPECT_EQ(FormatValue(-17), "-17");
  EXPECT_EQ(FormatValue(1e15), "1000000000000000");
  EXPECT_EQ(FormatValue(8589934592.0), "8589934592");
  EXPECT_EQ(FormatValue(9007199254740991.0), "9007199254740991");
}

TEST(FormatValue, FractionsRoundTrip) {
  EXPECT_EQ(FormatValue(0.1), "0.1");
  EXPECT_EQ(FormatValue(0.375), "0.375");
  EXPECT_EQ(FormatValue(1e-9), "1e-09");
  for (double v : {0.1 + 0.2, 1.0 / 3.0, 2.718281828459045, 6.02214076e23, 1e300}) {
    EXPECT_EQ(std::stod(FormatValue(v)), v) << FormatValue(v);
  }
}

TEST(FormatValue, NanAndInfinities) {
  EXPECT_EQ(FormatValue(std::numeric_limits<double>::quiet_NaN()), "NaN");
  EXPECT_EQ(FormatValue(std::numeric_limits<double>::infinity()), "+Inf");
  EXPECT_EQ(FormatValue(-std::numeric_limits<double>::infinity()), "-Inf");
}

TEST(Escape, LabelValuesEscapeBackslashQuoteAndNewline) {
  EXPECT_EQ(EscapeLabelValue("plain"), "plain");
  EXPECT_EQ(EscapeLabelValue("a\\b\"c\nd"), "a\\\\b\\\"c\\nd");
}

TEST(Escape, HelpEscapesBackslashAndNewlineButNotQuotes) {
  EXPECT_EQ(EscapeHelp("say \"hi\"\\\nbye"), "say \"hi\"\\\\\\nbye");
}

TEST(Exposition, FamiliesInOrderSamplesContiguousEmptyOmitted) {
  Exposition x;
  MetricFamily* b = x.Add("b_total", MetricType::kCounter, "B things.");
  MetricFamily* empty = x.Add("empty", MetricType::kGauge, "Never set.");
  MetricFamily* a = x.Add("a", MetricType::kGauge, "A \\ thing.\nSecond line.");
  a->Add({{"k", "x\"y"}}, 1.5);
  b->Add({}, uint64_t{18446744073709551615ull});
  a->Add({{"k", "z"}, {"j", "w"}}, std::numeric_limits<double>::quiet_NaN());
  b->Add({{"k", "2"}}, 2.0);
  EXPECT_TRUE(empty->empty());
  EXPECT_EQ(x.Render(),
            "# HELP b_total B things.\n"
            "# TYPE b_total counter\n"
            "b_total 18446744073709551615\n"
            "b_total{k=\"2\"} 2\n"
            "# HELP a A \\\\ thing.\\nSecond line.\n"
            "# TYPE a gauge\n"
            "a{k=\"x\\\"y\"} 1.5\n"
            "a{k=\"z\",j=\"w\"} NaN\n");
}

TEST(Exposition, NothingAddedRendersNothing) {
  Exposition x;
  x.Add("a", MetricType::kGauge, "A.");
  EXPECT_EQ(x.Render(), "");
}

}  // namespace
}  // namespace furnace::controller::metrics
