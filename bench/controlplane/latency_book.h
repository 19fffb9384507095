// LatencyBook: the round-trip times and failures of every RPC the load generator makes, per RPC
// kind (Register, Heartbeat, PushTelemetry, ...), and their percentiles.
// Thread-safe: gRPC's callback threads record into it concurrently (one mutex per kind).
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"

namespace furnace::bench {

class LatencyBook {
 public:
  // Records one finished call; `ok` false counts a failure (its time is still recorded).
  void Record(const std::string& kind, double seconds, bool ok, const std::string& error = "");
  // Starts a new window: Summary() covers only calls recorded after this.
  void Reset();
  // {kind: {calls, failures, p50_ms, p99_ms, max_ms, first_error}}.
  nlohmann::json Summary() const;

 private:
  struct Kind {
    std::mutex mu;
    std::vector<float> seconds;
    uint64_t failures = 0;
    std::string first_error;
  };
  Kind& Get(const std::string& kind);

  mutable std::mutex mu_;
  std::map<std::string, std::unique_ptr<Kind>> kinds_;  // guarded by mu_ (the map, not a Kind)
};

// The q-quantile (0..1) of an unsorted series, by nearest rank; 0 for an empty one.
double Quantile(std::vector<float> v, double q);

}  // namespace furnace::bench
