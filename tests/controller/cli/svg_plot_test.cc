#include "controller/cli/svg_plot.h"

#include <cmath>

#include "gtest/gtest.h"
#include "tests/controller/cli/svg_test_util.h"

namespace furnace::cli {
namespace {

using testing::Count;
using testing::SeriesPoints;
using testing::XmlProblem;

TEST(NiceTicksTest, CoversTheRangeAtOneTwoFiveSpacing) {
  const Ticks t = NiceTicks(0.3, 9.7, 6);
  EXPECT_EQ(t.lo, 0);
  EXPECT_EQ(t.hi, 10);
  ASSERT_EQ(t.values.size(), 6u);
  EXPECT_DOUBLE_EQ(t.values[1], 2);
  const Ticks small = NiceTicks(2.05, 2.45, 5);
  EXPECT_LE(small.lo, 2.05);
  EXPECT_GE(small.hi, 2.45);
  EXPECT_NEAR(small.values[1] - small.values[0], 0.1, 1e-12);
}

TEST(NiceTicksTest, WidensAnEmptyRange) {
  const Ticks t = NiceTicks(5, 5);
  EXPECT_LT(t.lo, 5);
  EXPECT_GT(t.hi, 5);
  EXPECT_GE(t.values.size(), 2u);
}

TEST(FormatTickTest, ShortLabels) {
  EXPECT_EQ(FormatTick(0), "0");
  EXPECT_EQ(FormatTick(0.5), "0.5");
  EXPECT_EQ(FormatTick(250), "250");
  EXPECT_EQ(FormatTick(12000), "12k");
  EXPECT_EQ(FormatTick(2.5e6), "2.5M");
}

TEST(ScaleColorTest, EndsOfTheScale) {
  EXPECT_EQ(ScaleColor(0), "#440154");
  EXPECT_EQ(ScaleColor(1), "#fde725");
  EXPECT_EQ(ScaleColor(-3), ScaleColor(0));
  EXPECT_EQ(ScaleColor(NAN), ScaleColor(0));
}

TEST(RenderLinePlotTest, WellFormedWithEveryPointAndTheLines) {
  LinePlot plot;
  plot.title = "loss <&> \"quoted\"";
  plot.x_label = "step";
  plot.y_label = "loss (nats/token)";
  LineSeries a{"attempt 1", "#1f77b4", {}}, b{"attempt 2", "#d62728", {}};
  for (int i = 1; i <= 30; ++i) a.points.push_back({double(i), 3.0 / i});
  for (int i = 21; i <= 40; ++i) b.points.push_back({double(i), 3.0 / i});
  b.points.push_back({41, NAN});  // skipped
  plot.series = {a, b};
  plot.horizontal.push_back({"floor", 0.05, "#2ca02c", true});
  plot.vertical.push_back({"restart", 21, "#d62728", true});
  const std::string svg = RenderLinePlot(plot);
  EXPECT_EQ(XmlProblem(svg), "") << svg;
  EXPECT_EQ(SeriesPoints(svg), 50);
  EXPECT_EQ(Count(svg, "class=\"reference\""), 1);
  EXPECT_EQ(Count(svg, "class=\"marker\""), 1);
  EXPECT_NE(svg.find("loss &lt;&amp;&gt; &quot;quoted&quot;"), std::string::npos);
  EXPECT_NE(svg.find(">loss (nats/token)</text>"), std::string::npos);
  EXPECT_NE(svg.find(">attempt 2</text>"), std::string::npos);
}

TEST(RenderLinePlotTest, EmptyPlotIsStillADocument) {
  const std::string svg = RenderLinePlot(LinePlot{});
  EXPECT_EQ(XmlProblem(svg), "");
  EXPECT_EQ(SeriesPoints(svg), 0);
}

TEST(RenderHeatmapTest, OneCellPerRowAndColumnAndALegend) {
  Heatmap map;
  map.title = "imbalance";
  map.value_label = "max/mean";
  map.x_edges = {0, 10, 20, 30};
  map.row_labels = {"0", "1"};
  map.values = {{1.0, 1.5, NAN}, {2.0, 1.2, 1.1}};
  const std::string svg = RenderHeatmap(map);
  EXPECT_EQ(XmlProblem(svg), "") << svg;
  EXPECT_EQ(Count(svg, "class=\"cell\""), 6);
  EXPECT_EQ(Count(svg, "fill=\"#dddddd\""), 1);  // no data
  EXPECT_NE(svg.find("url(#scale)"), std::string::npos);
  EXPECT_NE(svg.find(">max/mean</text>"), std::string::npos);
}

TEST(XmlProblemTest, CatchesBrokenDocuments) {
  EXPECT_EQ(XmlProblem("<a><b/></a>"), "");
  EXPECT_NE(XmlProblem("<a><b></a>"), "");
  EXPECT_NE(XmlProblem("<a>x & y</a>"), "");
  EXPECT_NE(XmlProblem("<a/><b/>"), "");
  EXPECT_NE(XmlProblem("<a x=\"1></a>"), "");
}

}  // namespace
}  // namespace furnace::cli
