// A Device of a chosen kind with no hardware behind it: the backend-selection tests give it a kind
// (CUDA, with or without a CUDA build) to check the choice or the refusal without a GPU. Every
// operation that would touch memory is refused (FailedPrecondition), except host memory when
// constructed with host_memory: then AllocateHost/FreeHost are the C heap's, counted (the pools'
// tests see what reaches the device).
#pragma once

#include <cstdlib>
#include <memory>
#include <string>
#include <utility>

#include "runtime/device/device.h"

namespace furnace::device::testing_util {

class FakeDevice final : public Device {
 public:
  FakeDevice(Kind kind, std::string name, bool host_memory = false)
      : kind_(kind), name_(std::move(name)), host_memory_(host_memory) {}

  int host_allocations = 0;
  int host_frees = 0;
  size_t host_limit = 0;  // > 0: AllocateHost refuses larger requests (the host is short of memory)

  Kind kind() const override { return kind_; }
  std::string name() const override { return name_; }
  size_t total_memory() const override { return 0; }
  absl::StatusOr<void*> Allocate(size_t) override { return Refused(); }
  void Free(void*) override {}
  absl::StatusOr<void*> AllocateHost(size_t bytes) override {
    if (!host_memory_) return Refused();
    if (host_limit > 0 && bytes > host_limit) {
      return absl::ResourceExhaustedError("fake device " + name_ + ": no page-locked memory left");
    }
    ++host_allocations;
    return std::malloc(bytes);
  }
  void FreeHost(void* p) override {
    if (p == nullptr) return;
    ++host_frees;
    std::free(p);
  }
  bool IsDeviceMemory(const void*) const override { return false; }
  Stream& default_stream() override { return stream_; }
  absl::StatusOr<std::unique_ptr<Stream>> CreateStream() override { return Refused(); }
  absl::StatusOr<std::unique_ptr<Event>> CreateEvent() override { return Refused(); }
  absl::Status Copy(void*, const void*, size_t, CopyKind, Stream&) override { return Refused(); }
  absl::Status Memset(void*, int, size_t, Stream&) override { return Refused(); }
  absl::Status RecordEvent(Event&, Stream&) override { return Refused(); }
  absl::Status WaitEvent(Stream&, Event&) override { return Refused(); }
  absl::Status SynchronizeEvent(Event&) override { return Refused(); }
  absl::Status SynchronizeStream(Stream&) override { return Refused(); }

 private:
  absl::Status Refused() const {
    return absl::FailedPreconditionError("fake device " + name_ + ": no memory");
  }

  struct NoStream final : Stream {
    void* native() override { return nullptr; }
  };
  Kind kind_;
  std::string name_;
  bool host_memory_;
  NoStream stream_;
};

}  // namespace furnace::device::testing_util
