// The CPU and emulated markers, and the choice by device kind (stream_marks.h).
#include "runtime/comm/stream_marks.h"

#include <atomic>
#include <chrono>
#include <cstdint>
#include <utility>

#include "absl/strings/str_cat.h"
#include "runtime/comm/stream_marks_internal.h"
#include "runtime/device/emulated_device.h"

namespace furnace::comm {
namespace {

int64_t NowNanos() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// A mark stamped with the monotonic clock when the stream got there (0 until then).
class StampedMark final : public StreamMark {
 public:
  struct Stamp {
    std::atomic<int64_t> nanos{0};
  };
  explicit StampedMark(std::shared_ptr<Stamp> stamp) : stamp_(std::move(stamp)) {}

  absl::StatusOr<bool> Passed() override {
    return stamp_->nanos.load(std::memory_order_acquire) != 0;
  }
  absl::StatusOr<double> SecondsSince(const StreamMark& earlier) const override {
    const auto* e = dynamic_cast<const StampedMark*>(&earlier);
    if (e == nullptr) return absl::InvalidArgumentError("stream mark: marks of different markers");
    const int64_t from = e->stamp_->nanos.load(std::memory_order_acquire);
    const int64_t to = stamp_->nanos.load(std::memory_order_acquire);
    if (from == 0 || to == 0) {
      return absl::FailedPreconditionError("stream mark: timed before both marks have passed");
    }
    return static_cast<double>(to - from) * 1e-9;
  }

 private:
  std::shared_ptr<Stamp> stamp_;
};

class CpuMarker final : public StreamMarker {
 public:
  absl::StatusOr<std::unique_ptr<StreamMark>> Mark(device::Stream&) override {
    auto stamp = std::make_shared<StampedMark::Stamp>();
    stamp->nanos.store(NowNanos(), std::memory_order_release);
    return std::unique_ptr<StreamMark>(new StampedMark(std::move(stamp)));
  }
};

class EmulatedMarker final : public StreamMarker {
 public:
  explicit EmulatedMarker(device::EmulatedDevice& device) : device_(device) {}
  absl::StatusOr<std::unique_ptr<StreamMark>> Mark(device::Stream& stream) override {
    auto stamp = std::make_shared<StampedMark::Stamp>();
    absl::Status launched = device_.Launch(
        stream, [stamp] { stamp->nanos.store(NowNanos(), std::memory_order_release); });
    if (!launched.ok()) return launched;
    return std::unique_ptr<StreamMark>(new StampedMark(std::move(stamp)));
  }

 private:
  device::EmulatedDevice& device_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<StreamMarker>> CreateStreamMarker(device::Device& device) {
  switch (device.kind()) {
    case device::Kind::kCpu:
      return std::unique_ptr<StreamMarker>(new CpuMarker());
    case device::Kind::kEmulated: {
      auto* emulated = dynamic_cast<device::EmulatedDevice*>(&device);
      if (emulated == nullptr) {
        return absl::InvalidArgumentError(
            absl::StrCat("stream marks: ", device.name(), " says it is emulated but is not"));
      }
      return std::unique_ptr<StreamMarker>(new EmulatedMarker(*emulated));
    }
    case device::Kind::kCuda:
#if FURNACE_HAVE_CUDA
      return internal::CreateCudaStreamMarker(device);
#else
      return absl::FailedPreconditionError("stream marks: this build has no CUDA");
#endif
  }
  return absl::InvalidArgumentError("stream marks: unknown device kind");
}

}  // namespace furnace::comm
