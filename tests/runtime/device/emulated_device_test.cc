// The emulated discrete device: memory the host cannot read (a dereference faults), copies only
// through the Device interface and checked for their direction, operations that run later on the
// stream's thread, and events between streams, whose absence shows up as a wrong result (made
// deterministic by pausing the producing stream).
#include "runtime/device/emulated_device.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "runtime/device/current_stream.h"

namespace furnace::device {
namespace {

class EmulatedDeviceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    EmulatedDeviceOptions options;
    options.memory_bytes = 1 << 20;
    auto dev = CreateEmulatedDevice(options);
    ASSERT_TRUE(dev.ok()) << dev.status();
    dev_ = std::move(*dev);
    a_ = NewStream();
    b_ = NewStream();
  }
  std::unique_ptr<Stream> NewStream() {
    auto s = dev_->CreateStream();
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? std::move(*s) : nullptr;
  }
  float* Alloc(size_t n) {
    auto p = dev_->Allocate(n * sizeof(float));
    EXPECT_TRUE(p.ok()) << p.status();
    return p.ok() ? static_cast<float*>(*p) : nullptr;
  }
  std::vector<float> Read(const float* d, size_t n, Stream& s) {
    std::vector<float> out(n, -1.0f);
    EXPECT_TRUE(dev_->Copy(out.data(), d, n * sizeof(float), CopyKind::kDeviceToHost, s).ok());
    EXPECT_TRUE(dev_->SynchronizeStream(s).ok());
    return out;
  }

  std::unique_ptr<EmulatedDevice> dev_;
  std::unique_ptr<Stream> a_, b_;
};

TEST_F(EmulatedDeviceTest, DescribesItself) {
  EXPECT_EQ(dev_->kind(), Kind::kEmulated);
  EXPECT_EQ(dev_->name(), "emulated");
  EXPECT_EQ(dev_->total_memory(), size_t{1} << 20);
  EXPECT_EQ(a_->native(), nullptr);
  EXPECT_EQ(EmulatedDeviceOf(*a_), dev_.get());
}

TEST_F(EmulatedDeviceTest, CopiesRoundTripThroughTheDevice) {
  std::vector<float> host(1000);
  std::iota(host.begin(), host.end(), 0.5f);
  float* d = Alloc(host.size());
  float* e = Alloc(host.size());
  ASSERT_TRUE(dev_->Owns(d, host.size() * sizeof(float)));
  EXPECT_EQ(EmulatedDeviceOwning(d), dev_.get());
  EXPECT_EQ(EmulatedDeviceOwning(host.data()), nullptr);
  ASSERT_TRUE(dev_->Copy(d, host.data(), host.size() * 4, CopyKind::kHostToDevice, *a_).ok());
  ASSERT_TRUE(dev_->Copy(e, d, host.size() * 4, CopyKind::kDeviceToDevice, *a_).ok());
  EXPECT_EQ(Read(e, host.size(), *a_), host);
  ASSERT_TRUE(dev_->Memset(e, 0, 8, *a_).ok());
  std::vector<float> want = host;
  want[0] = want[1] = 0.0f;
  EXPECT_EQ(Read(e, host.size(), *a_), want);
  dev_->Free(d);
  dev_->Free(e);
  ASSERT_TRUE(dev_->SynchronizeStream(dev_->default_stream()).ok());  // Free is stream-ordered
  EXPECT_EQ(dev_->allocated_bytes(), 0u);
}

// Free is stream-ordered (device.h): scratch freed by the host right after it enqueued the kernel
// that reads it is still intact when that kernel runs, and the bytes are reused only after it.
TEST_F(EmulatedDeviceTest, FreeWaitsForTheWorkAlreadyOnTheStream) {
  std::vector<float> host(256, 3.0f);
  float* scratch = Alloc(host.size());
  float* out = Alloc(host.size());
  ASSERT_TRUE(dev_->PauseStream(*a_).ok());
  ASSERT_TRUE(dev_->Copy(scratch, host.data(), host.size() * 4, CopyKind::kHostToDevice, *a_).ok());
  ASSERT_TRUE(dev_->Copy(out, scratch, host.size() * 4, CopyKind::kDeviceToDevice, *a_).ok());
  {
    StreamScope on_a(*a_);
    dev_->Free(scratch);  // enqueued on a_, behind the two copies
  }
  EXPECT_TRUE(dev_->IsDeviceMemory(scratch));
  EXPECT_FALSE(dev_->IsDeviceMemory(host.data()));
  // Not returned yet: a new allocation cannot land on the scratch's bytes while a_ is held.
  float* other = Alloc(host.size());
  EXPECT_NE(other, scratch);
  EXPECT_GE(dev_->allocated_bytes(), 3 * host.size() * sizeof(float));
  ASSERT_TRUE(dev_->ResumeStream(*a_).ok());
  EXPECT_EQ(Read(out, host.size(), *a_), host);
  dev_->Free(out);
  dev_->Free(other);
  ASSERT_TRUE(dev_->SynchronizeStream(dev_->default_stream()).ok());
  EXPECT_EQ(dev_->allocated_bytes(), 0u);
}

