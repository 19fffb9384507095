// The device time of a span of work on a stream: timing events around it (device.h), read without
// waiting once the device has run the span. On a discrete device a call returns as soon as its
// work is enqueued, so the host's clock around the calls measures the enqueueing; this measures
// the work.
//
//   ASSIGN_OR_RETURN(device::DeviceSpan span, device::DeviceSpan::Begin(dev, stream));
//   ... enqueue the work on `stream` ...
//   RETURN_IF_ERROR(span.End(stream));
//   ... later ...
//   ASSIGN_OR_RETURN(std::optional<double> s, span.Seconds());  // nullopt: not run yet
//
// Owns its two events; the device must outlive it. One thread at a time.
#pragma once

#include <memory>
#include <optional>

#include "absl/status/statusor.h"
#include "runtime/device/device.h"

namespace furnace::device {

class DeviceSpan {
 public:
  DeviceSpan() = default;  // no span: Seconds() is nullopt
  // A span that starts at the current point of `stream`.
  static absl::StatusOr<DeviceSpan> Begin(Device& device, Stream& stream);
  // Ends it at the current point of `stream` (the stream it began on, or one ordered after it).
  // FailedPrecondition for a span never begun.
  absl::Status End(Stream& stream);
  // Its seconds on the device once the device has run it; nullopt before, or when it was never
  // begun or ended.
  absl::StatusOr<std::optional<double>> Seconds() const;

 private:
  Device* device_ = nullptr;
  std::unique_ptr<Event> start_, end_;
  bool ended_ = false;
};

}  // namespace furnace::device
