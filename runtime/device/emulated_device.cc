// The emulated discrete device (emulated_device.h): a memfd mapped PROT_NONE (device pointers) and
// read-write (the streams' view), a first-fit allocator over it, one worker thread per stream.
#include "runtime/device/emulated_device.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "runtime/base/status.h"
#include "runtime/device/current_stream.h"

namespace furnace::device {
namespace {

constexpr size_t kDeviceAlignment = 256;  // cudaMalloc's
constexpr size_t kHostAlignment = 64;

size_t RoundUp(size_t n, size_t to) { return (n + to - 1) / to * to; }

// A record count and a completion count: RecordEvent takes the next generation on the host and the
// stream marks it complete when it gets there; waits are for the generation current at the call.
struct EventState {
  absl::Mutex mu;
  uint64_t recorded ABSL_GUARDED_BY(mu) = 0;
  uint64_t completed ABSL_GUARDED_BY(mu) = 0;

  uint64_t Record() {  // the new record's generation
    absl::MutexLock lock(&mu);
    return ++recorded;
  }
  uint64_t Latest() {  // the generation a wait made now waits for (0: never recorded)
    absl::MutexLock lock(&mu);
    return recorded;
  }
  void Complete(uint64_t generation) {
    absl::MutexLock lock(&mu);
    completed = std::max(completed, generation);
  }

  void WaitFor(uint64_t generation) {
    std::pair<EventState*, uint64_t> arg{this, generation};
    absl::MutexLock lock(&mu);
    mu.Await(absl::Condition(
        +[](std::pair<EventState*, uint64_t>* a)
             ABSL_NO_THREAD_SAFETY_ANALYSIS { return a->first->completed >= a->second; },
        &arg));
  }
};

class EmulatedEvent final : public Event {
 public:
  explicit EmulatedEvent(const void* device)
      : device_(device), state_(std::make_shared<EventState>()) {}
  const void* device() const { return device_; }
  // Shared with the operations enqueued on it, so an event may be destroyed before they run.
  const std::shared_ptr<EventState>& state() const { return state_; }

 private:
  const void* device_;
  std::shared_ptr<EventState> state_;
};

class EmulatedStream final : public Stream {
 public:
  explicit EmulatedStream(EmulatedDevice* device) : device_(device) {
    thread_ = std::thread([this] { Run(); });
  }
  ~EmulatedStream() override {
    {
      absl::MutexLock lock(&mu_);
      paused_ = false;
      stopping_ = true;
    }
    thread_.join();
  }
  void* native() override { return nullptr; }
  EmulatedDevice* device() const { return device_; }

  void Enqueue(std::function<void()> op) {
    absl::MutexLock lock(&mu_);
    queue_.push_back(std::move(op));
    ++enqueued_;
  }
  void SetPaused(bool paused) {
    absl::MutexLock lock(&mu_);
    paused_ = paused;
  }
  // Blocks until everything enqueued before the call has run.
  void Synchronize() {
    absl::MutexLock lock(&mu_);
    std::pair<EmulatedStream*, uint64_t> arg{this, enqueued_};
    mu_.Await(absl::Condition(
        +[](std::pair<EmulatedStream*, uint64_t>* a)
             ABSL_NO_THREAD_SAFETY_ANALYSIS { return a->first->executed_ >= a->second; },
        &arg));
  }

 private:
  bool Ready() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stopping_ || (!paused_ && !queue_.empty());
  }
  void Run() {
    for (;;) {
      std::function<void()> op;
      {
        absl::MutexLock lock(&mu_);
        mu_.Await(absl::Condition(this, &EmulatedStream::Ready));
        if (queue_.empty()) return;  // stopping with nothing left
        op = std::move(queue_.front());
        queue_.pop_front();
      }
      op();
      absl::MutexLock lock(&mu_);
      ++executed_;
    }
  }

