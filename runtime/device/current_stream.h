// The calling thread's current stream: the stream on which the backend's ops (backend.h) enqueue,
// as CUDA launches name theirs. A thread that computes on a device sets it for a scope:
//
//   device::StreamScope on_compute(*compute_stream);
//   backend->matmul_forward(out, inp, weight, bias, N, C, OC);  // enqueued on compute_stream
//
// Scopes nest (the destructor restores the previous stream). Per thread, so two threads may drive
// two streams of one device through the same (immutable) table. nullptr (no scope): the device's
// default stream. The CPU table ignores it (its ops run on the calling thread).
#pragma once

#include "runtime/device/device.h"

namespace furnace::device {

// The stream set by the innermost StreamScope on this thread; nullptr when none.
Stream* CurrentStream();
// Where work that names no stream goes: CurrentStream(), else `device`'s default stream.
Stream& CurrentStreamOf(Device& device);

class StreamScope {
 public:
  explicit StreamScope(Stream& stream);
  ~StreamScope();
  StreamScope(const StreamScope&) = delete;
  StreamScope& operator=(const StreamScope&) = delete;

 private:
  Stream* previous_;
};

}  // namespace furnace::device
