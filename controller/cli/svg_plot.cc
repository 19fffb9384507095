#include "controller/cli/svg_plot.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace furnace::cli {
namespace {

constexpr double kWidth = 900;
constexpr double kHeight = 420;
constexpr double kTop = 44;
constexpr double kBottom = 56;
constexpr double kLeft = 84;

std::string Escape(const std::string& text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string Num(double v) { return absl::StrFormat("%.1f", v); }

// Maps data coordinates onto the plot area.
struct Frame {
  double x0, x1, y0, y1;  // pixels: left, right, top, bottom
  Ticks xt, yt;
  double X(double x) const { return x0 + (x - xt.lo) / (xt.hi - xt.lo) * (x1 - x0); }
  double Y(double y) const { return y1 - (y - yt.lo) / (yt.hi - yt.lo) * (y1 - y0); }
};

std::string Header(const std::string& title) {
  return absl::StrCat(
      "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
      "<svg xmlns=\"http://www.w3.org/2000/svg\" version=\"1.1\" width=\"",
      kWidth, "\" height=\"", kHeight, "\" viewBox=\"0 0 ", kWidth, " ", kHeight,
      "\" font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\" font-size=\"12\">\n",
      "<rect width=\"100%\" height=\"100%\" fill=\"#ffffff\"/>\n", "<text class=\"title\" x=\"",
      Num(kWidth / 2),
      "\" y=\"26\" text-anchor=\"middle\" "
      "font-size=\"16\" font-weight=\"bold\">",
      Escape(title), "</text>\n");
}

// Axes, ticks, axis labels and (for line plots) a grid; the heatmap labels its rows itself.
std::string Axes(const Frame& f, const std::string& x_label, const std::string& y_label,
                 bool line_plot = true) {
  std::string s = "<g class=\"axes\">\n";
  for (double v : f.xt.values) {
    const double x = f.X(v);
    if (line_plot) {
      absl::StrAppend(&s, "<line x1=\"", Num(x), "\" y1=\"", Num(f.y0), "\" x2=\"", Num(x),
                      "\" y2=\"", Num(f.y1), "\" stroke=\"#e6e6e6\"/>\n");
    }
    absl::StrAppend(&s, "<line x1=\"", Num(x), "\" y1=\"", Num(f.y1), "\" x2=\"", Num(x),
                    "\" y2=\"", Num(f.y1 + 5), "\" stroke=\"#333333\"/>\n");
    absl::StrAppend(&s, "<text x=\"", Num(x), "\" y=\"", Num(f.y1 + 18),
                    "\" text-anchor=\"middle\">", Escape(FormatTick(v)), "</text>\n");
  }
  if (line_plot) {
    for (double v : f.yt.values) {
      const double y = f.Y(v);
      absl::StrAppend(&s, "<line x1=\"", Num(f.x0), "\" y1=\"", Num(y), "\" x2=\"", Num(f.x1),
                      "\" y2=\"", Num(y), "\" stroke=\"#e6e6e6\"/>\n");
      absl::StrAppend(&s, "<line x1=\"", Num(f.x0 - 5), "\" y1=\"", Num(y), "\" x2=\"", Num(f.x0),
                      "\" y2=\"", Num(y), "\" stroke=\"#333333\"/>\n");
      absl::StrAppend(&s, "<text x=\"", Num(f.x0 - 8), "\" y=\"", Num(y + 4),
                      "\" text-anchor=\"end\">", Escape(FormatTick(v)), "</text>\n");
    }
  }
  absl::StrAppend(&s, "<rect x=\"", Num(f.x0), "\" y=\"", Num(f.y0), "\" width=\"",
                  Num(f.x1 - f.x0), "\" height=\"", Num(f.y1 - f.y0),
                  "\" fill=\"none\" stroke=\"#333333\"/>\n");
  absl::StrAppend(&s, "<text class=\"xlabel\" x=\"", Num((f.x0 + f.x1) / 2), "\" y=\"",
                  Num(kHeight - 14), "\" text-anchor=\"middle\" font-size=\"13\">", Escape(x_label),
                  "</text>\n");
  const double yc = (f.y0 + f.y1) / 2;
  absl::StrAppend(&s, "<text class=\"ylabel\" x=\"18\" y=\"", Num(yc),
                  "\" text-anchor=\"middle\" font-size=\"13\" transform=\"rotate(-90 18 ", Num(yc),
                  ")\">", Escape(y_label), "</text>\n");
  s += "</g>\n";
  return s;
}

std::string VerticalMarkers(const Frame& f, const std::vector<ReferenceLine>& lines) {
  std::string s;
  for (const ReferenceLine& l : lines) {
    if (!std::isfinite(l.value) || l.value < f.xt.lo || l.value > f.xt.hi) continue;
    const double x = f.X(l.value);
    absl::StrAppend(&s, "<line class=\"marker\" x1=\"", Num(x), "\" y1=\"", Num(f.y0), "\" x2=\"",
                    Num(x), "\" y2=\"", Num(f.y1), "\" stroke=\"", l.color,
                    "\" stroke-width=\"1.5\"", l.dashed ? " stroke-dasharray=\"6 4\"" : "", "/>\n");
    absl::StrAppend(&s, "<text x=\"", Num(x + 4), "\" y=\"", Num(f.y0 + 14), "\" fill=\"", l.color,
                    "\" font-size=\"11\">", Escape(l.label), "</text>\n");
  }
  return s;
}

}  // namespace

std::string FormatTick(double v) {
  if (v == 0 || !std::isfinite(v)) return "0";
  const double a = std::fabs(v);
  static constexpr std::array<std::pair<double, const char*>, 4> kSi = {
      {{1e12, "T"}, {1e9, "G"}, {1e6, "M"}, {1e3, "k"}}};
  if (a >= 1e4) {
    for (const auto& [scale, suffix] : kSi) {
      if (a >= scale) return absl::StrCat(absl::StrFormat("%.4g", v / scale), suffix);
    }
  }
  if (a < 1e-3) return absl::StrFormat("%.2g", v);
  return absl::StrFormat("%.4g", v);
}

Ticks NiceTicks(double lo, double hi, int target) {
  Ticks t;
  if (!std::isfinite(lo) || !std::isfinite(hi)) lo = 0, hi = 1;
  if (lo > hi) std::swap(lo, hi);
  if (hi - lo < 1e-12 * std::max(1.0, std::fabs(hi))) {
    const double pad = lo == 0 ? 1 : std::fabs(lo) * 0.1;
    lo -= pad;
    hi += pad;
  }
  const double raw = (hi - lo) / std::max(1, target - 1);
  const double mag = std::pow(10, std::floor(std::log10(raw)));
  const double frac = raw / mag;
  constexpr double kSlack = 1 + 1e-9;  // 0.4 / 4 is 0.10000000000000009
  const double step = (frac <= kSlack       ? 1
                       : frac <= 2 * kSlack ? 2
                       : frac <= 5 * kSlack ? 5
                                            : 10) *
                      mag;
  t.lo = std::floor(lo / step + 1e-9) * step;
  t.hi = std::ceil(hi / step - 1e-9) * step;
  for (double v = t.lo; v <= t.hi + step * 1e-6; v += step) {
    t.values.push_back(std::fabs(v) < step * 1e-9 ? 0 : v);
  }
  return t;
}

std::string ScaleColor(double t) {
  // Viridis at nine stops, interpolated linearly.
  static constexpr std::array<std::array<double, 3>, 9> kStops = {{{68, 1, 84},
                                                                   {71, 44, 122},
                                                                   {59, 81, 139},
                                                                   {44, 113, 142},
                                                                   {33, 144, 141},
                                                                   {39, 173, 129},
                                                                   {92, 200, 99},
                                                                   {170, 220, 50},
                                                                   {253, 231, 37}}};
  if (!std::isfinite(t)) t = 0;
  t = std::clamp(t, 0.0, 1.0) * (kStops.size() - 1);
  const size_t i = std::min(static_cast<size_t>(t), kStops.size() - 2);
  const double u = t - static_cast<double>(i);
  std::array<int, 3> rgb{};
  for (int c = 0; c < 3; ++c) {
    rgb[c] = static_cast<int>(std::lround(kStops[i][c] * (1 - u) + kStops[i + 1][c] * u));
  }
  return absl::StrFormat("#%02x%02x%02x", rgb[0], rgb[1], rgb[2]);
}

std::string RenderLinePlot(const LinePlot& plot) {
  double xlo = std::numeric_limits<double>::infinity(), xhi = -xlo, ylo = xlo, yhi = -xlo;
  for (const LineSeries& s : plot.series) {
    for (const PlotPoint& p : s.points) {
      if (!std::isfinite(p.x) || !std::isfinite(p.y)) continue;
      xlo = std::min(xlo, p.x), xhi = std::max(xhi, p.x);
      ylo = std::min(ylo, p.y), yhi = std::max(yhi, p.y);
    }
  }
  for (const ReferenceLine& l : plot.horizontal) {
    if (std::isfinite(l.value)) ylo = std::min(ylo, l.value), yhi = std::max(yhi, l.value);
  }
  for (const ReferenceLine& l : plot.vertical) {
    if (std::isfinite(l.value)) xlo = std::min(xlo, l.value), xhi = std::max(xhi, l.value);
  }
  if (!std::isfinite(xlo)) xlo = 0, xhi = 1;
  if (!std::isfinite(ylo)) ylo = 0, yhi = 1;
  if (plot.y_from_zero) ylo = std::min(ylo, 0.0), yhi = std::max(yhi, 0.0);

  Frame f{
      kLeft, kWidth - 30, kTop, kHeight - kBottom, NiceTicks(xlo, xhi, 8), NiceTicks(ylo, yhi, 6)};
  std::string s = Header(plot.title);
  s += Axes(f, plot.x_label, plot.y_label);
  absl::StrAppend(&s, "<clipPath id=\"plot\"><rect x=\"", Num(f.x0), "\" y=\"", Num(f.y0),
                  "\" width=\"", Num(f.x1 - f.x0), "\" height=\"", Num(f.y1 - f.y0),
                  "\"/></clipPath>\n<g clip-path=\"url(#plot)\">\n");
  for (const ReferenceLine& l : plot.horizontal) {
    if (!std::isfinite(l.value)) continue;
    const double y = f.Y(l.value);
    absl::StrAppend(&s, "<line class=\"reference\" x1=\"", Num(f.x0), "\" y1=\"", Num(y),
                    "\" x2=\"", Num(f.x1), "\" y2=\"", Num(y), "\" stroke=\"", l.color,
                    "\" stroke-width=\"1.5\"", l.dashed ? " stroke-dasharray=\"6 4\"" : "", "/>\n");
  }
  for (const LineSeries& series : plot.series) {
    std::string points;
    for (const PlotPoint& p : series.points) {
      if (!std::isfinite(p.x) || !std::isfinite(p.y)) continue;
      absl::StrAppend(&points, points.empty() ? "" : " ", Num(f.X(p.x)), ",", Num(f.Y(p.y)));
    }
    if (points.empty()) continue;
    absl::StrAppend(&s, "<polyline class=\"series\" fill=\"none\" stroke=\"", series.color,
                    "\" stroke-width=\"1.6\" stroke-linejoin=\"round\" points=\"", points,
                    "\"/>\n");
  }
  s += "</g>\n";
  s += VerticalMarkers(f, plot.vertical);

  // Legend: top right inside the plot, one row per named series and horizontal line.
  struct Entry {
    std::string label, color;
    bool dashed;
  };
  std::vector<Entry> entries;
  for (const LineSeries& series : plot.series) {
    if (!series.name.empty()) entries.push_back({series.name, series.color, false});
  }
  for (const ReferenceLine& l : plot.horizontal) {
    if (!l.label.empty()) entries.push_back({l.label, l.color, l.dashed});
  }
  if (!entries.empty()) {
    size_t longest = 0;
    for (const Entry& e : entries) longest = std::max(longest, e.label.size());
    const double w = 40 + 6.8 * static_cast<double>(longest);
    const double h = 8 + 18 * static_cast<double>(entries.size());
    const double lx = f.x1 - w - 8, ly = f.y0 + 22;
    absl::StrAppend(&s, "<g class=\"legend\"><rect x=\"", Num(lx), "\" y=\"", Num(ly),
                    "\" width=\"", Num(w), "\" height=\"", Num(h),
                    "\" fill=\"#ffffff\" fill-opacity=\"0.85\" stroke=\"#cccccc\"/>\n");
    for (size_t i = 0; i < entries.size(); ++i) {
      const double y = ly + 16 + 18 * static_cast<double>(i);
      absl::StrAppend(&s, "<line x1=\"", Num(lx + 8), "\" y1=\"", Num(y - 4), "\" x2=\"",
                      Num(lx + 30), "\" y2=\"", Num(y - 4), "\" stroke=\"", entries[i].color,
                      "\" stroke-width=\"2\"", entries[i].dashed ? " stroke-dasharray=\"6 4\"" : "",
                      "/>\n");
      absl::StrAppend(&s, "<text x=\"", Num(lx + 36), "\" y=\"", Num(y), "\">",
                      Escape(entries[i].label), "</text>\n");
    }
    s += "</g>\n";
  }
  s += "</svg>\n";
  return s;
}

std::string RenderHeatmap(const Heatmap& map) {
  const size_t rows = map.values.size();
  const size_t cols = map.x_edges.size() >= 2 ? map.x_edges.size() - 1 : 0;
  double vlo = std::numeric_limits<double>::infinity(), vhi = -vlo;
  for (const auto& row : map.values) {
    for (double v : row) {
      if (std::isfinite(v)) vlo = std::min(vlo, v), vhi = std::max(vhi, v);
    }
  }
  if (!std::isfinite(vlo)) vlo = 0, vhi = 1;
  const Ticks vt = NiceTicks(vlo, vhi, 5);

  Frame f{kLeft,
          kWidth - 130,
          kTop,
          kHeight - kBottom,
          cols > 0 ? NiceTicks(map.x_edges.front(), map.x_edges.back(), 8) : NiceTicks(0, 1),
          Ticks{0, std::max<double>(1, static_cast<double>(rows)), {}}};
  // The x range is exactly the data's: cells fill the frame.
  if (cols > 0 && map.x_edges.back() > map.x_edges.front()) {
    f.xt.lo = map.x_edges.front();
    f.xt.hi = map.x_edges.back();
    std::erase_if(f.xt.values, [&](double v) { return v < f.xt.lo || v > f.xt.hi; });
  }
  std::string s = Header(map.title);
  s += "<g class=\"cells\">\n";
  for (size_t r = 0; r < rows; ++r) {
    const double top = f.Y(static_cast<double>(r + 1)), bottom = f.Y(static_cast<double>(r));
    for (size_t c = 0; c < cols && c < map.values[r].size(); ++c) {
      const double v = map.values[r][c];
      const double left = f.X(map.x_edges[c]), right = f.X(map.x_edges[c + 1]);
      const std::string color =
          std::isfinite(v) ? ScaleColor((v - vt.lo) / (vt.hi - vt.lo)) : std::string("#dddddd");
      // Cells overlap by a hair so no background seams show between them.
      absl::StrAppend(&s, "<rect class=\"cell\" x=\"", Num(left), "\" y=\"", Num(top),
                      "\" width=\"", absl::StrFormat("%.2f", right - left + 0.4), "\" height=\"",
                      Num(bottom - top), "\" fill=\"", color, "\"/>\n");
    }
  }
  s += "</g>\n";
  s += Axes(f, map.x_label, map.y_label, /*line_plot=*/false);
  for (size_t r = 0; r < rows && r < map.row_labels.size(); ++r) {
    const double y = f.Y(static_cast<double>(r) + 0.5);
    absl::StrAppend(&s, "<text x=\"", Num(f.x0 - 8), "\" y=\"", Num(y + 4),
                    "\" text-anchor=\"end\">", Escape(map.row_labels[r]), "</text>\n");
  }
  s += VerticalMarkers(f, map.vertical);

  // Legend: a vertical colour bar right of the plot, low values at the bottom.
  const double bx = f.x1 + 30, bw = 18, by0 = f.y0 + 16, by1 = f.y1;
  s += "<g class=\"legend\">\n<defs><linearGradient id=\"scale\" x1=\"0\" y1=\"1\" x2=\"0\" "
       "y2=\"0\">\n";
  for (int i = 0; i <= 8; ++i) {
    absl::StrAppend(&s, "<stop offset=\"", absl::StrFormat("%.3f", i / 8.0), "\" stop-color=\"",
                    ScaleColor(i / 8.0), "\"/>\n");
  }
  s += "</linearGradient></defs>\n";
  absl::StrAppend(&s, "<rect x=\"", Num(bx), "\" y=\"", Num(by0), "\" width=\"", Num(bw),
                  "\" height=\"", Num(by1 - by0), "\" fill=\"url(#scale)\" stroke=\"#333333\"/>\n");
  for (double v : vt.values) {
    const double y = by1 - (v - vt.lo) / (vt.hi - vt.lo) * (by1 - by0);
    absl::StrAppend(&s, "<line x1=\"", Num(bx + bw), "\" y1=\"", Num(y), "\" x2=\"",
                    Num(bx + bw + 4), "\" y2=\"", Num(y), "\" stroke=\"#333333\"/>\n");
    absl::StrAppend(&s, "<text x=\"", Num(bx + bw + 7), "\" y=\"", Num(y + 4), "\">",
                    Escape(FormatTick(v)), "</text>\n");
  }
  absl::StrAppend(&s, "<text x=\"", Num(bx + bw / 2), "\" y=\"", Num(f.y0 - 2),
                  "\" "
                  "text-anchor=\"middle\" font-size=\"11\">",
                  Escape(map.value_label), "</text>\n</g>\n</svg>\n");
  return s;
}

}  // namespace furnace::cli