  EmulatedDevice* const device_;
  absl::Mutex mu_;
  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);
  uint64_t enqueued_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t executed_ ABSL_GUARDED_BY(mu_) = 0;
  bool paused_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

// The live devices' address ranges, for EmulatedDeviceOwning (the backend finds the device of a
// kernel's pointers when the thread has no current stream).
absl::Mutex registry_mu(absl::kConstInit);
std::vector<EmulatedDevice*>& Registry() ABSL_EXCLUSIVE_LOCKS_REQUIRED(registry_mu) {
  static auto* devices = new std::vector<EmulatedDevice*>();
  return *devices;
}

class EmulatedDeviceImpl final : public EmulatedDevice {
 public:
  EmulatedDeviceImpl(EmulatedDeviceOptions options, int fd, char* device_view, char* rw_view)
      : options_(std::move(options)), fd_(fd), device_view_(device_view), rw_view_(rw_view) {
    free_[0] = options_.memory_bytes;
    default_stream_ = std::make_unique<EmulatedStream>(this);
    absl::MutexLock lock(&registry_mu);
    Registry().push_back(this);
  }
  ~EmulatedDeviceImpl() override {
    {
      absl::MutexLock lock(&registry_mu);
      auto& r = Registry();
      r.erase(std::remove(r.begin(), r.end(), this), r.end());
    }
    default_stream_.reset();
    munmap(device_view_, options_.memory_bytes);
    munmap(rw_view_, options_.memory_bytes);
    close(fd_);
  }

  Kind kind() const override { return Kind::kEmulated; }
  std::string name() const override { return options_.name; }
  size_t total_memory() const override { return options_.memory_bytes; }

  absl::StatusOr<void*> Allocate(size_t bytes) override {
    const size_t rounded = RoundUp(std::max<size_t>(bytes, 1), kDeviceAlignment);
    absl::MutexLock lock(&alloc_mu_);
    for (auto it = free_.begin(); it != free_.end(); ++it) {
      if (it->second < rounded) continue;
      const size_t offset = it->first, left = it->second - rounded;
      free_.erase(it);
      if (left > 0) free_[offset + rounded] = left;
      used_[offset] = rounded;
      allocated_ += rounded;
      return static_cast<void*>(device_view_ + offset);
    }
    return absl::ResourceExhaustedError(
        absl::StrFormat("%s: cannot allocate %d bytes (%d of %d in use)", options_.name, bytes,
                        allocated_, options_.memory_bytes));
  }
  void Free(void* ptr) override {
    if (ptr == nullptr) return;
    if (!Owns(ptr, 1)) {
      SetStickyError(absl::InvalidArgumentError(
          absl::StrFormat("%s: Free of %p, which is not device memory", options_.name, ptr)));
      return;
    }
    const size_t offset = static_cast<char*>(ptr) - device_view_;
    size_t size = 0;
    {
      // Checked at the call (a double free or a pointer inside an allocation is the caller's
      // error now, not when the stream gets there); the bytes stay out of the holes until then.
      absl::MutexLock lock(&alloc_mu_);
      auto used = used_.find(offset);
      if (used == used_.end()) {
        SetStickyError(absl::InvalidArgumentError(absl::StrFormat(
            "%s: Free of %p, which is not the start of a live allocation", options_.name, ptr)));
        return;
      }
      size = used->second;
      used_.erase(used);
    }
    // Stream-ordered: the bytes go back when the stream gets past the work enqueued so far.
    EmulatedStream* stream = default_stream_.get();
    if (Stream* current = CurrentStream(); current != nullptr) {
      auto* s = dynamic_cast<EmulatedStream*>(current);
      if (s != nullptr && s->device() == this) stream = s;
    }
    stream->Enqueue([this, offset, size] { Release(offset, size); });
  }
  bool IsDeviceMemory(const void* ptr) const override { return ptr != nullptr && Owns(ptr, 1); }