// FreeHost is not stream-ordered (device.h): pinned memory freed while a copy enqueued on it has
// not run is reported as the sticky error (on a GPU the copy would touch freed memory), and the
// bytes stay until that copy has run; freed after the stream has passed its copies, it is fine. A
// copy that runs past the end of its pinned block is refused at the call.
TEST_F(EmulatedDeviceTest, PinnedMemoryFreedBeforeItsCopiesRanIsAnError) {
  float* d = Alloc(64);
  auto pinned = dev_->AllocateHost(64 * sizeof(float));
  ASSERT_TRUE(pinned.ok()) << pinned.status();
  auto* p = static_cast<float*>(*pinned);
  std::fill(p, p + 64, 2.5f);
  EXPECT_EQ(dev_->Copy(d, p + 32, 64 * sizeof(float), CopyKind::kHostToDevice, *a_).code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(dev_->Copy(d, p, 64 * sizeof(float), CopyKind::kHostToDevice, *a_).ok());
  ASSERT_TRUE(dev_->SynchronizeStream(*a_).ok());
  dev_->FreeHost(p);  // the copy has run
  EXPECT_TRUE(dev_->sticky_error().ok()) << dev_->sticky_error();

  auto again = dev_->AllocateHost(64 * sizeof(float));
  ASSERT_TRUE(again.ok()) << again.status();
  auto* q = static_cast<float*>(*again);
  ASSERT_TRUE(dev_->PauseStream(*a_).ok());
  ASSERT_TRUE(dev_->Copy(q, d, 64 * sizeof(float), CopyKind::kDeviceToHost, *a_).ok());
  dev_->FreeHost(q);  // the copy is still queued
  EXPECT_EQ(dev_->sticky_error().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(dev_->sticky_error().message().find("FreeHost"), std::string::npos)
      << dev_->sticky_error();
  ASSERT_TRUE(dev_->ResumeStream(*a_).ok());  // the copy writes bytes still allocated
  EXPECT_FALSE(dev_->SynchronizeStream(*a_).ok());
  dev_->Free(d);
}

// Device pointers lie in a PROT_NONE mapping: host code that reads one dies, as it would reading
// GPU memory, so a host access the device interface does not go through cannot pass unnoticed.
TEST_F(EmulatedDeviceTest, HostDereferenceOfDeviceMemoryFaults) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  float* d = Alloc(16);
  ASSERT_NE(d, nullptr);
  EXPECT_DEATH(
      {
        volatile float* p = d;
        std::fprintf(stderr, "read %f\n", static_cast<double>(p[3]));
      },
      "");
}

TEST_F(EmulatedDeviceTest, CopiesAreCheckedForTheirDirection) {
  std::vector<float> host(4, 1.0f), other(4);
  float* d = Alloc(4);
  absl::Status s = dev_->Copy(host.data(), other.data(), 16, CopyKind::kHostToDevice, *a_);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(s.message()).find("host->device copy"), std::string::npos) << s;
  EXPECT_NE(std::string(s.message()).find("destination"), std::string::npos) << s;
  s = dev_->Copy(host.data(), d, 16, CopyKind::kHostToDevice, *a_);  // device as the source
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  s = dev_->Copy(d, host.data(), 16, CopyKind::kDeviceToHost, *a_);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  s = dev_->Copy(d, d, 1 << 21, CopyKind::kDeviceToDevice, *a_);  // past the end of the memory
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_EQ(dev_->Memset(host.data(), 0, 16, *a_).code(), absl::StatusCode::kInvalidArgument);

  auto other_dev = CreateEmulatedDevice({.memory_bytes = 1 << 16, .name = "emulated:1"});
  ASSERT_TRUE(other_dev.ok());
  auto foreign = (*other_dev)->CreateStream();
  ASSERT_TRUE(foreign.ok());
  s = dev_->Copy(d, host.data(), 16, CopyKind::kHostToDevice, **foreign);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(s.message()).find("another device"), std::string::npos) << s;
}

