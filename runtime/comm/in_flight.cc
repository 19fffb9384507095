#include "runtime/comm/in_flight.h"

#include "runtime/comm/communicator.h"

namespace furnace::comm {

uint64_t InFlightCollectives::Begin(const std::string& op, const std::string& group, int group_size,
                                    int peer, bool started) {
  InFlightCall call{op, group, group_size, peer, clock_.MonotonicSeconds(), started};
  std::lock_guard<std::mutex> lock(mu_);
  const uint64_t token = next_++;
  calls_.emplace(token, std::move(call));
  return token;
}

void InFlightCollectives::MarkStarted(uint64_t token) {
  std::lock_guard<std::mutex> lock(mu_);
  if (const auto it = calls_.find(token); it != calls_.end()) it->second.started = true;
}

void InFlightCollectives::End(uint64_t token) {
  std::lock_guard<std::mutex> lock(mu_);
  calls_.erase(token);
}

std::optional<InFlightCall> InFlightCollectives::Oldest() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (calls_.empty()) return std::nullopt;
  return calls_.begin()->second;
}

size_t InFlightCollectives::count() const {
  std::lock_guard<std::mutex> lock(mu_);
  return calls_.size();
}

InFlightCollectives& ProcessInFlight() {
  static InFlightCollectives* registry = new InFlightCollectives(RealClock());
  return *registry;
}

ScopedInFlight::ScopedInFlight(const char* op, const Communicator& comm, int peer)
    : token_(ProcessInFlight().Begin(op, comm.name(), comm.size(), peer)) {}

ScopedInFlight::~ScopedInFlight() { ProcessInFlight().End(token_); }

}  // namespace furnace::comm
