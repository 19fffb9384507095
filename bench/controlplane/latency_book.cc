#include "bench/controlplane/latency_book.h"

#include <algorithm>
#include <cmath>

namespace furnace::bench {

double Quantile(std::vector<float> v, double q) {
  if (v.empty()) return 0;
  const size_t idx = std::min(v.size() - 1, static_cast<size_t>(std::ceil(q * v.size())) - 1);
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(idx), v.end());
  return v[idx];
}

LatencyBook::Kind& LatencyBook::Get(const std::string& kind) {
  std::lock_guard<std::mutex> lock(mu_);
  auto& k = kinds_[kind];
  if (!k) k = std::make_unique<Kind>();
  return *k;
}

void LatencyBook::Record(const std::string& kind, double seconds, bool ok,
                         const std::string& error) {
  Kind& k = Get(kind);
  std::lock_guard<std::mutex> lock(k.mu);
  k.seconds.push_back(static_cast<float>(seconds));
  if (!ok) {
    if (k.failures++ == 0) k.first_error = error;
  }
}

void LatencyBook::Reset() {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [name, k] : kinds_) {
    std::lock_guard<std::mutex> klock(k->mu);
    k->seconds.clear();
    k->failures = 0;
    k->first_error.clear();
  }
}

nlohmann::json LatencyBook::Summary() const {
  nlohmann::json out = nlohmann::json::object();
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [name, k] : kinds_) {
    std::lock_guard<std::mutex> klock(k->mu);
    if (k->seconds.empty()) continue;
    nlohmann::json j;
    j["calls"] = k->seconds.size();
    j["failures"] = k->failures;
    j["p50_ms"] = Quantile(k->seconds, 0.50) * 1e3;
    j["p99_ms"] = Quantile(k->seconds, 0.99) * 1e3;
    j["max_ms"] = *std::max_element(k->seconds.begin(), k->seconds.end()) * 1e3;
    if (!k->first_error.empty()) j["first_error"] = k->first_error;
    out[name] = std::move(j);
  }
  return out;
}

}  // namespace furnace::bench
