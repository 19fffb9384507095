// The CUDA device's own surface beyond device.h, for the CUDA backend table (cuda_backend.h) and
// tests: its GPU ordinal, a sticky error (the first failed backend op: a kernel launch or cuBLAS
// call that failed at enqueue, recorded by the table, since its ops return void), and the lookups
// the table resolves an op's device with. No CUDA types here: the header compiles in every build
// (without CUDA, CreateCudaDevice is Unavailable and the lookups find nothing).
//
// Sticky error: once set, every later SynchronizeStream / SynchronizeEvent of the device returns it
// (after waiting), as the emulated device does and as CUDA does for a fault inside a kernel (which
// the driver makes sticky by itself and which those calls report as Internal).
// Thread-safety: all of it may be called from any thread.
#pragma once

#include "absl/status/status.h"
#include "runtime/device/device.h"

namespace furnace::device {

class CudaDevice : public Device {
 public:
  virtual int ordinal() const = 0;
  // Records `error` as the sticky error (the first one stays).
  virtual void SetStickyError(absl::Status error) = 0;
  // The sticky error; OK when none.
  virtual absl::Status sticky_error() const = 0;
};

// The CUDA device `stream` belongs to; nullptr for a stream of another kind of device.
CudaDevice* CudaDeviceOf(Stream& stream);
// A live CudaDevice of GPU `ordinal` (the oldest of those alive); nullptr when there is none.
CudaDevice* LiveCudaDevice(int ordinal);

}  // namespace furnace::device
