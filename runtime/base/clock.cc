#include "runtime/base/clock.h"

#include <chrono>

namespace furnace {
namespace {

class SystemClock : public Clock {
 public:
  double MonotonicSeconds() const override {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }
  double UnixSeconds() const override {
    return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch())
        .count();
  }
};

}  // namespace

const Clock& RealClock() {
  static const SystemClock clock;
  return clock;
}

}  // namespace furnace