  // Gives a freed allocation's bytes back to the first-fit allocator (Free's stream op).
  void Release(size_t offset, size_t size) {
    absl::MutexLock lock(&alloc_mu_);
    allocated_ -= size;
    // Coalesce with the neighbouring holes.
    auto next = free_.lower_bound(offset);
    if (next != free_.end() && offset + size == next->first) {
      size += next->second;
      next = free_.erase(next);
    }
    if (next != free_.begin()) {
      auto prev = std::prev(next);
      if (prev->first + prev->second == offset) {
        prev->second += size;
        return;
      }
    }
    free_[offset] = size;
  }
  absl::StatusOr<void*> AllocateHost(size_t bytes) override {
    const size_t rounded = RoundUp(std::max<size_t>(bytes, 1), kHostAlignment);
    void* ptr = std::aligned_alloc(kHostAlignment, rounded);
    if (ptr == nullptr) {
      return absl::ResourceExhaustedError(
          absl::StrFormat("%s: cannot allocate %d bytes of host memory", options_.name, bytes));
    }
    absl::MutexLock lock(&host_mu_);
    host_[reinterpret_cast<uintptr_t>(ptr)] = HostBlock{rounded};
    return ptr;
  }
  // Not stream-ordered (device.h): a block freed while a copy enqueued on it has not run is the
  // caller's error, which the emulated device reports as its sticky error (on a GPU the copy would
  // read or write freed memory). The bytes then stay allocated until the last such copy has run,
  // so the test that finds the error does not corrupt the heap too.
  void FreeHost(void* ptr) override {
    if (ptr == nullptr) return;
    absl::MutexLock lock(&host_mu_);
    auto it = host_.find(reinterpret_cast<uintptr_t>(ptr));
    if (it == host_.end() || it->second.freed) {
      SetStickyError(absl::InvalidArgumentError(absl::StrFormat(
          "%s: FreeHost of %p, which is not a live block of AllocateHost", options_.name, ptr)));
      return;
    }
    if (it->second.pending > 0) {
      SetStickyError(absl::FailedPreconditionError(absl::StrFormat(
          "%s: FreeHost of %p while %d copies enqueued on a stream still read or write it (free "
          "pinned memory once the stream has passed its copies: an event or a stream synchronize)",
          options_.name, ptr, it->second.pending)));
      it->second.freed = true;
      return;
    }
    host_.erase(it);
    std::free(ptr);
  }

  absl::StatusOr<std::unique_ptr<Stream>> CreateStream() override {
    return std::unique_ptr<Stream>(new EmulatedStream(this));
  }
  absl::StatusOr<std::unique_ptr<Event>> CreateEvent() override {
    return std::unique_ptr<Event>(new EmulatedEvent(this));
  }

  absl::Status Copy(void* dst, const void* src, size_t bytes, CopyKind kind,
                    Stream& stream) override {
    ASSIGN_OR_RETURN(EmulatedStream * s, StreamOf(stream));
    if (bytes == 0) return absl::OkStatus();
    if (dst == nullptr || src == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(options_.name, ": copy of null"));
    }
    const bool dst_device = kind == CopyKind::kHostToDevice || kind == CopyKind::kDeviceToDevice;
    const bool src_device = kind == CopyKind::kDeviceToHost || kind == CopyKind::kDeviceToDevice;
    if (absl::Status st = CheckSide("destination", dst, bytes, dst_device, kind); !st.ok()) {
      return st;
    }
    if (absl::Status st = CheckSide("source", src, bytes, src_device, kind); !st.ok()) return st;
    void* to = dst_device ? Translate(dst) : dst;
    const void* from = src_device ? Translate(src) : src;
    ASSIGN_OR_RETURN(const uintptr_t dst_block, HoldHostBlock(dst_device ? nullptr : dst, bytes));
    absl::StatusOr<uintptr_t> src_block = HoldHostBlock(src_device ? nullptr : src, bytes);
    if (!src_block.ok()) {
      ReleaseHostBlock(dst_block);
      return src_block.status();
    }
    s->Enqueue([this, to, from, bytes, dst_block, src_block = *src_block] {
      std::memmove(to, from, bytes);
      ReleaseHostBlock(dst_block);
      ReleaseHostBlock(src_block);
    });
    return absl::OkStatus();
  }
  absl::Status Memset(void* dst, int value, size_t bytes, Stream& stream) override {
    ASSIGN_OR_RETURN(EmulatedStream * s, StreamOf(stream));
    if (bytes == 0) return absl::OkStatus();
    if (!Owns(dst, bytes)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: memset of %p (%d bytes), which is not device memory", options_.name, dst, bytes));
    }
    void* to = Translate(dst);
    s->Enqueue([to, value, bytes] { std::memset(to, value, bytes); });
    return absl::OkStatus();
  }
  absl::Status RecordEvent(Event& event, Stream& stream) override {
    ASSIGN_OR_RETURN(EmulatedStream * s, StreamOf(stream));
    ASSIGN_OR_RETURN(std::shared_ptr<EventState> e, EventOf(event));
    const uint64_t generation = e->Record();
    s->Enqueue([e, generation] { e->Complete(generation); });
    return absl::OkStatus();
  }
  absl::Status WaitEvent(Stream& stream, Event& event) override {
    ASSIGN_OR_RETURN(EmulatedStream * s, StreamOf(stream));
    ASSIGN_OR_RETURN(std::shared_ptr<EventState> e, EventOf(event));
    const uint64_t generation = e->Latest();
    if (generation > 0) s->Enqueue([e, generation] { e->WaitFor(generation); });
    return absl::OkStatus();
  }
  absl::Status SynchronizeEvent(Event& event) override {
    ASSIGN_OR_RETURN(std::shared_ptr<EventState> e, EventOf(event));
    e->WaitFor(e->Latest());
    return sticky_error();
  }
  absl::Status SynchronizeStream(Stream& stream) override {
    ASSIGN_OR_RETURN(EmulatedStream * s, StreamOf(stream));
    s->Synchronize();
    return sticky_error();
  }

