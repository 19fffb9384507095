#include "worker/unsettled_records.h"

#include <map>
#include <set>
#include <utility>

namespace furnace::worker {

namespace v1 = furnace::v1;

UnsettledRecords::UnsettledRecords(size_t capacity, size_t max_bytes)
    : capacity_(capacity), max_bytes_(max_bytes) {}

void UnsettledRecords::Add(const std::vector<v1::TelemetryRecord>& pushed) {
  for (const v1::TelemetryRecord& record : pushed) {
    if (!Holds(record)) continue;
    Held& h = held_.emplace_back();
    h.record = record;
    h.bytes = record.ByteSizeLong();
    bytes_ += h.bytes;
  }
  while (held_.size() > capacity_ || (bytes_ > max_bytes_ && held_.size() > 1)) {
    bytes_ -= held_.front().bytes;
    held_.pop_front();
    ++dropped_;
  }
}

void UnsettledRecords::Settle(const v1::TelemetryAck& ack, const std::set<std::string>& asked) {
  if (held_.empty()) return;
  std::map<std::string, const v1::SettledSteps*> by_job;
  for (const v1::SettledSteps& s : ack.settled()) by_job[s.job_id()] = &s;
  const auto settled = [&](const v1::TelemetryRecord& r) {
    auto it = by_job.find(r.job_id());
    if (it == by_job.end()) return asked.count(r.job_id()) > 0;
    const v1::SettledSteps& s = *it->second;
    return s.all() ||
           std::make_pair(r.attempt(), r.step()) <= std::make_pair(s.attempt(), s.step());
  };
  std::deque<Held> kept;
  for (Held& h : held_) {
    if (settled(h.record)) {
      bytes_ -= h.bytes;
    } else {
      kept.push_back(std::move(h));
    }
  }
  held_ = std::move(kept);
}

std::set<std::string> UnsettledRecords::Jobs() const {
  std::set<std::string> jobs;
  for (const Held& h : held_) jobs.insert(h.record.job_id());
  return jobs;
}

std::vector<v1::TelemetryRecord> UnsettledRecords::TakeAll() {
  std::vector<v1::TelemetryRecord> out;
  out.reserve(held_.size());
  for (Held& h : held_) out.push_back(std::move(h.record));
  held_.clear();
  bytes_ = 0;
  return out;
}

}  // namespace furnace::worker
