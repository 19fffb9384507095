#include "runtime/device/weight_mirror.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace furnace::device {
namespace {

struct Entry {
  const float* weights;
  const uint16_t* mirror;
  int64_t n;
};

absl::Mutex registry_mu(absl::kConstInit);
std::vector<Entry>& Registry() ABSL_EXCLUSIVE_LOCKS_REQUIRED(registry_mu) {
  static auto* entries = new std::vector<Entry>();
  return *entries;
}

}  // namespace

const uint16_t* FindWeightMirror(const float* weight, int64_t n) {
  if (weight == nullptr || n <= 0) return nullptr;
  absl::ReaderMutexLock lock(&registry_mu);
  for (const Entry& e : Registry()) {
    if (weight >= e.weights && weight + n <= e.weights + e.n)
      return e.mirror + (weight - e.weights);
  }
  return nullptr;
}

WeightMirror::WeightMirror(const float* weights, const uint16_t* mirror, int64_t n) {
  if (weights == nullptr || mirror == nullptr || n <= 0) return;
  absl::MutexLock lock(&registry_mu);
  Registry().push_back({weights, mirror, n});
  weights_ = weights;
}

WeightMirror::~WeightMirror() { Reset(); }

WeightMirror::WeightMirror(WeightMirror&& other) noexcept
    : weights_(std::exchange(other.weights_, nullptr)) {}

WeightMirror& WeightMirror::operator=(WeightMirror&& other) noexcept {
  if (this != &other) {
    Reset();
    weights_ = std::exchange(other.weights_, nullptr);
  }
  return *this;
}

void WeightMirror::Reset() {
  if (weights_ == nullptr) return;
  absl::MutexLock lock(&registry_mu);
  std::vector<Entry>& r = Registry();
  r.erase(std::remove_if(r.begin(), r.end(), [&](const Entry& e) { return e.weights == weights_; }),
          r.end());
  weights_ = nullptr;
}

}  // namespace furnace::device
