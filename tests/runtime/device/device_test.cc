// Device interface: the CPU device (always), and the CUDA device where a GPU is present (the
// CudaDevice* cases skip themselves, saying why, on machines without one or in CPU-only builds):
// copies on streams with events, IsDeviceMemory, stream-ordered Free, the sticky error and the
// lookups of cuda_device.h. Without CUDA those lookups find nothing.
#include "runtime/device/device.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <numeric>
#include <vector>

#include "runtime/device/cuda_device.h"
#include "runtime/device/current_stream.h"

namespace furnace::device {
namespace {

TEST(CpuDeviceTest, DescribesItself) {
  auto dev = CreateCpuDevice();
  EXPECT_EQ(dev->kind(), Kind::kCpu);
  EXPECT_EQ(dev->name(), "cpu");
  EXPECT_GT(dev->total_memory(), size_t{0});
}

TEST(CpuDeviceTest, AllocatesAligned) {
  auto dev = CreateCpuDevice();
  for (size_t bytes :
       {size_t{0}, size_t{1}, size_t{63}, size_t{64}, size_t{1000}, size_t{1} << 20}) {
    auto ptr = dev->Allocate(bytes);
    ASSERT_TRUE(ptr.ok()) << ptr.status();
    EXPECT_EQ(reinterpret_cast<uintptr_t>(*ptr) % 64, 0u) << bytes;
    dev->Free(*ptr);
    auto host = dev->AllocateHost(bytes);
    ASSERT_TRUE(host.ok()) << host.status();
    EXPECT_EQ(reinterpret_cast<uintptr_t>(*host) % 64, 0u) << bytes;
    dev->FreeHost(*host);
  }
  dev->Free(nullptr);
  dev->FreeHost(nullptr);
}

TEST(CpuDeviceTest, HugeAllocationIsResourceExhausted) {
  auto dev = CreateCpuDevice();
  auto ptr = dev->Allocate(~size_t{0} - 8);
  ASSERT_FALSE(ptr.ok());
  EXPECT_EQ(ptr.status().code(), absl::StatusCode::kResourceExhausted) << ptr.status();
}

TEST(CpuDeviceTest, CopiesAndSetsSynchronously) {
  auto dev = CreateCpuDevice();
  auto stream = dev->CreateStream();
  ASSERT_TRUE(stream.ok()) << stream.status();
  EXPECT_EQ((*stream)->native(), nullptr);
  constexpr size_t kN = 1000;
  std::vector<float> host(kN);
  std::iota(host.begin(), host.end(), 0.5f);
  auto a = dev->Allocate(kN * sizeof(float));
  auto b = dev->Allocate(kN * sizeof(float));
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_TRUE(
      dev->Copy(*a, host.data(), kN * sizeof(float), CopyKind::kHostToDevice, **stream).ok());
  ASSERT_TRUE(dev->Copy(*b, *a, kN * sizeof(float), CopyKind::kDeviceToDevice, **stream).ok());
  std::vector<float> back(kN, -1.0f);
  ASSERT_TRUE(
      dev->Copy(back.data(), *b, kN * sizeof(float), CopyKind::kDeviceToHost, **stream).ok());
  EXPECT_EQ(back, host);  // no synchronisation needed on the CPU

  ASSERT_TRUE(dev->Memset(*b, 0, kN * sizeof(float), **stream).ok());
  ASSERT_TRUE(
      dev->Copy(back.data(), *b, kN * sizeof(float), CopyKind::kDeviceToHost, **stream).ok());
  EXPECT_EQ(back, std::vector<float>(kN, 0.0f));
  ASSERT_TRUE(dev->Memset(*b, 0xff, 16, **stream).ok());
  uint8_t bytes[17];
  ASSERT_TRUE(dev->Copy(bytes, *b, 17, CopyKind::kDeviceToHost, **stream).ok());
  for (int i = 0; i < 16; ++i) EXPECT_EQ(bytes[i], 0xff);
  EXPECT_EQ(bytes[16], 0);
  EXPECT_TRUE(dev->Copy(*b, *a, 0, CopyKind::kDeviceToDevice, **stream).ok());
  dev->Free(*a);
  dev->Free(*b);
}

TEST(CpuDeviceTest, StreamsAndEventsAreNoOps) {
  auto dev = CreateCpuDevice();
  auto s1 = dev->CreateStream();
  auto s2 = dev->CreateStream();
  auto ev = dev->CreateEvent();
  ASSERT_TRUE(s1.ok() && s2.ok() && ev.ok());
  EXPECT_TRUE(dev->RecordEvent(**ev, **s1).ok());
  EXPECT_TRUE(dev->WaitEvent(**s2, **ev).ok());
  EXPECT_TRUE(dev->SynchronizeEvent(**ev).ok());
  EXPECT_TRUE(dev->SynchronizeStream(**s1).ok());
  EXPECT_TRUE(dev->SynchronizeStream(**s2).ok());
}

TEST(CpuDeviceTest, RefusesForeignStreamsAndEvents) {
  class OtherStream : public Stream {
   public:
    void* native() override { return nullptr; }
  };
  class OtherEvent : public Event {};
  auto dev = CreateCpuDevice();
  OtherStream stream;
  OtherEvent event;
  char buf[4];
  EXPECT_EQ(dev->Memset(buf, 0, 4, stream).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(dev->SynchronizeEvent(event).code(), absl::StatusCode::kInvalidArgument);
}

// A CUDA device or the reason there is none; the cases skip when there is none.
absl::StatusOr<std::unique_ptr<Device>> CudaOrSkipReason() { return CreateCudaDevice(0); }

#define CUDA_DEVICE_OR_SKIP(var)                                      \
  auto var##_or = CudaOrSkipReason();                                 \
  if (!var##_or.ok()) {                                               \
    if (var##_or.status().code() == absl::StatusCode::kUnavailable) { \
      GTEST_SKIP() << "no GPU: " << var##_or.status().message();      \
    }                                                                 \
    FAIL() << var##_or.status();                                      \
  }                                                                   \
  std::unique_ptr<Device> var = std::move(*var##_or)

TEST(CudaDeviceTest, DescribesItself) {
  CUDA_DEVICE_OR_SKIP(dev);
  EXPECT_EQ(dev->kind(), Kind::kCuda);
  EXPECT_NE(dev->name().find("cuda:0"), std::string::npos) << dev->name();
  EXPECT_GT(dev->total_memory(), size_t{0});
}

TEST(CudaDeviceTest, BadOrdinalIsRefused) {
  CUDA_DEVICE_OR_SKIP(dev);
  auto other = CreateCudaDevice(1 << 20);
  EXPECT_EQ(other.status().code(), absl::StatusCode::kInvalidArgument) << other.status();
}

TEST(CudaDeviceTest, CopiesRoundTripOnStreamsWithEvents) {
  CUDA_DEVICE_OR_SKIP(dev);
  auto s1 = dev->CreateStream();
  auto s2 = dev->CreateStream();
  auto ev = dev->CreateEvent();
  ASSERT_TRUE(s1.ok() && s2.ok() && ev.ok());
  EXPECT_NE((*s1)->native(), nullptr);
  constexpr size_t kN = 1 << 20;
  constexpr size_t kBytes = kN * sizeof(float);
  auto pinned = dev->AllocateHost(kBytes);
  auto a = dev->Allocate(kBytes);
  auto b = dev->Allocate(kBytes);
  ASSERT_TRUE(pinned.ok() && a.ok() && b.ok());
  float* host = static_cast<float*>(*pinned);
  for (size_t i = 0; i < kN; ++i) host[i] = static_cast<float>(i) * 0.25f;
  // s1: upload and copy; s2 waits on the event, then reads back.
  ASSERT_TRUE(dev->Copy(*a, host, kBytes, CopyKind::kHostToDevice, **s1).ok());
  ASSERT_TRUE(dev->Copy(*b, *a, kBytes, CopyKind::kDeviceToDevice, **s1).ok());
  ASSERT_TRUE(dev->RecordEvent(**ev, **s1).ok());
  ASSERT_TRUE(dev->WaitEvent(**s2, **ev).ok());
  std::vector<float> back(kN, -1.0f);
  ASSERT_TRUE(dev->Copy(back.data(), *b, kBytes, CopyKind::kDeviceToHost, **s2).ok());
  ASSERT_TRUE(dev->SynchronizeStream(**s2).ok());
  for (size_t i = 0; i < kN; i += 997) ASSERT_EQ(back[i], host[i]) << i;

  ASSERT_TRUE(dev->Memset(*b, 0, kBytes, **s2).ok());
  ASSERT_TRUE(dev->Copy(back.data(), *b, kBytes, CopyKind::kDeviceToHost, **s2).ok());
  ASSERT_TRUE(dev->RecordEvent(**ev, **s2).ok());
  ASSERT_TRUE(dev->SynchronizeEvent(**ev).ok());
  for (size_t i = 0; i < kN; i += 997) ASSERT_EQ(back[i], 0.0f) << i;
  dev->Free(*a);
  dev->Free(*b);
  dev->FreeHost(*pinned);
}

TEST(CudaDeviceTest, OversizedAllocationIsResourceExhausted) {
  CUDA_DEVICE_OR_SKIP(dev);
  auto ptr = dev->Allocate(dev->total_memory() * 4);
  ASSERT_FALSE(ptr.ok());
  EXPECT_EQ(ptr.status().code(), absl::StatusCode::kResourceExhausted) << ptr.status();
  // The failure was cleared: the device still works.
  auto ok = dev->Allocate(1024);
  ASSERT_TRUE(ok.ok()) << ok.status();
  dev->Free(*ok);
}

TEST(CudaDeviceTest, RefusesCpuStreams) {
  CUDA_DEVICE_OR_SKIP(dev);
  auto cpu = CreateCpuDevice();
  auto stream = cpu->CreateStream();
  ASSERT_TRUE(stream.ok());
  auto ptr = dev->Allocate(64);
  ASSERT_TRUE(ptr.ok());
  EXPECT_EQ(dev->Memset(*ptr, 0, 64, **stream).code(), absl::StatusCode::kInvalidArgument);
  dev->Free(*ptr);
}

TEST(CudaDeviceTest, IsDeviceMemoryNamesOnlyItsOwnMemory) {
  CUDA_DEVICE_OR_SKIP(dev);
  auto d = dev->Allocate(4096);
  auto pinned = dev->AllocateHost(4096);
  ASSERT_TRUE(d.ok() && pinned.ok());
  std::vector<char> pageable(4096);
  EXPECT_TRUE(dev->IsDeviceMemory(*d));
  EXPECT_TRUE(dev->IsDeviceMemory(static_cast<char*>(*d) + 100));  // inside the allocation
  EXPECT_FALSE(dev->IsDeviceMemory(*pinned));
  EXPECT_FALSE(dev->IsDeviceMemory(pageable.data()));
  EXPECT_FALSE(dev->IsDeviceMemory(nullptr));
  auto cpu = CreateCpuDevice();
  EXPECT_FALSE(cpu->IsDeviceMemory(*d));
  dev->Free(*d);
  dev->FreeHost(*pinned);
}

TEST(CudaDeviceTest, ZeroBytesAndStreamOrderedFree) {
  CUDA_DEVICE_OR_SKIP(dev);
  auto zero = dev->Allocate(0);
  ASSERT_TRUE(zero.ok()) << zero.status();
  EXPECT_NE(*zero, nullptr);
  dev->Free(*zero);
  // Free on the current stream: scratch freed right after the copies that use it were enqueued
  // still holds their bytes when they run.
  auto stream = dev->CreateStream();
  ASSERT_TRUE(stream.ok());
  constexpr size_t kN = 1 << 20;
  std::vector<float> host(kN, 1.5f), back(kN, 0.0f);
  auto out = dev->Allocate(kN * sizeof(float));
  ASSERT_TRUE(out.ok());
  // Allocated in the default stream's order: usable on `stream` once the default stream passed it.
  ASSERT_TRUE(dev->SynchronizeStream(dev->default_stream()).ok());
  {
    StreamScope scope(**stream);
    auto scratch = dev->Allocate(kN * sizeof(float));
    ASSERT_TRUE(scratch.ok());
    ASSERT_TRUE(dev->Copy(*scratch, host.data(), kN * 4, CopyKind::kHostToDevice, **stream).ok());
    ASSERT_TRUE(dev->Copy(*out, *scratch, kN * 4, CopyKind::kDeviceToDevice, **stream).ok());
    dev->Free(*scratch);  // stream-ordered: after the copies above
  }
  ASSERT_TRUE(dev->Copy(back.data(), *out, kN * 4, CopyKind::kDeviceToHost, **stream).ok());
  ASSERT_TRUE(dev->SynchronizeStream(**stream).ok());
  EXPECT_EQ(back, host);
  dev->Free(*out);
}

TEST(CudaDeviceTest, StickyErrorAndLookups) {
  CUDA_DEVICE_OR_SKIP(dev);
  auto* cuda = dynamic_cast<CudaDevice*>(dev.get());
  ASSERT_NE(cuda, nullptr);
  EXPECT_EQ(cuda->ordinal(), 0);
  EXPECT_EQ(LiveCudaDevice(0), cuda);
  EXPECT_EQ(CudaDeviceOf(dev->default_stream()), cuda);
  auto stream = dev->CreateStream();
  ASSERT_TRUE(stream.ok());
  EXPECT_EQ(CudaDeviceOf(**stream), cuda);
  auto cpu = CreateCpuDevice();
  auto cpu_stream = cpu->CreateStream();
  ASSERT_TRUE(cpu_stream.ok());
  EXPECT_EQ(CudaDeviceOf(**cpu_stream), nullptr);

  EXPECT_TRUE(cuda->sticky_error().ok());
  cuda->SetStickyError(absl::InternalError("first"));
  cuda->SetStickyError(absl::InternalError("second"));
  absl::Status s = dev->SynchronizeStream(**stream);
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
  EXPECT_EQ(s.message(), "first");
  auto event = dev->CreateEvent();
  ASSERT_TRUE(event.ok());
  ASSERT_TRUE(dev->RecordEvent(**event, **stream).ok());
  EXPECT_EQ(dev->SynchronizeEvent(**event).message(), "first");
  dev.reset();
  EXPECT_EQ(LiveCudaDevice(0), nullptr);
}

TEST(CudaDeviceTest, NoGpuIsUnavailable) {
  auto dev = CreateCudaDevice(0);
  if (dev.ok()) GTEST_SKIP() << "a GPU is present; nothing to check";
  EXPECT_EQ(dev.status().code(), absl::StatusCode::kUnavailable) << dev.status();
  EXPECT_EQ(LiveCudaDevice(0), nullptr);
}

}  // namespace
}  // namespace furnace::device
