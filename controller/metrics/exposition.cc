#include "controller/metrics/exposition.h"

#include <charconv>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace furnace::controller::metrics {
namespace {

const char* TypeName(MetricType type) { return type == MetricType::kCounter ? "counter" : "gauge"; }

std::string SampleLine(const std::string& name, const Labels& labels, const std::string& value) {
  std::string line = name;
  if (!labels.empty()) {
    line += '{';
    for (size_t i = 0; i < labels.size(); ++i) {
      if (i > 0) line += ',';
      absl::StrAppend(&line, labels[i].first, "=\"", EscapeLabelValue(labels[i].second), "\"");
    }
    line += '}';
  }
  absl::StrAppend(&line, " ", value);
  return line;
}

}  // namespace

std::string EscapeLabelValue(const std::string& value) {
  std::string out;
  out.reserve(value.size());
  for (char c : value) {
    switch (c) {
      case '\\':
        out += "\\\\";
        break;
      case '"':
        out += "\\\"";
        break;
      case '\n':
        out += "\\n";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string EscapeHelp(const std::string& help) {
  std::string out;
  out.reserve(help.size());
  for (char c : help) {
    switch (c) {
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string FormatValue(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  char buf[64];
  // Integral values within double's exact range print as integers; the rest in the shortest form
  // that parses back to the same double.
  const bool integral = value == std::trunc(value) && std::fabs(value) < 9007199254740992.0;
  const auto r = integral ? std::to_chars(buf, buf + sizeof(buf), value, std::chars_format::fixed)
                          : std::to_chars(buf, buf + sizeof(buf), value);
  std::string out(buf, r.ptr);
  if (out == "-0") out = "0";
  return out;
}

MetricFamily::MetricFamily(std::string name, MetricType type, std::string help)
    : name_(std::move(name)), type_(type), help_(std::move(help)) {}

void MetricFamily::Add(const Labels& labels, double value) {
  samples_.push_back(SampleLine(name_, labels, FormatValue(value)));
}

void MetricFamily::Add(const Labels& labels, uint64_t value) {
  samples_.push_back(SampleLine(name_, labels, absl::StrCat(value)));
}

void MetricFamily::AppendTo(std::string* out) const {
  if (samples_.empty()) return;
  absl::StrAppend(out, "# HELP ", name_, " ", EscapeHelp(help_), "\n");
  absl::StrAppend(out, "# TYPE ", name_, " ", TypeName(type_), "\n");
  for (const std::string& line : samples_) absl::StrAppend(out, line, "\n");
}

MetricFamily* Exposition::Add(std::string name, MetricType type, std::string help) {
  families_.push_back(std::make_unique<MetricFamily>(std::move(name), type, std::move(help)));
  return families_.back().get();
}

std::string Exposition::Render() const {
  std::string out;
  for (const auto& family : families_) family->AppendTo(&out);
  return out;
}

}  // namespace furnace::controller::metrics
