// A writer for the Prometheus text exposition format (version 0.0.4): metric families with
// HELP and TYPE, samples with escaped label values, values that round-trip.
//
// Families render in the order they were added, each with its samples contiguous (the format
// requires it), and a family with no samples renders nothing, so a metric that does not apply
// (no job is training) is absent rather than an empty header. Values: integral values below 2^53
// print as plain integers ("3", not "3e+00"), others as the shortest decimal that round-trips,
// NaN as "NaN", infinities as "+Inf"/"-Inf". Counters up to 2^64 are exact through the uint64_t
// overload.
//
// Not thread-safe; build one per scrape. Names are the caller's constants and are not validated.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace furnace::controller::metrics {

// The Content-Type of what Render() returns.
inline constexpr char kExpositionContentType[] = "text/plain; version=0.0.4; charset=utf-8";

enum class MetricType { kGauge, kCounter };

using Labels = std::vector<std::pair<std::string, std::string>>;

class MetricFamily {
 public:
  MetricFamily(std::string name, MetricType type, std::string help);

  void Add(const Labels& labels, double value);
  void Add(const Labels& labels, uint64_t value);

  const std::string& name() const { return name_; }
  bool empty() const { return samples_.empty(); }
  void AppendTo(std::string* out) const;

 private:
  std::string name_;
  MetricType type_;
  std::string help_;
  std::vector<std::string> samples_;  // rendered lines, without the newline
};

class Exposition {
 public:
  // The family is owned by this Exposition; the pointer stays valid for its lifetime.
  MetricFamily* Add(std::string name, MetricType type, std::string help);
  std::string Render() const;

 private:
  std::vector<std::unique_ptr<MetricFamily>> families_;
};

// Exposed for tests.
std::string EscapeLabelValue(const std::string& value);  // \ " newline
std::string EscapeHelp(const std::string& help);         // \ newline
std::string FormatValue(double value);

}  // namespace furnace::controller::metrics
