// A small, self-contained SVG plotter for `furnace report`: line plots (several series, horizontal
// reference lines, vertical markers) and heatmaps with a colour legend. Axes get "nice" ticks
// (1, 2, 5 x 10^k), labels and a title; the output is a standalone SVG 1.1 document that browsers
// and converters (rsvg, ImageMagick) render the same.
//
// Every polyline carries class="series" and every heatmap cell class="cell" so tests can count
// what was drawn. Non-finite points are skipped. Pure functions of their arguments; thread-safe.
#pragma once

#include <string>
#include <vector>

namespace furnace::cli {

struct PlotPoint {
  double x = 0;
  double y = 0;
};

struct LineSeries {
  std::string name;               // legend entry ("" = not in the legend)
  std::string color;              // any SVG colour
  std::vector<PlotPoint> points;  // drawn in order as one polyline
};

struct ReferenceLine {
  std::string label;
  double value = 0;  // y for a horizontal line, x for a vertical one
  std::string color = "#555555";
  bool dashed = true;
};

struct LinePlot {
  std::string title;
  std::string x_label;  // with its unit: "step"
  std::string y_label;  // with its unit: "loss (nats/token)"
  std::vector<LineSeries> series;
  std::vector<ReferenceLine> horizontal;  // e.g. the entropy floor, a memory budget
  std::vector<ReferenceLine> vertical;    // e.g. restarts
  bool y_from_zero = false;               // include 0 in the y range
};

struct Heatmap {
  std::string title;
  std::string x_label;
  std::string y_label;
  std::string value_label;                  // the legend's caption, with its unit
  std::vector<double> x_edges;              // columns + 1 ascending edges
  std::vector<std::string> row_labels;      // bottom row first
  std::vector<std::vector<double>> values;  // [row][column]; non-finite = no data (grey)
  std::vector<ReferenceLine> vertical;
};

// "0", "0.5", "12", "1.5k", "2.4M", "1e-05": short labels for tick values.
std::string FormatTick(double value);

// Ticks covering [lo, hi] at a 1/2/5 x 10^k spacing, about `target` of them, and the range
// widened to the outer ticks.
struct Ticks {
  double lo = 0;
  double hi = 1;
  std::vector<double> values;
};
Ticks NiceTicks(double lo, double hi, int target = 6);

// The colour for t in [0, 1] on a perceptually ordered scale (dark blue -> yellow), "#rrggbb".
std::string ScaleColor(double t);

std::string RenderLinePlot(const LinePlot& plot);
std::string RenderHeatmap(const Heatmap& map);

}  // namespace furnace::cli