TEST_F(EmulatedDeviceTest, AllocatorRefusesPastCapacityAndCoalescesFreedMemory) {
  auto whole = dev_->Allocate(1 << 20);
  ASSERT_TRUE(whole.ok()) << whole.status();
  auto more = dev_->Allocate(1);
  EXPECT_EQ(more.status().code(), absl::StatusCode::kResourceExhausted);
  dev_->Free(*whole);
  ASSERT_TRUE(dev_->SynchronizeStream(dev_->default_stream()).ok());  // Free is stream-ordered
  std::vector<void*> quarters;
  for (int i = 0; i < 4; ++i) {
    auto q = dev_->Allocate(1 << 18);
    ASSERT_TRUE(q.ok()) << q.status();
    EXPECT_EQ(reinterpret_cast<uintptr_t>(*q) % 256, 0u);
    quarters.push_back(*q);
  }
  // Freed out of order, the holes merge back into one that fits the whole capacity.
  for (int i : {2, 0, 3, 1}) dev_->Free(quarters[i]);
  ASSERT_TRUE(dev_->SynchronizeStream(dev_->default_stream()).ok());
  EXPECT_TRUE(dev_->Allocate(1 << 20).ok());
  EXPECT_TRUE(dev_->sticky_error().ok());
  dev_->Free(static_cast<char*>(quarters[0]) + 256);  // not the start of an allocation
  EXPECT_EQ(dev_->sticky_error().code(), absl::StatusCode::kInvalidArgument);
}

// An operation enqueued on a stream runs later: while the stream is held, the destination still
// has its old bytes; SynchronizeStream returns once the queue has run.
TEST_F(EmulatedDeviceTest, OperationsRunLaterInStreamOrder) {
  float* d = Alloc(4);
  std::vector<float> zeros(4, 0.0f), ones(4, 1.0f), twos(4, 2.0f), out(4, -1.0f);
  ASSERT_TRUE(dev_->Copy(d, zeros.data(), 16, CopyKind::kHostToDevice, *a_).ok());
  ASSERT_TRUE(dev_->SynchronizeStream(*a_).ok());
  ASSERT_TRUE(dev_->PauseStream(*a_).ok());
  ASSERT_TRUE(dev_->Copy(d, ones.data(), 16, CopyKind::kHostToDevice, *a_).ok());
  ASSERT_TRUE(dev_->Copy(d, twos.data(), 16, CopyKind::kHostToDevice, *a_).ok());
  ASSERT_TRUE(dev_->Copy(out.data(), d, 16, CopyKind::kDeviceToHost, *a_).ok());
  EXPECT_EQ(Read(d, 4, *b_), zeros);  // another stream sees the bytes before the held copies
  EXPECT_EQ(out, std::vector<float>(4, -1.0f));
  ASSERT_TRUE(dev_->ResumeStream(*a_).ok());
  ASSERT_TRUE(dev_->SynchronizeStream(*a_).ok());
  EXPECT_EQ(out, twos);  // in order: the last write wins, the read sees it
}