  absl::Status PauseStream(Stream& stream) override {
    ASSIGN_OR_RETURN(EmulatedStream * s, StreamOf(stream));
    s->SetPaused(true);
    return absl::OkStatus();
  }
  absl::Status ResumeStream(Stream& stream) override {
    ASSIGN_OR_RETURN(EmulatedStream * s, StreamOf(stream));
    s->SetPaused(false);
    return absl::OkStatus();
  }
  absl::Status Launch(Stream& stream, std::function<void()> op) override {
    ASSIGN_OR_RETURN(EmulatedStream * s, StreamOf(stream));
    launches_.fetch_add(1, std::memory_order_relaxed);
    if (options_.min_op_seconds > 0) {
      op = [op = std::move(op), seconds = options_.min_op_seconds] {
        const auto until = std::chrono::steady_clock::now() +
                           std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                               std::chrono::duration<double>(seconds));
        op();
        std::this_thread::sleep_until(until);
      };
    }
    s->Enqueue(std::move(op));
    return absl::OkStatus();
  }
  uint64_t launches() const override { return launches_.load(std::memory_order_relaxed); }
  Stream& default_stream() override { return *default_stream_; }

  bool Owns(const void* ptr, size_t bytes) const override {
    const char* p = static_cast<const char*>(ptr);
    return p >= device_view_ && bytes <= options_.memory_bytes &&
           p <= device_view_ + (options_.memory_bytes - bytes);
  }
  void* Translate(const void* ptr) const override {
    if (ptr == nullptr) return nullptr;
    return rw_view_ + (static_cast<const char*>(ptr) - device_view_);
  }
  void SetStickyError(absl::Status error) override {
    absl::MutexLock lock(&error_mu_);
    if (sticky_.ok()) sticky_ = std::move(error);
  }
  absl::Status sticky_error() const override {
    absl::MutexLock lock(&error_mu_);
    return sticky_;
  }
  size_t allocated_bytes() const override {
    absl::MutexLock lock(&alloc_mu_);
    return allocated_;
  }

 private:
  absl::StatusOr<EmulatedStream*> StreamOf(Stream& stream) {
    auto* s = dynamic_cast<EmulatedStream*>(&stream);
    if (s == nullptr || s->device() != this) {
      return absl::InvalidArgumentError(
          absl::StrCat(options_.name, ": stream belongs to another device"));
    }
    return s;
  }
  absl::StatusOr<std::shared_ptr<EventState>> EventOf(Event& event) {
    auto* e = dynamic_cast<EmulatedEvent*>(&event);
    if (e == nullptr || e->device() != this) {
      return absl::InvalidArgumentError(
          absl::StrCat(options_.name, ": event belongs to another device"));
    }
    return e->state();
  }
  // The AllocateHost block holding [ptr, ptr + bytes), its pending copies counted up by one; 0 for
  // pageable host memory (no block holds ptr) and for nullptr. InvalidArgument for a copy that
  // starts in a block and runs past its end.
  absl::StatusOr<uintptr_t> HoldHostBlock(const void* ptr, size_t bytes) {
    if (ptr == nullptr) return 0;
    const auto p = reinterpret_cast<uintptr_t>(ptr);
    absl::MutexLock lock(&host_mu_);
    auto it = host_.upper_bound(p);
    if (it == host_.begin()) return 0;
    --it;
    if (p >= it->first + it->second.bytes) return 0;
    if (it->second.freed) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: copy of %d bytes at %p, in a host block already freed", options_.name, bytes, ptr));
    }
    if (bytes > it->first + it->second.bytes - p) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s: copy of %d bytes at %p runs past the end of its %d-byte host block",
                          options_.name, bytes, ptr, it->second.bytes));
    }
    ++it->second.pending;
    return it->first;
  }
  // A copy held by HoldHostBlock has run: the block freed while it was pending goes now.
  void ReleaseHostBlock(uintptr_t block) {
    if (block == 0) return;
    absl::MutexLock lock(&host_mu_);
    auto it = host_.find(block);
    if (it == host_.end()) return;
    if (--it->second.pending > 0 || !it->second.freed) return;
    host_.erase(it);
    std::free(reinterpret_cast<void*>(block));
  }

  absl::Status CheckSide(const char* side, const void* ptr, size_t bytes, bool want_device,
                         CopyKind kind) const {
    if (Owns(ptr, bytes) == want_device) return absl::OkStatus();
    static constexpr const char* kKinds[] = {"host->device", "device->host", "device->device",
                                             "host->host"};
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: %s copy of %d bytes: the %s %p is %s memory, not %s memory",
                        options_.name, kKinds[static_cast<int>(kind)], bytes, side, ptr,
                        want_device ? "host" : "device", want_device ? "device" : "host"));
  }

  const EmulatedDeviceOptions options_;
  const int fd_;
  char* const device_view_;  // PROT_NONE: the addresses handed out
  char* const rw_view_;      // read-write: the same pages, for the streams
  std::atomic<uint64_t> launches_{0};
  mutable absl::Mutex alloc_mu_;
  std::map<size_t, size_t> free_ ABSL_GUARDED_BY(alloc_mu_);  // offset -> bytes
  std::map<size_t, size_t> used_ ABSL_GUARDED_BY(alloc_mu_);  // offset -> bytes
  size_t allocated_ ABSL_GUARDED_BY(alloc_mu_) = 0;
  // The live blocks of AllocateHost, by address, with the copies enqueued on them not yet run.
  struct HostBlock {
    size_t bytes = 0;
    int pending = 0;
    bool freed = false;  // FreeHost came while copies were pending: freed after the last one
  };
  absl::Mutex host_mu_;
  std::map<uintptr_t, HostBlock> host_ ABSL_GUARDED_BY(host_mu_);
  mutable absl::Mutex error_mu_;
  absl::Status sticky_ ABSL_GUARDED_BY(error_mu_);
  std::unique_ptr<EmulatedStream> default_stream_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<EmulatedDevice>> CreateEmulatedDevice(
    EmulatedDeviceOptions options) {
  if (options.memory_bytes == 0) {
    return absl::InvalidArgumentError("emulated device: memory_bytes must be > 0");
  }
  if (!(options.min_op_seconds >= 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("emulated device: min_op_seconds ", options.min_op_seconds, " must be >= 0"));
  }
  options.memory_bytes = RoundUp(options.memory_bytes, static_cast<size_t>(getpagesize()));
  const int fd = memfd_create("furnace-emulated-device", MFD_CLOEXEC);
  if (fd < 0) {
    return absl::UnavailableError(
        absl::StrCat("emulated device: memfd_create: ", std::strerror(errno)));
  }
  if (ftruncate(fd, static_cast<off_t>(options.memory_bytes)) != 0) {
    const int err = errno;
    close(fd);
    return absl::ResourceExhaustedError(absl::StrCat(
        "emulated device: ftruncate to ", options.memory_bytes, " bytes: ", std::strerror(err)));
  }
  void* device_view = mmap(nullptr, options.memory_bytes, PROT_NONE, MAP_SHARED, fd, 0);
  void* rw_view = device_view == MAP_FAILED ? MAP_FAILED
                                            : mmap(nullptr, options.memory_bytes,
                                                   PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (device_view == MAP_FAILED || rw_view == MAP_FAILED) {
    const int err = errno;
    if (device_view != MAP_FAILED) munmap(device_view, options.memory_bytes);
    close(fd);
    return absl::ResourceExhaustedError(absl::StrCat(
        "emulated device: mmap of ", options.memory_bytes, " bytes: ", std::strerror(err)));
  }
  return std::unique_ptr<EmulatedDevice>(new EmulatedDeviceImpl(
      std::move(options), fd, static_cast<char*>(device_view), static_cast<char*>(rw_view)));
}

EmulatedDevice* EmulatedDeviceOf(Stream& stream) {
  auto* s = dynamic_cast<EmulatedStream*>(&stream);
  return s == nullptr ? nullptr : s->device();
}

EmulatedDevice* EmulatedDeviceOwning(const void* ptr) {
  absl::MutexLock lock(&registry_mu);
  for (EmulatedDevice* d : Registry()) {
    if (d->Owns(ptr)) return d;
  }
  return nullptr;
}

}  // namespace furnace::device
