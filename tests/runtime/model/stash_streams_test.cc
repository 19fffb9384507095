// The stash's offload and reload on the emulated discrete device, where the copy engine's streams
// and the compute stream are ordered only by events (stash.h "The backward rule"):
//  - a reload is ordered before the compute stream (CopyEngine::OrderBefore), not waited for on
//    the host: Acquire returns while the reload's copy stream is held, the reload counts as late,
//    and work enqueued on the compute stream after Acquire reads the reloaded bytes. Work on a
//    stream that did not wait (the second half) reads what the buffer held before the copy,
//    which is what the compute stream would read without the wait;
//  - an offload copies after the kernels the compute stream had enqueued when it was made.
// Streams are held (PauseStream) so the order is certain rather than a matter of timing.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "runtime/device/backend.h"
#include "runtime/device/current_stream.h"
#include "runtime/device/emulated_device.h"
#include "runtime/memory/copy_engine.h"
#include "runtime/model/stash.h"
#include "runtime/tensor/arena.h"
#include "runtime/tensor/host_pool.h"

namespace furnace::model {
namespace {

constexpr int kN = 512;
constexpr float kSentinel = -7.0f;

class StashStreamsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    TearDown();
    want_.clear();
    auto dev = device::CreateEmulatedDevice({.memory_bytes = 1 << 22});
    ASSERT_TRUE(dev.ok()) << dev.status();
    dev_ = std::move(*dev);
    auto compute = dev_->CreateStream();
    auto other = dev_->CreateStream();
    ASSERT_TRUE(compute.ok() && other.ok());
    compute_ = std::move(*compute);
    other_ = std::move(*other);
    auto engine = memory::CopyEngine::Create(*dev_);
    ASSERT_TRUE(engine.ok()) << engine.status();
    engine_ = std::move(*engine);
    arena_ = std::make_unique<tensor::DeviceArena>(*dev_, 0);
    host_ = std::make_unique<tensor::HostPool>(*dev_, 0);
    stash_ = std::make_unique<Stash>(device::Kind::kEmulated);
    stash_->SetDeviceMemory(arena_.get(), &device::EmulatedBackend());
    stash_->SetOffloadTargets(engine_.get(), host_.get());
    for (int i = 0; i < kN; ++i) want_.push_back(static_cast<float>(i) * 0.5f - 3.0f);
  }
  void TearDown() override {
    stash_.reset();
    engine_.reset();
    host_.reset();
    arena_.reset();
    compute_.reset();
    other_.reset();
    dev_.reset();
  }

  // A tensor of want_ saved from the compute stream.
  StashHandle SaveWant(const std::string& producer = "layers.1.moe.expert_hidden") {
    auto buffer = arena_->Allocate(4 * kN, producer);
    EXPECT_TRUE(buffer.ok());
    EXPECT_TRUE(
        dev_->Copy(buffer->data(), want_.data(), 4 * kN, device::CopyKind::kHostToDevice, *compute_)
            .ok());
    EXPECT_TRUE(dev_->SynchronizeStream(*compute_).ok());
    auto h = stash_->Save(producer, 1, std::move(*buffer), {kN}, tensor::DType::kF32, {});
    EXPECT_TRUE(h.ok()) << h.status();
    return *h;
  }

  std::vector<float> ReadOn(device::Stream& stream, const void* data) {
    std::vector<float> out(kN);
    EXPECT_TRUE(dev_->Copy(out.data(), data, 4 * kN, device::CopyKind::kDeviceToHost, stream).ok());
    EXPECT_TRUE(dev_->SynchronizeStream(stream).ok());
    return out;
  }

  std::unique_ptr<device::EmulatedDevice> dev_;
  std::unique_ptr<device::Stream> compute_, other_;
  std::unique_ptr<memory::CopyEngine> engine_;
  std::unique_ptr<tensor::DeviceArena> arena_;
  std::unique_ptr<tensor::HostPool> host_;
  std::unique_ptr<Stash> stash_;
  std::vector<float> want_;
};

