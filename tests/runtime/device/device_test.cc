// Device interface: the CPU device (always), and the CUDA device where a GPU is present (the
// CudaDevice* cases skip themselves, saying why, on machines without one or in CPU-only builds).
#include "runtime/device/device.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <numeric>
#include <vector>

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

TEST(CudaDeviceTest, NoGpuIsUnavailable) {
  auto dev = CreateCudaDevice(0);
  if (dev.ok()) GTEST_SKIP() << "a GPU is present; nothing to check";
  EXPECT_EQ(dev.status().code(), absl::StatusCode::kUnavailable) << dev.status();
}

}  // namespace
}  // namespace furnace::device
