// The copy engine on the emulated discrete device, where copies and compute run on separate
// streams and only events order them: an offload of a buffer the compute stream is still writing
// must wait for the producer's event, and the compute stream must wait for a reload's event before
// its consumer. Each case also runs without the event and shows the wrong bytes it then gets, so
// dropping the wait in the engine fails the first half. Streams are held (PauseStream) to make
// the order certain rather than a matter of timing.
#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <memory>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "runtime/device/backend.h"
#include "runtime/device/current_stream.h"
#include "runtime/device/emulated_device.h"
#include "runtime/memory/copy_engine.h"
#include "runtime/tensor/arena.h"
#include "runtime/tensor/host_pool.h"

namespace furnace::memory {
namespace {

class CopyEngineStreamsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto dev = device::CreateEmulatedDevice({.memory_bytes = 1 << 20});
    ASSERT_TRUE(dev.ok()) << dev.status();
    dev_ = std::move(*dev);
    auto s = dev_->CreateStream();
    ASSERT_TRUE(s.ok());
    compute_ = std::move(*s);
    auto e = CopyEngine::Create(*dev_);
    ASSERT_TRUE(e.ok()) << e.status();
    engine_ = std::move(*e);
    // The buffer from a device arena and the offload's destination from the host pool, as the
    // stash has them.
    arena_ = std::make_unique<tensor::DeviceArena>(*dev_, kN * sizeof(float));
    host_pool_ = std::make_unique<tensor::HostPool>(*dev_, 0);
    auto d = arena_->Allocate(kN * sizeof(float), "stashed");
    ASSERT_TRUE(d.ok()) << d.status();
    device_buffer_ = std::move(*d);
    buffer_ = static_cast<float*>(device_buffer_.data());
    ASSERT_TRUE(dev_->Owns(buffer_, kN * sizeof(float)));
  }
  void TearDown() override {
    engine_.reset();
    device_buffer_ = tensor::Buffer();
  }
  void Fill(float value) {
    std::vector<float> v(kN, value);
    ASSERT_TRUE(dev_->Copy(buffer_, v.data(), sizeof(float) * kN, device::CopyKind::kHostToDevice,
                           *compute_)
                    .ok());
    ASSERT_TRUE(dev_->SynchronizeStream(*compute_).ok());
  }

  static constexpr int kN = 256;
  std::unique_ptr<device::EmulatedDevice> dev_;
  std::unique_ptr<device::Stream> compute_;
  std::unique_ptr<CopyEngine> engine_;
  std::unique_ptr<tensor::DeviceArena> arena_;
  std::unique_ptr<tensor::HostPool> host_pool_;
  tensor::Buffer device_buffer_;
  float* buffer_ = nullptr;
};

TEST_F(CopyEngineStreamsTest, AnOffloadWaitsForTheComputeStreamStillWritingItsBuffer) {
  for (bool with_producer : {true, false}) {
    SCOPED_TRACE(with_producer ? "offload after the producer's event" : "offload with no event");
    Fill(1.0f);
    // The compute stream, held, has yet to scale the buffer to 3.
    ASSERT_TRUE(dev_->PauseStream(*compute_).ok());
    {
      device::StreamScope scope(*compute_);
      device::EmulatedBackend().scale(buffer_, 3.0f, kN);
    }
    auto pinned = host_pool_->Allocate(sizeof(float) * kN, "offloaded");
    ASSERT_TRUE(pinned.ok()) << pinned.status();
    float* host_data = static_cast<float*>(pinned->data());
    CopyTicket t =
        engine_->Submit(CopyDirection::kDeviceToHost, host_data, buffer_, sizeof(float) * kN,
                        nullptr, with_producer ? compute_.get() : nullptr);
    auto host = [host_data] { return std::vector<float>(host_data, host_data + kN); };
    if (with_producer) {
      absl::SleepFor(absl::Milliseconds(20));
      EXPECT_FALSE(engine_->Done(t));  // behind the held compute stream
      ASSERT_TRUE(dev_->ResumeStream(*compute_).ok());
      ASSERT_TRUE(engine_->Wait(t).ok());
      EXPECT_EQ(host(), std::vector<float>(kN, 3.0f));
    } else {
      ASSERT_TRUE(engine_->Wait(t).ok());  // done while the compute stream is still held
      EXPECT_EQ(host(), std::vector<float>(kN, 1.0f));  // the bytes before the write: wrong
      ASSERT_TRUE(dev_->ResumeStream(*compute_).ok());
    }
    ASSERT_TRUE(dev_->SynchronizeStream(*compute_).ok());
  }
}