TEST_F(StashStreamsTest, AReloadIsOrderedBeforeTheComputeStreamWithoutAHostWait) {
  for (bool read_on_compute : {true, false}) {
    SCOPED_TRACE(read_on_compute ? "read on the compute stream (ordered after the reload)"
                                 : "read on a stream that did not wait");
    SetUp();
    ASSERT_NE(stash_, nullptr);
    device::StreamScope scope(*compute_);
    const StashHandle h = SaveWant();
    void* const first = stash_->Get(h)->data;
    ASSERT_TRUE(stash_->Offload(h).ok());
    stash_->WaitForCopies();  // landed: its device bytes were freed (on the default stream)
    ASSERT_TRUE(dev_->SynchronizeStream(dev_->default_stream()).ok());
    // Where the reload will land (first fit: the freed bytes) now holds the sentinel, as device
    // memory holds whatever was there before.
    {
      auto scratch = arena_->Allocate(4 * kN, "scratch");
      ASSERT_TRUE(scratch.ok());
      ASSERT_EQ(scratch->data(), first);
      const std::vector<float> sentinel(kN, kSentinel);
      ASSERT_TRUE(dev_->Copy(scratch->data(), sentinel.data(), 4 * kN,
                             device::CopyKind::kHostToDevice, *compute_)
                      .ok());
      ASSERT_TRUE(dev_->SynchronizeStream(*compute_).ok());
    }
    ASSERT_TRUE(dev_->SynchronizeStream(*compute_).ok());  // the scratch's Free has run

    device::Stream& copies = engine_->stream(memory::CopyDirection::kHostToDevice);
    ASSERT_TRUE(dev_->PauseStream(copies).ok());
    absl::Notification acquired;
    absl::StatusOr<Stash::Lease> lease;
    std::thread backward([&] {
      device::StreamScope on_compute(*compute_);
      lease = stash_->Acquire({h});
      acquired.Notify();
    });
    // The host does not wait for the held copy: Acquire returns (a host wait would hold it until
    // the stream is resumed below).
    const bool returned = acquired.WaitForNotificationWithTimeout(absl::Seconds(20));
    EXPECT_TRUE(returned) << "Acquire waited on the host for the reload";
    if (!returned) {
      ASSERT_TRUE(dev_->ResumeStream(copies).ok());
      backward.join();
      FAIL();
    }
    backward.join();
    ASSERT_TRUE(lease.ok()) << lease.status();
    auto view = stash_->Get(h);
    ASSERT_TRUE(view.ok()) << view.status();
    ASSERT_EQ(view->data, first);  // the reload's destination: the sentinel's bytes
    EXPECT_EQ(stash_->action_stats().late_reloads, 1);  // not there when the backward needed it
    // Enqueued while the copy is held; the stream runs it only after the copy's event.
    std::vector<float> got(kN);
    device::Stream& reader = read_on_compute ? *compute_ : *other_;
    ASSERT_TRUE(
        dev_->Copy(got.data(), view->data, 4 * kN, device::CopyKind::kDeviceToHost, reader).ok());
    if (!read_on_compute) {
      ASSERT_TRUE(dev_->SynchronizeStream(reader).ok());  // runs at once
    }
    ASSERT_TRUE(dev_->ResumeStream(copies).ok());
    ASSERT_TRUE(dev_->SynchronizeStream(reader).ok());
    if (read_on_compute) {
      EXPECT_EQ(got, want_);
    } else {
      EXPECT_EQ(got, std::vector<float>(kN, kSentinel));  // what a missing wait reads
    }
    *lease = Stash::Lease();
    ASSERT_TRUE(stash_->Release(h).ok());
    EXPECT_EQ(host_->current_bytes(), 0u);
    TearDown();
  }
}

// An encoding (an entry stored compressed, then offloaded) comes back the same way, and its decode
// runs on the compute stream after the reload's event: with the reload held, Acquire returns, and
// what the decode wrote is what the entry decoded to before it left. (A decode not ordered after
// the copy would read the sentinel where the encoding lands: bf16 0xffff, a NaN.)
TEST_F(StashStreamsTest, AnOffloadedEncodingIsDecodedAfterItsReloadOnTheComputeStream) {
  device::StreamScope scope(*compute_);
  const StashHandle h = SaveWant("layers.1.moe.expert_hidden");
  const StashHandle twin = SaveWant("layers.2.moe.expert_hidden");
  ASSERT_TRUE(stash_->Compress(h, memory::Codec::kBf16).ok());
  ASSERT_TRUE(stash_->Compress(twin, memory::Codec::kBf16).ok());
  const std::vector<float> decoded = ReadOn(*compute_, stash_->Get(twin)->data);
  ASSERT_NE(decoded, want_);  // lossy: a decode, not the fp32 bytes
  ASSERT_TRUE(stash_->Release(twin).ok());
  ASSERT_TRUE(stash_->Offload(h).ok());
  stash_->WaitForCopies();
  ASSERT_TRUE(dev_->SynchronizeStream(dev_->default_stream()).ok());
  const uint64_t encoded = memory::EncodedBytes(memory::Codec::kBf16, kN);
  EXPECT_EQ(stash_->action_stats().offloaded_bytes, encoded);
  {  // where the reload will land (first fit) holds the sentinel
    auto scratch = arena_->Allocate(encoded, "scratch");
    ASSERT_TRUE(scratch.ok());
    const std::vector<uint8_t> sentinel(encoded, 0xff);
    ASSERT_TRUE(dev_->Copy(scratch->data(), sentinel.data(), encoded,
                           device::CopyKind::kHostToDevice, *compute_)
                    .ok());
    ASSERT_TRUE(dev_->SynchronizeStream(*compute_).ok());
  }
  ASSERT_TRUE(dev_->SynchronizeStream(*compute_).ok());

  device::Stream& copies = engine_->stream(memory::CopyDirection::kHostToDevice);
  ASSERT_TRUE(dev_->PauseStream(copies).ok());
  absl::Notification acquired;
  absl::StatusOr<Stash::Lease> lease;
  std::thread backward([&] {
    device::StreamScope on_compute(*compute_);
    lease = stash_->Acquire({h});
    acquired.Notify();
  });
  const bool returned = acquired.WaitForNotificationWithTimeout(absl::Seconds(20));
  EXPECT_TRUE(returned) << "Acquire waited on the host for the reload";
  if (!returned) {
    ASSERT_TRUE(dev_->ResumeStream(copies).ok());
    backward.join();
    FAIL();
  }
  backward.join();
  ASSERT_TRUE(lease.ok()) << lease.status();
  auto view = stash_->Get(h);
  ASSERT_TRUE(view.ok()) << view.status();
  std::vector<float> got(kN);
  ASSERT_TRUE(
      dev_->Copy(got.data(), view->data, 4 * kN, device::CopyKind::kDeviceToHost, *compute_).ok());
  ASSERT_TRUE(dev_->ResumeStream(copies).ok());
  ASSERT_TRUE(dev_->SynchronizeStream(*compute_).ok());
  EXPECT_EQ(got, decoded);
  stash_->WaitForCopies();  // (the reload's completion hook counts it)
  EXPECT_EQ(stash_->action_stats().reloaded_bytes, encoded);
  *lease = Stash::Lease();
  ASSERT_TRUE(stash_->Release(h).ok());
  EXPECT_EQ(host_->current_bytes(), 0u);
}

