#include "runtime/device/device_span.h"

#include <utility>

#include "runtime/base/status.h"

namespace furnace::device {

absl::StatusOr<DeviceSpan> DeviceSpan::Begin(Device& device, Stream& stream) {
  DeviceSpan span;
  span.device_ = &device;
  ASSIGN_OR_RETURN(span.start_, device.CreateTimingEvent());
  ASSIGN_OR_RETURN(span.end_, device.CreateTimingEvent());
  RETURN_IF_ERROR(device.RecordEvent(*span.start_, stream));
  return span;
}

absl::Status DeviceSpan::End(Stream& stream) {
  if (device_ == nullptr) return absl::FailedPreconditionError("device span: never begun");
  RETURN_IF_ERROR(device_->RecordEvent(*end_, stream));
  ended_ = true;
  return absl::OkStatus();
}

absl::StatusOr<std::optional<double>> DeviceSpan::Seconds() const {
  if (device_ == nullptr || !ended_) return std::nullopt;
  ASSIGN_OR_RETURN(const bool done, device_->EventDone(*end_));
  if (!done) return std::nullopt;
  ASSIGN_OR_RETURN(const double seconds, device_->ElapsedSeconds(*start_, *end_));
  return seconds;
}

}  // namespace furnace::device
