// Time sources. Components that time out or back off take a Clock so tests can drive time with
// FakeClock instead of sleeping. Clock implementations are thread-safe.
#pragma once

#include <atomic>
#include <cstdint>

namespace furnace {

class Clock {
 public:
  virtual ~Clock() = default;
  // Seconds on a monotonic clock (for timeouts and durations).
  virtual double MonotonicSeconds() const = 0;
  // Seconds since the Unix epoch (for records a person reads).
  virtual double UnixSeconds() const = 0;
};

// The process-wide real clock.
const Clock& RealClock();

// A clock that only moves when told to. Both readings advance together.
class FakeClock : public Clock {
 public:
  explicit FakeClock(double start_unix = 1'700'000'000.0) : unix_start_(start_unix) {}
  double MonotonicSeconds() const override { return now_.load(); }
  double UnixSeconds() const override { return unix_start_ + now_.load(); }
  void Advance(double seconds) { now_.store(now_.load() + seconds); }

 private:
  double unix_start_;
  std::atomic<double> now_{0.0};
};

}  // namespace furnace
