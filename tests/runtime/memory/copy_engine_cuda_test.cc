// The copy engine on a real GPU (label gpu; every case skips itself, saying why, without one): the
// same code as on the CPU and emulated devices, here on CUDA copy streams and events. An offload
// waits for the producer stream's event (the compute stream's memset of the buffer lands in the
// host copy), and a reload is ordered before its consumer on the compute stream with OrderBefore,
// with pinned host memory both ways. The emulated device's tests (copy_engine_streams_test.cc)
// show these orderings are needed; these show they hold on the hardware.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <vector>

#include "runtime/device/device.h"
#include "runtime/memory/copy_engine.h"

namespace furnace::memory {
namespace {

constexpr size_t kBytes = size_t{64} << 20;  // large enough that the copies take real time

class CudaCopyEngineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto dev = device::CreateCudaDevice(0);
    if (!dev.ok() && dev.status().code() == absl::StatusCode::kUnavailable) {
      GTEST_SKIP() << "no GPU: " << dev.status().message();
    }
    ASSERT_TRUE(dev.ok()) << dev.status();
    dev_ = std::move(*dev);
    auto s = dev_->CreateStream();
    ASSERT_TRUE(s.ok()) << s.status();
    compute_ = std::move(*s);
    auto e = CopyEngine::Create(*dev_);
    ASSERT_TRUE(e.ok()) << e.status();
    engine_ = std::move(*e);
    for (void** p : {&device_a_, &device_b_}) {
      auto d = dev_->Allocate(kBytes);
      ASSERT_TRUE(d.ok()) << d.status();
      *p = *d;
    }
    auto h = dev_->AllocateHost(kBytes);
    ASSERT_TRUE(h.ok()) << h.status();
    pinned_ = static_cast<unsigned char*>(*h);
    // Allocated in the default stream's order: usable by the engine's and compute_'s streams once
    // that stream has passed the allocations.
    ASSERT_TRUE(dev_->SynchronizeStream(dev_->default_stream()).ok());
  }
  void TearDown() override {
    engine_.reset();
    if (dev_ == nullptr) return;
    dev_->Free(device_a_);
    dev_->Free(device_b_);
    dev_->FreeHost(pinned_);
  }

  std::unique_ptr<device::Device> dev_;
  std::unique_ptr<device::Stream> compute_;
  std::unique_ptr<CopyEngine> engine_;
  void* device_a_ = nullptr;
  void* device_b_ = nullptr;
  unsigned char* pinned_ = nullptr;
};

TEST_F(CudaCopyEngineTest, OffloadAfterTheProducersEvent) {
  for (int round = 1; round <= 3; ++round) {
    std::memset(pinned_, 0, kBytes);
    ASSERT_TRUE(dev_->Memset(device_a_, round, kBytes, *compute_).ok());  // still being written
    CopyTicket t = engine_->Submit(CopyDirection::kDeviceToHost, pinned_, device_a_, kBytes,
                                   nullptr, compute_.get());
    ASSERT_TRUE(engine_->Wait(t).ok());
    EXPECT_EQ(pinned_[0], round);
    EXPECT_EQ(pinned_[kBytes - 1], round);
  }
  EXPECT_EQ(engine_->stats().bytes_to_host, 3 * kBytes);
}

TEST_F(CudaCopyEngineTest, ReloadOrderedBeforeItsConsumer) {
  std::vector<unsigned char> out(16, 0);
  for (int round = 1; round <= 3; ++round) {
    std::memset(pinned_, 10 + round, kBytes);
    CopyTicket t = engine_->Submit(CopyDirection::kHostToDevice, device_a_, pinned_, kBytes);
    ASSERT_TRUE(engine_->OrderBefore(t, *compute_).ok());
    // The consumer: a device-to-device copy of the reloaded bytes, then a few read back.
    ASSERT_TRUE(
        dev_->Copy(device_b_, device_a_, kBytes, device::CopyKind::kDeviceToDevice, *compute_)
            .ok());
    ASSERT_TRUE(dev_->Copy(out.data(), static_cast<unsigned char*>(device_b_) + kBytes - 16, 16,
                           device::CopyKind::kDeviceToHost, *compute_)
                    .ok());
    ASSERT_TRUE(dev_->SynchronizeStream(*compute_).ok());
    EXPECT_EQ(out, std::vector<unsigned char>(16, static_cast<unsigned char>(10 + round)));
    ASSERT_TRUE(engine_->Wait(t).ok());
  }
}

}  // namespace
}  // namespace furnace::memory
