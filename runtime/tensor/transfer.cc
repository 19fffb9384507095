#include "runtime/tensor/transfer.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "runtime/base/status.h"
#include "runtime/device/current_stream.h"

namespace furnace::tensor {

device::Stream& StreamFor(device::Device& device) { return device::CurrentStreamOf(device); }

absl::Status CopyToDevice(device::Device& device, void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return absl::OkStatus();
  device::Stream& stream = StreamFor(device);
  RETURN_IF_ERROR(device.Copy(dst, src, bytes, device::CopyKind::kHostToDevice, stream));
  return device.SynchronizeStream(stream);
}

absl::Status CopyToHost(device::Device& device, void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return absl::OkStatus();
  device::Stream& stream = StreamFor(device);
  RETURN_IF_ERROR(device.Copy(dst, src, bytes, device::CopyKind::kDeviceToHost, stream));
  return device.SynchronizeStream(stream);
}

absl::Status CopyOnDevice(device::Device& device, void* dst, const void* src, size_t bytes) {
  if (bytes == 0 || dst == src) return absl::OkStatus();
  return device.Copy(dst, src, bytes, device::CopyKind::kDeviceToDevice, StreamFor(device));
}

absl::Status Fill(device::Device& device, void* dst, int value, size_t bytes) {
  if (bytes == 0) return absl::OkStatus();
  return device.Memset(dst, value, bytes, StreamFor(device));
}

absl::Status Synchronize(device::Device& device) {
  return device.SynchronizeStream(StreamFor(device));
}

UploadRing::UploadRing(device::Device& device, int slots)
    : device_(device), slots_(static_cast<size_t>(slots < 1 ? 1 : slots)) {}

UploadRing::~UploadRing() {
  for (Slot& s : slots_) {
    if (s.used && s.done != nullptr) device_.SynchronizeEvent(*s.done).IgnoreError();
    if (s.host != nullptr) device_.FreeHost(s.host);
  }
}

absl::Status UploadRing::Upload(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return absl::OkStatus();
  device::Stream& stream = StreamFor(device_);
  if (device::HostAddressable(device_)) {
    return device_.Copy(dst, src, bytes, device::CopyKind::kHostToDevice, stream);
  }
  Slot& slot = slots_[next_];
  next_ = (next_ + 1) % slots_.size();
  if (slot.used) RETURN_IF_ERROR(device_.SynchronizeEvent(*slot.done));  // its last copy ran
  slot.used = false;
  if (slot.capacity < bytes) {
    if (slot.host != nullptr) device_.FreeHost(slot.host);
    slot.host = nullptr;
    slot.capacity = 0;
    absl::StatusOr<void*> host = device_.AllocateHost(bytes);
    if (!host.ok()) {
      return absl::Status(host.status().code(), absl::StrCat("upload staging of ", bytes,
                                                             " bytes: ", host.status().message()));
    }
    slot.host = *host;
    slot.capacity = bytes;
  }
  if (slot.done == nullptr) {
    ASSIGN_OR_RETURN(slot.done, device_.CreateEvent());
  }
  std::memcpy(slot.host, src, bytes);
  RETURN_IF_ERROR(device_.Copy(dst, slot.host, bytes, device::CopyKind::kHostToDevice, stream));
  if (absl::Status recorded = device_.RecordEvent(*slot.done, stream); !recorded.ok()) {
    // No event says when the copy has read the slot: wait for it here, before anyone may reuse or
    // free the slot.
    device_.SynchronizeStream(stream).IgnoreError();
    return recorded;
  }
  slot.used = true;
  return absl::OkStatus();
}

}  // namespace furnace::tensor