// The producer stream writes a buffer, the consumer stream copies it out. With the event between
// them the consumer reads the producer's bytes; without it the consumer runs ahead and reads the
// old ones. The producer is held until the consumer is done (or waiting), so both outcomes are
// certain, not a matter of timing.
TEST_F(EmulatedDeviceTest, AMissingWaitEventBetweenStreamsGivesAWrongResult) {
  float* d = Alloc(4);
  std::vector<float> old_bytes(4, 7.0f), new_bytes(4, 9.0f);
  for (bool with_event : {true, false}) {
    SCOPED_TRACE(with_event ? "with WaitEvent" : "without WaitEvent");
    ASSERT_TRUE(dev_->Copy(d, old_bytes.data(), 16, CopyKind::kHostToDevice, *a_).ok());
    ASSERT_TRUE(dev_->SynchronizeStream(*a_).ok());
    auto written = dev_->CreateEvent();
    ASSERT_TRUE(written.ok());
    ASSERT_TRUE(dev_->PauseStream(*a_).ok());
    ASSERT_TRUE(dev_->Copy(d, new_bytes.data(), 16, CopyKind::kHostToDevice, *a_).ok());
    ASSERT_TRUE(dev_->RecordEvent(**written, *a_).ok());
    if (with_event) {
      ASSERT_TRUE(dev_->WaitEvent(*b_, **written).ok());
    }
    std::vector<float> out(4, -1.0f);
    ASSERT_TRUE(dev_->Copy(out.data(), d, 16, CopyKind::kDeviceToHost, *b_).ok());
    std::atomic<bool> consumer_done{false};
    std::thread consumer([&] {
      EXPECT_TRUE(dev_->SynchronizeStream(*b_).ok());
      consumer_done = true;
    });
    if (!with_event) {
      while (!consumer_done) absl::SleepFor(absl::Milliseconds(1));  // done with a held producer
    }
    ASSERT_TRUE(dev_->ResumeStream(*a_).ok());
    consumer.join();
    EXPECT_EQ(out, with_event ? new_bytes : old_bytes);
    ASSERT_TRUE(dev_->SynchronizeEvent(**written).ok());
  }
}

TEST_F(EmulatedDeviceTest, SynchronizeEventWaitsForTheLatestRecord) {
  auto ev = dev_->CreateEvent();
  ASSERT_TRUE(ev.ok());
  EXPECT_TRUE(dev_->SynchronizeEvent(**ev).ok());  // never recorded: complete
  EXPECT_TRUE(dev_->WaitEvent(*b_, **ev).ok());    // and waiting on it is a no-op
  EXPECT_TRUE(dev_->SynchronizeStream(*b_).ok());

  float* d = Alloc(1);
  float one = 1.0f, out = 0.0f;
  ASSERT_TRUE(dev_->PauseStream(*a_).ok());
  ASSERT_TRUE(dev_->Copy(d, &one, 4, CopyKind::kHostToDevice, *a_).ok());
  ASSERT_TRUE(dev_->Copy(&out, d, 4, CopyKind::kDeviceToHost, *a_).ok());
  ASSERT_TRUE(dev_->RecordEvent(**ev, *a_).ok());
  std::atomic<bool> synced{false};
  std::thread host([&] {
    EXPECT_TRUE(dev_->SynchronizeEvent(**ev).ok());
    synced = true;
  });
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_FALSE(synced.load());  // the record is held behind the paused stream
  ASSERT_TRUE(dev_->ResumeStream(*a_).ok());
  host.join();
  EXPECT_EQ(out, 1.0f);  // what the stream did before the record is done
}

TEST_F(EmulatedDeviceTest, DestroyingAHeldStreamRunsItsQueue) {
  float* d = Alloc(1);
  float seven = 7.0f;
  std::unique_ptr<Stream> s = NewStream();
  ASSERT_TRUE(dev_->PauseStream(*s).ok());
  ASSERT_TRUE(dev_->Copy(d, &seven, 4, CopyKind::kHostToDevice, *s).ok());
  s.reset();
  EXPECT_EQ(Read(d, 1, *a_), std::vector<float>{7.0f});
}

TEST_F(EmulatedDeviceTest, BadOptionsAreRefused) {
  EXPECT_EQ(CreateEmulatedDevice({.memory_bytes = 0}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CreateEmulatedDevice({.min_op_seconds = -1}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// A slower device: each launched operation occupies its stream at least min_op_seconds, while
// the host's Launch returns at once; launches() counts them.
TEST_F(EmulatedDeviceTest, ASlowerDeviceHoldsEachOperation) {
  auto slow = CreateEmulatedDevice({.memory_bytes = 1 << 20, .min_op_seconds = 0.01});
  ASSERT_TRUE(slow.ok()) << slow.status();
  auto stream = (*slow)->CreateStream();
  ASSERT_TRUE(stream.ok());
  std::atomic<int> ran{0};
  const absl::Time t0 = absl::Now();
  for (int i = 0; i < 5; ++i) ASSERT_TRUE((*slow)->Launch(**stream, [&] { ++ran; }).ok());
  EXPECT_EQ((*slow)->launches(), 5u);
  ASSERT_TRUE((*slow)->SynchronizeStream(**stream).ok());
  EXPECT_EQ(ran.load(), 5);
  EXPECT_GE(absl::Now() - t0, absl::Milliseconds(50));
}

}  // namespace
}  // namespace furnace::device
