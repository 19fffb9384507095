// Moving bytes on the calling thread's stream of a device (current_stream.h), written once for
// every kind of device: the model's and the trainer's host transfers (tokens in, scalars and
// checkpoints out), device-to-device copies and fills, and non-blocking uploads through pinned
// staging (UploadRing).
//
// Which stream: StreamFor(device) is the calling thread's current stream when it has one (a
// thread that sets a current stream computes on that stream's device: the caller keeps them
// matched), else device.default_stream(). Every function below enqueues there, so it is ordered
// with the backend's ops of the same thread (backend.h) without an event.
//
// Synchronisation (the host waits) happens only where the host needs the bytes: CopyToHost
// (the host reads dst on return) and CopyToDevice (the host may reuse src on return). CopyOnDevice,
// Fill and UploadRing::Upload return at once, as a CUDA launch does. On the CPU device every copy
// has completed when it returns, so these are plain memmove / memset there.
//
// Errors: the device's status (Copy, Memset, SynchronizeStream; a sticky error of an emulated
// device's stream shows up at the synchronisation).
// Thread-safety: the functions, as the Device; an UploadRing is used by one thread at a time.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "runtime/device/device.h"

namespace furnace::tensor {

// The stream work on `device` is enqueued on from this thread (see the file comment).
device::Stream& StreamFor(device::Device& device);

// dst (device) <- src (host), then the stream synchronised: src may be reused on return.
absl::Status CopyToDevice(device::Device& device, void* dst, const void* src, size_t bytes);
// dst (host) <- src (device), then the stream synchronised: dst holds the bytes on return.
absl::Status CopyToHost(device::Device& device, void* dst, const void* src, size_t bytes);
// dst (device) <- src (device), enqueued.
absl::Status CopyOnDevice(device::Device& device, void* dst, const void* src, size_t bytes);
// bytes of dst (device) set to `value`, enqueued.
absl::Status Fill(device::Device& device, void* dst, int value, size_t bytes);
// Waits until every operation enqueued so far on StreamFor(device) has run.
absl::Status Synchronize(device::Device& device);

// Host-to-device copies that do not block the host. Upload copies the source into one of a ring
// of pinned staging buffers (device::Device::AllocateHost) and enqueues the copy from there, with
// an event after it; a slot is reused only after its previous copy's event (the host waits only
// when the ring has come round faster than the stream). On a device the host can address (the CPU)
// the copy is made directly. Owns its staging buffers and events; the device must outlive it.
class UploadRing {
 public:
  explicit UploadRing(device::Device& device, int slots = 8);
  ~UploadRing();  // waits for the copies in flight (their staging is freed)
  UploadRing(const UploadRing&) = delete;
  UploadRing& operator=(const UploadRing&) = delete;

  // dst (device, `bytes`) <- src (host), enqueued on StreamFor(device); src may be reused on
  // return.
  absl::Status Upload(void* dst, const void* src, size_t bytes);

 private:
  struct Slot {
    void* host = nullptr;
    size_t capacity = 0;
    std::unique_ptr<device::Event> done;  // recorded after the slot's last copy
    bool used = false;
  };
  device::Device& device_;
  std::vector<Slot> slots_;
  size_t next_ = 0;
};

}  // namespace furnace::tensor