// An offload made while the compute stream still has to write the tensor copies what it writes:
// it does not land while the compute stream is held (an offload without the producer's event
// would copy the old bytes at once and land).
TEST_F(StashStreamsTest, AnOffloadCopiesAfterTheComputeStreamsWrites) {
  device::StreamScope scope(*compute_);
  const StashHandle h = SaveWant();
  void* const data = stash_->Get(h)->data;
  ASSERT_TRUE(dev_->PauseStream(*compute_).ok());
  device::EmulatedBackend().scale(static_cast<float*>(data), 2.0f, kN);  // held
  ASSERT_TRUE(stash_->Offload(h).ok());
  absl::Notification landed;
  std::thread waiter([&] {
    stash_->WaitForCopies();
    landed.Notify();
  });
  EXPECT_FALSE(landed.WaitForNotificationWithTimeout(absl::Milliseconds(200)))
      << "the offload landed while the kernel writing its tensor was still held";
  ASSERT_TRUE(dev_->ResumeStream(*compute_).ok());
  waiter.join();
  auto lease = stash_->Acquire({h});
  ASSERT_TRUE(lease.ok()) << lease.status();
  std::vector<float> doubled = want_;
  for (float& x : doubled) x *= 2.0f;
  EXPECT_EQ(ReadOn(*compute_, stash_->Get(h)->data), doubled);
}

// A reload the arena cannot hold while another tensor's offload is still copying waits for that
// copy (its device bytes go when it lands) instead of failing the step: whether it fits does not
// depend on how fast the copy thread is. The arena holds one tensor; the offload of the second is
// held behind the compute stream until after the reload of the first was asked for.
TEST_F(StashStreamsTest, AReloadWaitsForTheOffloadsInFlightBeforeTheArenaRefusesIt) {
  arena_ = std::make_unique<tensor::DeviceArena>(*dev_, 4 * kN);
  stash_->SetDeviceMemory(arena_.get(), &device::EmulatedBackend());
  device::StreamScope scope(*compute_);
  const StashHandle first = SaveWant();
  ASSERT_TRUE(stash_->Offload(first).ok());
  stash_->WaitForCopies();
  const StashHandle second = SaveWant("layers.2.moe.expert_hidden");  // the arena is full again
  ASSERT_TRUE(dev_->PauseStream(*compute_).ok());
  ASSERT_TRUE(stash_->Offload(second).ok());  // its copy waits for the held compute stream
  // Released once the reload has found the arena full and waits for the offload's copy (or after
  // 10 s, for a reload that failed without waiting).
  const int64_t waits_before = engine_->stats().blocked_waits;
  std::thread release([&] {
    for (int i = 0; i < 10000 && engine_->stats().blocked_waits == waits_before; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    ASSERT_TRUE(dev_->ResumeStream(*compute_).ok());
  });
  const absl::Status prefetched = stash_->Prefetch({first});
  release.join();
  ASSERT_TRUE(prefetched.ok()) << prefetched;
  auto lease = stash_->Acquire({first});
  ASSERT_TRUE(lease.ok()) << lease.status();
  EXPECT_EQ(ReadOn(*compute_, stash_->Get(first)->data), want_);
}

}  // namespace
}  // namespace furnace::model