TEST_F(CopyEngineStreamsTest, TheConsumerWaitsForTheReloadsEvent) {
  device::Stream& to_device = engine_->stream(CopyDirection::kHostToDevice);
  const std::vector<float> stashed(kN, 5.0f);
  for (bool ordered : {true, false}) {
    SCOPED_TRACE(ordered ? "consumer after OrderBefore" : "consumer with no event");
    Fill(0.0f);
    ASSERT_TRUE(dev_->PauseStream(to_device).ok());  // the reload's copy is held
    CopyTicket t =
        engine_->Submit(CopyDirection::kHostToDevice, buffer_, stashed.data(), sizeof(float) * kN);
    if (ordered) {
      ASSERT_TRUE(engine_->OrderBefore(t, *compute_).ok());
    }
    std::vector<float> out(kN, -1.0f);
    {
      device::StreamScope scope(*compute_);
      device::EmulatedBackend().scale(buffer_, 2.0f, kN);  // the consumer
    }
    ASSERT_TRUE(dev_->Copy(out.data(), buffer_, sizeof(float) * kN, device::CopyKind::kDeviceToHost,
                           *compute_)
                    .ok());
    if (ordered) {
      ASSERT_TRUE(dev_->ResumeStream(to_device).ok());
      ASSERT_TRUE(dev_->SynchronizeStream(*compute_).ok());
      EXPECT_EQ(out, std::vector<float>(kN, 10.0f));
    } else {
      ASSERT_TRUE(dev_->SynchronizeStream(*compute_).ok());  // ran ahead of the held reload
      EXPECT_EQ(out, std::vector<float>(kN, 0.0f));          // consumed the old bytes: wrong
      ASSERT_TRUE(dev_->ResumeStream(to_device).ok());
    }
    ASSERT_TRUE(engine_->Wait(t).ok());
  }
  EXPECT_TRUE(engine_->OrderBefore(CopyTicket(), *compute_).ok());  // no job: nothing to wait
}

// A job is on its copy stream from Submit (a discrete device: enqueueing blocks nothing): a reload
// is ordered before its consumer at once, even while the engine's thread still waits to complete
// an older offload held behind the compute stream. Before, the reload waited in the queue until
// that offload completed, so OrderBefore held the compute thread until its stream caught up.
TEST_F(CopyEngineStreamsTest, AJobIsLaunchedAtSubmitNotBehindAnOlderOne) {
  Fill(1.0f);
  auto pinned = host_pool_->Allocate(sizeof(float) * kN, "offloaded");
  ASSERT_TRUE(pinned.ok()) << pinned.status();
  auto other = dev_->Allocate(sizeof(float) * kN);  // the reload's destination
  ASSERT_TRUE(other.ok()) << other.status();
  auto consumer = dev_->CreateStream();
  ASSERT_TRUE(consumer.ok());
  const std::vector<float> stashed(kN, 7.0f);
  ASSERT_TRUE(dev_->PauseStream(*compute_).ok());
  CopyTicket offload = engine_->Submit(CopyDirection::kDeviceToHost, pinned->data(), buffer_,
                                       sizeof(float) * kN, nullptr, compute_.get());
  // Time for the engine's thread to take the offload and wait to complete it (it cannot: the
  // compute stream is held), which is the case at stake.
  absl::SleepFor(absl::Milliseconds(50));
  CopyTicket reload =
      engine_->Submit(CopyDirection::kHostToDevice, *other, stashed.data(), sizeof(float) * kN);
  // Returns while the offload ahead of it cannot complete (a bound that only catches a hang).
  std::promise<absl::Status> ordered;
  std::thread orderer([&] { ordered.set_value(engine_->OrderBefore(reload, **consumer)); });
  std::future<absl::Status> result = ordered.get_future();
  const bool returned = result.wait_for(std::chrono::seconds(20)) == std::future_status::ready;
  EXPECT_TRUE(returned) << "OrderBefore waited for the older offload";
  EXPECT_FALSE(engine_->Done(offload));
  ASSERT_TRUE(dev_->ResumeStream(*compute_).ok());
  orderer.join();
  EXPECT_TRUE(result.get().ok());
  ASSERT_TRUE(engine_->Wait(offload).ok());
  ASSERT_TRUE(engine_->Wait(reload).ok());
  std::vector<float> out(kN, -1.0f);
  ASSERT_TRUE(dev_->Copy(out.data(), *other, sizeof(float) * kN, device::CopyKind::kDeviceToHost,
                         **consumer)
                  .ok());
  ASSERT_TRUE(dev_->SynchronizeStream(**consumer).ok());
  EXPECT_EQ(out, stashed);
  dev_->Free(*other);
}

TEST_F(CopyEngineStreamsTest, CopiesGoOnlyThroughTheDevice) {
  // A "device->host" job whose source is host memory is refused by the device, and that is the
  // job's status (the hook sees it too).
  std::vector<float> a(kN, 1.0f), b(kN, 0.0f);
  absl::Status hook_status;
  CopyTicket t =
      engine_->Submit(CopyDirection::kDeviceToHost, b.data(), a.data(), sizeof(float) * kN,
                      [&hook_status](const absl::Status& s) { hook_status = s; });
  EXPECT_EQ(engine_->Wait(t).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(hook_status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(engine_->OrderBefore(t, *compute_).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(engine_->stats().jobs, 0);
}

}  // namespace
}  // namespace furnace::memory
