// The step records an agent pushed and the controller acknowledged but has not stored yet.
//
// Why: the controller merges a step's per-rank records in memory until every rank's is in
// (controller/service/telemetry_aggregator.h), so acknowledging a record is not storing it; a
// controller killed outright would lose the steps it was merging. The agent keeps each step record
// (one with `train`) until an answer says its step is stored (v1::TelemetryAck.settled, by job:
// every record at or below (attempt, step), or all of the job's), and pushes what it keeps again
// after it registers anew (TakeAll): a controller that restarted merges them as it would have, and
// one that had them counts each rank's record of a step once.
//
// Bounded like the agent's queue (`capacity` records, `max_bytes` bytes): past either bound the
// oldest are let go (counted: dropped()), so a controller that never answers for a job cannot grow
// the agent (the newest stays, however large). In steady state it holds the records of the steps
// in flight, a few per rank.
//
// Thread-safety: none; the agent's flusher owns it (under its flush mutex).
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <set>
#include <string>
#include <vector>

#include "furnace/v1/telemetry.pb.h"

namespace furnace::worker {

class UnsettledRecords {
 public:
  UnsettledRecords(size_t capacity, size_t max_bytes);

  // Whether the record waits for its step to be stored once pushed (a step record).
  static bool Holds(const furnace::v1::TelemetryRecord& record) { return record.has_train(); }
  // Keeps the step records of a batch the controller acknowledged (the others are stored as they
  // come); the oldest held go past the bounds.
  void Add(const std::vector<furnace::v1::TelemetryRecord>& pushed);
  // Lets go of the records the answer says are stored, and of those of the `asked` jobs it leaves
  // out (a controller that does not say how far steps are stored: one older than this agent).
  void Settle(const furnace::v1::TelemetryAck& ack, const std::set<std::string>& asked);
  // The jobs of the records held, each once (TelemetryBatch.unsettled_jobs).
  std::set<std::string> Jobs() const;

  // Removes and returns every record held, oldest first (to be pushed again: they come back
  // through Add once acknowledged).
  std::vector<furnace::v1::TelemetryRecord> TakeAll();

  size_t size() const { return held_.size(); }
  size_t bytes() const { return bytes_; }
  // Records let go past the bounds, since the agent started.
  uint64_t dropped() const { return dropped_; }

 private:
  struct Held {
    furnace::v1::TelemetryRecord record;
    size_t bytes = 0;
  };

  const size_t capacity_;
  const size_t max_bytes_;
  std::deque<Held> held_;  // oldest first
  size_t bytes_ = 0;
  uint64_t dropped_ = 0;
};

}  // namespace furnace::worker
