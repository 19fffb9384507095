// The CPU device: 64-byte aligned heap memory and synchronous copies. Streams and events exist only
// so that callers are written once for every device; on the CPU every operation has completed when
// it returns, so recording, waiting and synchronising are no-ops, and Free is immediate (which the
// stream-ordered contract allows: nothing is still queued).
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include "absl/strings/str_format.h"
#include "runtime/device/device.h"

namespace furnace::device {
namespace {

constexpr size_t kAlignment = 64;

class CpuStream final : public Stream {
 public:
  void* native() override { return nullptr; }
};

class CpuEvent final : public Event {};

absl::StatusOr<void*> AlignedAllocate(size_t bytes) {
  // aligned_alloc wants a multiple of the alignment; a zero-byte request still gets a unique
  // pointer.
  size_t rounded = bytes == 0 ? kAlignment : (bytes + kAlignment - 1) / kAlignment * kAlignment;
  if (rounded < bytes) return absl::ResourceExhaustedError("cpu: allocation size overflows");
  void* ptr = std::aligned_alloc(kAlignment, rounded);
  if (ptr == nullptr) {
    return absl::ResourceExhaustedError(absl::StrFormat("cpu: cannot allocate %d bytes", bytes));
  }
  return ptr;
}

absl::Status CheckStream(Stream& stream) {
  if (dynamic_cast<CpuStream*>(&stream) == nullptr) {
    return absl::InvalidArgumentError("cpu device: stream belongs to another device");
  }
  return absl::OkStatus();
}

absl::Status CheckEvent(Event& event) {
  if (dynamic_cast<CpuEvent*>(&event) == nullptr) {
    return absl::InvalidArgumentError("cpu device: event belongs to another device");
  }
  return absl::OkStatus();
}

class CpuDevice final : public Device {
 public:
  Kind kind() const override { return Kind::kCpu; }
  std::string name() const override { return "cpu"; }
  size_t total_memory() const override {
    long pages = sysconf(_SC_PHYS_PAGES);
    long page_size = sysconf(_SC_PAGE_SIZE);
    if (pages <= 0 || page_size <= 0) return 0;
    return static_cast<size_t>(pages) * static_cast<size_t>(page_size);
  }

  absl::StatusOr<void*> Allocate(size_t bytes) override { return AlignedAllocate(bytes); }
  void Free(void* ptr) override { std::free(ptr); }
  absl::StatusOr<void*> AllocateHost(size_t bytes) override { return AlignedAllocate(bytes); }
  void FreeHost(void* ptr) override { std::free(ptr); }

  bool IsDeviceMemory(const void* /*ptr*/) const override { return false; }
  Stream& default_stream() override { return default_stream_; }
  absl::StatusOr<std::unique_ptr<Stream>> CreateStream() override {
    return std::unique_ptr<Stream>(new CpuStream());
  }
  absl::StatusOr<std::unique_ptr<Event>> CreateEvent() override {
    return std::unique_ptr<Event>(new CpuEvent());
  }

  absl::Status Copy(void* dst, const void* src, size_t bytes, CopyKind /*kind*/,
                    Stream& stream) override {
    if (absl::Status s = CheckStream(stream); !s.ok()) return s;
    if (bytes == 0) return absl::OkStatus();
    if (dst == nullptr || src == nullptr) return absl::InvalidArgumentError("cpu: copy of null");
    std::memmove(dst, src, bytes);
    return absl::OkStatus();
  }
  absl::Status Memset(void* dst, int value, size_t bytes, Stream& stream) override {
    if (absl::Status s = CheckStream(stream); !s.ok()) return s;
    if (bytes == 0) return absl::OkStatus();
    if (dst == nullptr) return absl::InvalidArgumentError("cpu: memset of null");
    std::memset(dst, value, bytes);
    return absl::OkStatus();
  }
  absl::Status RecordEvent(Event& event, Stream& stream) override {
    if (absl::Status s = CheckEvent(event); !s.ok()) return s;
    return CheckStream(stream);
  }
  absl::Status WaitEvent(Stream& stream, Event& event) override {
    if (absl::Status s = CheckEvent(event); !s.ok()) return s;
    return CheckStream(stream);
  }
  absl::Status SynchronizeEvent(Event& event) override { return CheckEvent(event); }
  absl::Status SynchronizeStream(Stream& stream) override { return CheckStream(stream); }

 private:
  CpuStream default_stream_;
};

}  // namespace

std::unique_ptr<Device> CreateCpuDevice() { return std::make_unique<CpuDevice>(); }

}  // namespace furnace::device
