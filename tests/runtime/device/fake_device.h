// A Device of a chosen kind with no hardware behind it: the backend-selection tests give it a kind
// (CUDA, with or without a CUDA build) to check the choice or the refusal without a GPU. Every
// operation that would touch memory is refused (FailedPrecondition); nothing here is ever called by
// the code under test.
#pragma once

#include <memory>
#include <string>
#include <utility>

#include "runtime/device/device.h"

namespace furnace::device::testing_util {

class FakeDevice final : public Device {
 public:
  FakeDevice(Kind kind, std::string name) : kind_(kind), name_(std::move(name)) {}

  Kind kind() const override { return kind_; }
  std::string name() const override { return name_; }
  size_t total_memory() const override { return 0; }
  absl::StatusOr<void*> Allocate(size_t) override { return Refused(); }
  void Free(void*) override {}
  absl::StatusOr<void*> AllocateHost(size_t) override { return Refused(); }
  void FreeHost(void*) override {}
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
  NoStream stream_;
};

}  // namespace furnace::device::testing_util
