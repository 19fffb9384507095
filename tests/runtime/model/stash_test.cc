#include "runtime/model/stash.h"

#include <atomic>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/device/backend.h"
#include "runtime/memory/copy_engine.h"
#include "runtime/tensor/arena.h"
#include "runtime/tensor/host_pool.h"

namespace furnace::model {
namespace {

using tensor::DType;

class StashTest : public ::testing::Test {
 protected:
  std::unique_ptr<device::Device> device_ = device::CreateCpuDevice();
  tensor::DeviceArena arena_{*device_, 0};
  Stash stash_;
};

TEST_F(StashTest, SaveGetReleaseAccounting) {
  absl::StatusOr<tensor::Buffer> a = arena_.Allocate(4 * 2 * 3, "a");
  ASSERT_TRUE(a.ok());
  void* data = a->data();
  absl::StatusOr<StashHandle> ha = stash_.Save("layers.1.moe.expert_hidden", 1, std::move(*a),
                                               {2, 3}, DType::kF32, {"gelu", {}, 60});
  ASSERT_TRUE(ha.ok()) << ha.status();
  absl::StatusOr<tensor::Buffer> b = arena_.Allocate(4 * 5, "b");
  ASSERT_TRUE(b.ok());
  absl::StatusOr<StashHandle> hb =
      stash_.Save("embedding.tokens", -1, std::move(*b), {5}, DType::kI32, {});
  ASSERT_TRUE(hb.ok());
  EXPECT_EQ(stash_.stashed_bytes(), 44u);
  EXPECT_EQ(stash_.size(), 2);

  absl::StatusOr<tensor::TensorView> v = stash_.Get(*ha);
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(v->data, data);
  EXPECT_EQ(v->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(v->dtype, DType::kF32);

  std::vector<StashEntryInfo> entries = stash_.Entries();
  ASSERT_EQ(entries.size(), 2u);
  EXPECT_EQ(entries[0].producer, "layers.1.moe.expert_hidden");
  EXPECT_EQ(entries[0].layer, 1);
  EXPECT_EQ(entries[0].bytes, 24u);
  EXPECT_EQ(entries[0].state, StashState::kKept);
  EXPECT_EQ(entries[0].recompute.op, "gelu");
  EXPECT_EQ(entries[1].producer, "embedding.tokens");

  ASSERT_TRUE(stash_.Release(*ha).ok());
  EXPECT_EQ(stash_.stashed_bytes(), 20u);
  EXPECT_EQ(arena_.current_bytes(), 20u);  // the bytes went back to the arena
  EXPECT_EQ(stash_.peak_stashed_bytes(), 44u);
  EXPECT_EQ(stash_.Get(*ha).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(stash_.Release(*ha).code(), absl::StatusCode::kNotFound);

  stash_.ReleaseAll();
  EXPECT_EQ(stash_.size(), 0);
  EXPECT_EQ(stash_.stashed_bytes(), 0u);
  EXPECT_EQ(arena_.current_bytes(), 0u);
}

TEST_F(StashTest, SizeMismatchIsInvalidArgument) {
  absl::StatusOr<tensor::Buffer> a = arena_.Allocate(10, "a");
  ASSERT_TRUE(a.ok());
  absl::StatusOr<StashHandle> h = stash_.Save("x", 0, std::move(*a), {3}, DType::kF32, {});
  EXPECT_EQ(h.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(h.status().message(), ::testing::HasSubstr("'x'"));
}

TEST_F(StashTest, EntriesAreKeyedByMicroBatchAndProducer) {
  for (int micro : {0, 1}) {
    stash_.set_micro_batch(micro);
    absl::StatusOr<tensor::Buffer> a = arena_.Allocate(8, "a");
    ASSERT_TRUE(a.ok());
    ASSERT_TRUE(stash_.Save("layers.1.moe.gates", 1, std::move(*a), {2}, DType::kF32, {}).ok());
  }
  absl::StatusOr<StashHandle> m0 = stash_.Find(0, "layers.1.moe.gates");
  absl::StatusOr<StashHandle> m1 = stash_.Find(1, "layers.1.moe.gates");
  ASSERT_TRUE(m0.ok() && m1.ok());
  EXPECT_NE(m0->id, m1->id);
  EXPECT_EQ(stash_.Entries()[1].micro, 1);
  EXPECT_EQ(stash_.Find(2, "layers.1.moe.gates").status().code(), absl::StatusCode::kNotFound);
  absl::StatusOr<tensor::Buffer> again = arena_.Allocate(8, "again");
  ASSERT_TRUE(again.ok());
  absl::StatusOr<StashHandle> dup =
      stash_.Save("layers.1.moe.gates", 1, std::move(*again), {2}, DType::kF32, {});
  EXPECT_EQ(dup.status().code(), absl::StatusCode::kAlreadyExists);
  ASSERT_TRUE(stash_.Release(*m1).ok());
  EXPECT_EQ(stash_.Find(1, "layers.1.moe.gates").status().code(), absl::StatusCode::kNotFound);
}

// ---- Offload and compress ----

// Holds the copy thread inside its pacing sleep while `held` is set (a job then stays in flight).
struct HeldLink {
  std::atomic<bool> held{false};
  std::atomic<int> sleeps{0};
  absl::Notification entered, release;
  void Sleep() {
    if (!held.load()) return;
    if (sleeps++ == 0) entered.Notify();  // (both directions' threads may get here at once)
    release.WaitForNotification();
  }
};

class StashActionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    memory::CopyEngineOptions o;
    o.host_link_gbps = 1000;  // paced, so HeldLink can hold a job; the fake clock never sleeps
    o.clock = &clock_;
    o.sleep_until = [this](double) { link_.Sleep(); };
    absl::StatusOr<std::unique_ptr<memory::CopyEngine>> e = memory::CopyEngine::Create(*device_, o);
    ASSERT_TRUE(e.ok()) << e.status();
    engine_ = std::move(*e);
    stash_ = std::make_unique<Stash>();
    stash_->SetDeviceMemory(&arena_, &device::CpuBackend());
    stash_->SetOffloadTargets(engine_.get(), &host_);
  }
  void TearDown() override {
    stash_.reset();  // before the engine it waits on
    engine_.reset();
  }
  // A (n) fp32 tensor of distinct values under `producer`; its values in *values.
  StashHandle SaveValues(const std::string& producer, int n, std::vector<float>* values) {
    absl::StatusOr<tensor::Buffer> b = arena_.Allocate(4 * n, producer);
    EXPECT_TRUE(b.ok());
    values->resize(n);
    for (int i = 0; i < n; ++i) (*values)[i] = 0.37f * i - 11.0f + 1e-3f * (i % 7);
    std::memcpy(b->data(), values->data(), 4 * n);
    absl::StatusOr<StashHandle> h = stash_->Save(producer, 1, std::move(*b), {n}, DType::kF32, {});
    EXPECT_TRUE(h.ok()) << h.status();
    return h.ok() ? *h : StashHandle{};
  }
  std::vector<float> Values(StashHandle h) {
    absl::StatusOr<tensor::TensorView> v = stash_->Get(h);
    EXPECT_TRUE(v.ok()) << v.status();
    if (!v.ok()) return {};
    return std::vector<float>(v->as<float>(), v->as<float>() + v->numel());
  }
  StashState State(StashHandle h) {
    for (const StashEntryInfo& e : stash_->Entries()) {
      if (e.id == h.id) return e.state;
    }
    return StashState::kDropped;
  }

  std::unique_ptr<device::Device> device_ = device::CreateCpuDevice();
  tensor::DeviceArena arena_{*device_, 0};
  tensor::HostPool host_{*device_, 0};
  FakeClock clock_;
  HeldLink link_;
  std::unique_ptr<memory::CopyEngine> engine_;
  std::unique_ptr<Stash> stash_;
};

TEST_F(StashActionTest, OffloadFreesTheDeviceBytesAndGetIsBitExact) {
  std::vector<float> want;
  const StashHandle h = SaveValues("layers.1.moe.expert_hidden", 1000, &want);
  EXPECT_EQ(arena_.current_bytes(), 4000u);
  ASSERT_TRUE(stash_->Offload(h).ok());
  EXPECT_EQ(State(h), StashState::kOffloaded);
  stash_->WaitForCopies();
  EXPECT_EQ(arena_.current_bytes(), 0u);  // freed when the copy completed
  EXPECT_EQ(host_.current_bytes(), 4000u);
  EXPECT_EQ(stash_->stashed_bytes(), 0u);
  EXPECT_EQ(stash_->peak_stashed_bytes(), 4000u);

  const std::vector<float> got = Values(h);  // reloads and waits
  ASSERT_EQ(got.size(), want.size());
  EXPECT_EQ(std::memcmp(got.data(), want.data(), 4 * want.size()), 0);
  EXPECT_EQ(State(h), StashState::kKept);
  EXPECT_EQ(arena_.current_bytes(), 4000u);
  EXPECT_EQ(host_.current_bytes(), 0u);
  const StashActionStats st = stash_->action_stats();
  EXPECT_EQ(st.offloaded_bytes, 4000u);
  EXPECT_EQ(st.reloaded_bytes, 4000u);
  const memory::CopyEngineStats es = engine_->stats();
  EXPECT_EQ(es.bytes_to_host, 4000u);
  EXPECT_EQ(es.bytes_to_device, 4000u);
  ASSERT_TRUE(stash_->Release(h).ok());
  EXPECT_EQ(arena_.current_bytes(), 0u);
}

TEST_F(StashActionTest, PrefetchAcquireAndPin) {
  std::vector<float> va, vb;
  const StashHandle a = SaveValues("layers.1.moe.expert_input", 64, &va);
  const StashHandle b = SaveValues("layers.1.moe.expert_hidden", 32, &vb);
  ASSERT_TRUE(stash_->Offload(a).ok());
  ASSERT_TRUE(stash_->Offload(b).ok());
  stash_->WaitForCopies();
  EXPECT_EQ(arena_.current_bytes(), 0u);
  ASSERT_TRUE(stash_->Prefetch({b, a}).ok());         // backward order
  EXPECT_EQ(arena_.current_bytes(), 4u * (64 + 32));  // the reload buffers are allocated up front
  stash_->WaitForCopies();  // the reloads land before the backward needs them
  absl::StatusOr<Stash::Lease> lease = stash_->Acquire({a, b, StashHandle{}});
  ASSERT_TRUE(lease.ok()) << lease.status();
  EXPECT_EQ(State(a), StashState::kKept);
  EXPECT_EQ(State(b), StashState::kKept);
  EXPECT_EQ(Values(a), va);
  EXPECT_EQ(Values(b), vb);
  // Acquired entries are pinned: their pointers stay valid until released.
  EXPECT_EQ(stash_->Offload(a).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(stash_->Compress(b, memory::Codec::kBf16).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(stash_->action_stats().late_reloads, 0);  // landed before Acquire
  *lease = Stash::Lease();                            // unpinned: actions are allowed again
  ASSERT_TRUE(stash_->Compress(b, memory::Codec::kBf16).ok());
  ASSERT_TRUE(stash_->Release(a).ok());
  ASSERT_TRUE(stash_->Release(b).ok());
  EXPECT_EQ(arena_.current_bytes(), 0u);
  EXPECT_EQ(host_.current_bytes(), 0u);
}

// One Acquire over entries in every state: an offloaded one is reloaded, a compressed one decoded,
// a dropped one rebuilt (its rebuild reads the offloaded one through Get), a kept one stays; all
// are pinned until the lease ends, and Drop, Offload and Compress refuse them meanwhile.
TEST_F(StashActionTest, AcquireRestoresOffloadedCompressedAndDroppedEntriesTogether) {
  std::vector<float> vx, vh, vk;
  const StashHandle x = SaveValues("layers.1.moe.expert_input", 64, &vx);
  const StashHandle h = SaveValues("layers.1.moe.expert_hidden", 64, &vh);
  const StashHandle k = SaveValues("layers.1.moe.gates", 8, &vk);
  // y = 2 x, rebuilt from x.
  RecomputeSpec twice{"scale", {x}, 64};
  int rebuilds = 0;
  twice.rebuild = [this, x, &rebuilds]() -> absl::StatusOr<tensor::Buffer> {
    ++rebuilds;
    absl::StatusOr<tensor::TensorView> in = stash_->Get(x);
    if (!in.ok()) return in.status();
    absl::StatusOr<tensor::Buffer> out = arena_.Allocate(4 * 64, "y");
    if (!out.ok()) return out.status();
    for (int i = 0; i < 64; ++i) out->as<float>()[i] = 2 * in->as<float>()[i];
    return out;
  };
  absl::StatusOr<tensor::Buffer> yb = arena_.Allocate(4 * 64, "y");
  ASSERT_TRUE(yb.ok());
  std::vector<float> vy(64);
  for (int i = 0; i < 64; ++i) vy[i] = 2 * vx[i];
  std::memcpy(yb->data(), vy.data(), 4 * 64);
  absl::StatusOr<StashHandle> y =
      stash_->Save("layers.1.moe.expert_pre", 1, std::move(*yb), {64}, DType::kF32, twice);
  ASSERT_TRUE(y.ok()) << y.status();

  ASSERT_TRUE(stash_->Drop(*y).ok());
  ASSERT_TRUE(stash_->Offload(x).ok());
  ASSERT_TRUE(stash_->Compress(h, memory::Codec::kBf16).ok());
  stash_->WaitForCopies();
  EXPECT_EQ(State(*y), StashState::kDropped);
  EXPECT_EQ(State(x), StashState::kOffloaded);
  EXPECT_EQ(State(h), StashState::kCompressed);
  EXPECT_EQ(arena_.current_bytes(), memory::EncodedBytes(memory::Codec::kBf16, 64) + 4u * 8);

  absl::StatusOr<Stash::Lease> lease = stash_->Acquire({*y, h, k, x});
  ASSERT_TRUE(lease.ok()) << lease.status();
  for (StashHandle e : {x, *y, h, k}) EXPECT_EQ(State(e), StashState::kKept);
  EXPECT_EQ(rebuilds, 1);
  EXPECT_EQ(Values(x), vx);  // bit-exact
  EXPECT_EQ(Values(*y), vy);
  EXPECT_EQ(Values(k), vk);
  const std::vector<float> got = Values(h);
  ASSERT_EQ(got.size(), vh.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_LE(std::fabs(got[i] - vh[i]), memory::ErrorBound(memory::Codec::kBf16, vh[i], 0));
  }
  EXPECT_EQ(stash_->action_stats().reloaded_bytes, 4u * 64);
  EXPECT_EQ(stash_->rebuilt_bytes(), 4u * 64);
  EXPECT_EQ(stash_->Drop(*y).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(stash_->Offload(x).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(stash_->Compress(h, memory::Codec::kBf16).code(),
            absl::StatusCode::kFailedPrecondition);
  *lease = Stash::Lease();
  EXPECT_TRUE(stash_->Drop(*y).ok());
  EXPECT_TRUE(stash_->Offload(x).ok());
  stash_->ReleaseAll();
  EXPECT_EQ(arena_.current_bytes(), 0u);
  EXPECT_EQ(host_.current_bytes(), 0u);
}

// Recompute and reduced precision never combine: a tensor is not dropped while its rebuild's input
// is (or was: decoded values keep the error) stored compressed, and an input is not compressed
// while a dropped tensor rebuilds from it, whichever comes first; a save policy's drop of such a
// tensor keeps it. An offloaded input is exact: the drop goes ahead.
TEST_F(StashActionTest, NothingIsRebuiltFromACompressedInput) {
  std::vector<float> vx, vy;
  const StashHandle x = SaveValues("layers.1.moe.expert_input", 64, &vx);
  RecomputeSpec from_x{"grouped_matmul", {x}, 64};
  from_x.rebuild = [this]() { return arena_.Allocate(4 * 64, "y"); };
  const auto save_y = [&]() {
    absl::StatusOr<tensor::Buffer> b = arena_.Allocate(4 * 64, "y");
    EXPECT_TRUE(b.ok());
    absl::StatusOr<StashHandle> h =
        stash_->Save("layers.1.moe.expert_pre", 1, std::move(*b), {64}, DType::kF32, from_x);
    EXPECT_TRUE(h.ok()) << h.status();
    return h.ok() ? *h : StashHandle{};
  };

  // The summaries tell the planner which actions the stash will refuse (gpt_moe_adaptive.cc).
  const auto summary = [&](StashHandle h) {
    for (const StashEntrySummary& e : stash_->Summaries()) {
      if (e.handle.id == h.id) return e;
    }
    ADD_FAILURE() << "no summary of " << h.id;
    return StashEntrySummary{};
  };
  // Dropped first: the input stays fp32.
  StashHandle y = save_y();
  EXPECT_EQ(summary(y).rebuild_inputs, std::vector<int64_t>{x.id});
  EXPECT_FALSE(summary(x).dropped_reader);
  ASSERT_TRUE(stash_->Drop(y).ok());
  EXPECT_TRUE(summary(x).dropped_reader);  // compressing x is refused now
  EXPECT_FALSE(summary(y).lossy_input);
  absl::Status s = stash_->Compress(x, memory::Codec::kBf16);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), ::testing::HasSubstr("'layers.1.moe.expert_pre' is dropped"));
  EXPECT_EQ(State(x), StashState::kKept);
  ASSERT_TRUE(stash_->Release(y).ok());

  // Compressed first: the tensor stays kept, before and after the input is decoded.
  ASSERT_TRUE(stash_->Compress(x, memory::Codec::kBf16).ok());
  y = save_y();
  EXPECT_TRUE(summary(y).lossy_input);  // dropping y is refused
  EXPECT_FALSE(summary(x).dropped_reader);
  s = stash_->Drop(y);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), ::testing::HasSubstr("reads 'layers.1.moe.expert_input'"));
  ASSERT_TRUE(stash_->Get(x).ok());  // decoded
  EXPECT_EQ(State(x), StashState::kKept);
  EXPECT_EQ(stash_->Drop(y).code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(stash_->Release(y).ok());
  stash_->SetSavePolicy(
      [](const StashEntryInfo&) { return memory::SaveAction::kDropAfterForward; });
  y = save_y();
  ASSERT_TRUE(stash_->ApplyPendingDrops().ok());
  EXPECT_EQ(State(y), StashState::kKept);
  stash_->SetSavePolicy(nullptr);
  ASSERT_TRUE(stash_->Release(y).ok());
  ASSERT_TRUE(stash_->Release(x).ok());

  // An offloaded input: exact, so the drop goes ahead.
  std::vector<float> vz;
  const StashHandle z = SaveValues("layers.1.moe.expert_input", 64, &vz);
  from_x.inputs = {z};
  y = save_y();
  ASSERT_TRUE(stash_->Offload(z).ok());
  EXPECT_TRUE(stash_->Drop(y).ok());
  stash_->ReleaseAll();
}

TEST_F(StashActionTest, AReloadStillInFlightWhenAcquiredIsLate) {
  std::vector<float> want;
  const StashHandle h = SaveValues("layers.1.moe.expert_pre", 256, &want);
  ASSERT_TRUE(stash_->Offload(h).ok());
  stash_->WaitForCopies();
  link_.held.store(true);
  std::thread backward([&] { EXPECT_TRUE(stash_->Acquire({h}).ok()); });
  link_.entered.WaitForNotification();  // the reload is being copied
  while (engine_->stats().late_reloads == 0) absl::SleepFor(absl::Milliseconds(1));
  link_.release.Notify();
  backward.join();
  EXPECT_EQ(stash_->action_stats().late_reloads, 1);
  EXPECT_EQ(Values(h), want);
}

TEST_F(StashActionTest, WantedBackBeforeTheOffloadLandedKeepsTheDeviceBytes) {
  std::vector<float> want;
  const StashHandle h = SaveValues("layers.1.moe.combined_output", 128, &want);
  link_.held.store(true);
  ASSERT_TRUE(stash_->Offload(h).ok());
  link_.entered.WaitForNotification();  // the offload copy is in flight
  std::thread backward([&] { EXPECT_TRUE(stash_->Acquire({h}).ok()); });
  while (engine_->stats().blocked_waits == 0) absl::SleepFor(absl::Milliseconds(1));
  link_.release.Notify();
  backward.join();
  // Waiting for an offload that has not landed is not a reload: it is never a late one.
  EXPECT_EQ(engine_->stats().late_reloads, 0);
  EXPECT_EQ(stash_->action_stats().late_reloads, 0);
  EXPECT_EQ(Values(h), want);
  EXPECT_EQ(arena_.current_bytes(), 512u);  // never freed, never reloaded
  EXPECT_EQ(host_.current_bytes(), 0u);
  EXPECT_EQ(engine_->stats().bytes_to_device, 0u);
}

// The bytes an offload still copying frees when it lands: counted while the copy is in flight
// (the planner projects the arena without them: they are already leaving), none once it landed,
// and none for one wanted back before landing (its device bytes stay).
TEST_F(StashActionTest, OffloadingBytesAreTheDeviceBytesOfOffloadsStillCopying) {
  std::vector<float> va, vb;
  const StashHandle a = SaveValues("layers.1.moe.expert_pre", 64, &va);
  const StashHandle b = SaveValues("layers.1.moe.expert_hidden", 32, &vb);
  EXPECT_EQ(stash_->OffloadingBytes(), 0u);
  link_.held.store(true);
  ASSERT_TRUE(stash_->Offload(a).ok());
  link_.entered.WaitForNotification();  // a's copy is in flight
  EXPECT_EQ(stash_->OffloadingBytes(), 256u);
  EXPECT_EQ(arena_.current_bytes(), 256u + 128u);  // its device bytes are still held
  // b wanted back before its offload (queued behind a's) landed: its bytes stay on the device.
  ASSERT_TRUE(stash_->Offload(b).ok());
  EXPECT_EQ(stash_->OffloadingBytes(), 256u + 128u);
  std::thread backward([&] { EXPECT_TRUE(stash_->Acquire({b}).ok()); });
  // (Bounded: a regression fails the test instead of hanging it.)
  for (int i = 0; i < 10000 && stash_->OffloadingBytes() != 256u; ++i) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  EXPECT_EQ(stash_->OffloadingBytes(), 256u);  // b's bytes stay, a's are still leaving
  link_.release.Notify();
  backward.join();
  stash_->WaitForCopies();
  EXPECT_EQ(stash_->OffloadingBytes(), 0u);
  EXPECT_EQ(arena_.current_bytes(), 128u);  // a landed and left; b stayed
  EXPECT_EQ(Values(a), va);
  EXPECT_EQ(Values(b), vb);
}

TEST_F(StashActionTest, CompressStoresTheEncodingAndGetRestoresFp32) {
  std::vector<float> want;
  const StashHandle h = SaveValues("layers.1.moe.expert_hidden", 1000, &want);
  ASSERT_TRUE(stash_->Compress(h, memory::Codec::kFp8E4M3).ok());
  EXPECT_EQ(State(h), StashState::kCompressed);
  const uint64_t encoded = memory::EncodedBytes(memory::Codec::kFp8E4M3, 1000);
  EXPECT_EQ(arena_.current_bytes(), encoded);
  EXPECT_EQ(stash_->stashed_bytes(), encoded);
  const std::vector<float> got = Values(h);
  ASSERT_EQ(got.size(), want.size());
  float amax = 0;
  for (int i = 0; i < 128; ++i) amax = std::max(amax, std::fabs(want[i]));
  for (int i = 0; i < 128; ++i) {
    EXPECT_LE(std::fabs(got[i] - want[i]),
              memory::ErrorBound(memory::Codec::kFp8E4M3, want[i], amax / 448.0f));
  }
  EXPECT_NE(got, want);  // lossy
  EXPECT_EQ(arena_.current_bytes(), 4000u);
  const StashActionStats st = stash_->action_stats();
  EXPECT_EQ(st.compressed_bytes, 4000u);
  EXPECT_EQ(st.compressed_saved_bytes, 4000u - encoded);

  // bf16 after decompression: a second action on the same entry.
  ASSERT_TRUE(stash_->Compress(h, memory::Codec::kBf16).ok());
  EXPECT_EQ(arena_.current_bytes(), 2000u);
  ASSERT_TRUE(stash_->Acquire({h}).ok());
  EXPECT_EQ(arena_.current_bytes(), 4000u);
}

// A compressed entry can still be offloaded: its encoding goes to the host (its bytes, not the
// tensor's), comes back as the encoding and is decoded, giving what the entry would have given
// had it stayed on the device; wanted back before that offload landed, it keeps its encoding.
TEST_F(StashActionTest, AnEncodingIsOffloadedAndDecodedOnItsWayBack) {
  std::vector<float> want, same;
  const StashHandle h = SaveValues("layers.1.moe.expert_hidden", 1000, &want);
  const StashHandle twin = SaveValues("layers.2.moe.expert_hidden", 1000, &same);
  ASSERT_TRUE(stash_->Compress(h, memory::Codec::kBf16).ok());
  ASSERT_TRUE(stash_->Compress(twin, memory::Codec::kBf16).ok());
  const uint64_t encoded = memory::EncodedBytes(memory::Codec::kBf16, 1000);
  EXPECT_EQ(arena_.current_bytes(), 2 * encoded);
  ASSERT_TRUE(stash_->Offload(h).ok());
  EXPECT_EQ(State(h), StashState::kOffloaded);
  stash_->WaitForCopies();
  EXPECT_EQ(arena_.current_bytes(), encoded);  // the twin's encoding only
  EXPECT_EQ(host_.current_bytes(), encoded);
  EXPECT_EQ(stash_->action_stats().offloaded_bytes, encoded);
  ASSERT_TRUE(stash_->Prefetch({h}).ok());  // brings the encoding back, not the tensor
  stash_->WaitForCopies();
  EXPECT_EQ(State(h), StashState::kCompressed);
  EXPECT_EQ(arena_.current_bytes(), 2 * encoded);
  EXPECT_EQ(stash_->action_stats().reloaded_bytes, encoded);
  const std::vector<float> decoded = Values(twin);  // (SaveValues gives both the same values)
  EXPECT_EQ(Values(h), decoded);                    // decoded: as if it had never left
  EXPECT_NE(decoded, want);                         // (and lossy)
  EXPECT_EQ(State(h), StashState::kKept);
  EXPECT_EQ(host_.current_bytes(), 0u);
  ASSERT_TRUE(stash_->Release(h).ok());
  ASSERT_TRUE(stash_->Release(twin).ok());
  EXPECT_EQ(arena_.current_bytes(), 0u);

  // Wanted back while its offload is still being copied: the encoding stays and is decoded.
  const StashHandle late = SaveValues("layers.3.moe.expert_hidden", 1000, &want);
  ASSERT_TRUE(stash_->Compress(late, memory::Codec::kBf16).ok());
  link_.held.store(true);
  ASSERT_TRUE(stash_->Offload(late).ok());
  link_.entered.WaitForNotification();
  const int64_t waits_before = engine_->stats().blocked_waits;
  std::thread backward([&] { EXPECT_TRUE(stash_->Acquire({late}).ok()); });
  while (engine_->stats().blocked_waits == waits_before) absl::SleepFor(absl::Milliseconds(1));
  link_.release.Notify();
  backward.join();
  EXPECT_EQ(State(late), StashState::kKept);
  EXPECT_EQ(Values(late), decoded);
  EXPECT_EQ(arena_.current_bytes(), 4000u);  // decoded; the encoding freed
  EXPECT_EQ(host_.current_bytes(), 0u);
  EXPECT_EQ(engine_->stats().bytes_to_device, encoded);  // only the first entry's reload
}

TEST_F(StashActionTest, Errors) {
  std::vector<float> v;
  const StashHandle gates = SaveValues("layers.1.moe.gates", 16, &v);
  absl::Status s = stash_->Compress(gates, memory::Codec::kBf16);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), ::testing::HasSubstr("'layers.1.moe.gates'"));
  EXPECT_EQ(State(gates), StashState::kKept);
  EXPECT_EQ(stash_->Offload(StashHandle{999}).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(stash_->Prefetch({StashHandle{999}}).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(stash_->Compress(StashHandle{999}, memory::Codec::kBf16).code(),
            absl::StatusCode::kNotFound);

  ASSERT_TRUE(stash_->Offload(gates).ok());
  s = stash_->Offload(gates);  // twice
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), ::testing::HasSubstr("offloaded"));
  EXPECT_EQ(Values(gates), v);

  // A host pool too small: ResourceExhausted, and the tensor stays kept.
  tensor::HostPool tiny(*device_, 8);
  stash_->SetOffloadTargets(engine_.get(), &tiny);
  EXPECT_EQ(stash_->Offload(gates).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(State(gates), StashState::kKept);

  // Without a copy engine there is no offload.
  stash_->SetOffloadTargets(nullptr, nullptr);
  EXPECT_EQ(stash_->Offload(gates).code(), absl::StatusCode::kFailedPrecondition);

  // A shut-down engine refuses the copy; the tensor stays kept.
  stash_->SetOffloadTargets(engine_.get(), &host_);
  engine_->Shutdown();
  EXPECT_EQ(stash_->Offload(gates).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(State(gates), StashState::kKept);
  EXPECT_EQ(host_.current_bytes(), 0u);
  EXPECT_EQ(Values(gates), v);
}

// A save policy's drop of a tensor whose rebuild re-runs the expert all-to-all is applied on every
// rank of the group (the adaptive planner's agreed drops, full_recompute): a rank that cannot
// drop it (it left the arena meanwhile, or its rebuild would read a compressed input) would skip
// the all-to-all its peers run in the backward, so ApplyPendingDrops fails instead, naming it.
TEST_F(StashActionTest, ACollectiveDropThatCannotBeAppliedIsAnError) {
  stash_->SetSavePolicy([](const StashEntryInfo& e) {
    return e.recompute.collective != RecomputeCollective::kNone
               ? memory::SaveAction::kDropAfterForward
               : memory::SaveAction::kKeep;
  });
  auto save_collective = [this](const std::string& producer, std::vector<StashHandle> inputs) {
    absl::StatusOr<tensor::Buffer> b = arena_.Allocate(4 * 8, producer);
    EXPECT_TRUE(b.ok());
    std::memset(b->data(), 0, 4 * 8);
    RecomputeSpec spec{"grouped_matmul+combine", std::move(inputs), 16,
                       RecomputeCollective::kExpertDispatch};
    spec.rebuild = [this, producer]() { return arena_.Allocate(4 * 8, producer); };
    absl::StatusOr<StashHandle> h =
        stash_->Save(producer, 1, std::move(*b), {8}, DType::kF32, std::move(spec));
    EXPECT_TRUE(h.ok()) << h.status();
    return h.ok() ? *h : StashHandle{};
  };
  // Its input compressed before the module's forward is done.
  std::vector<float> v;
  const StashHandle hidden = SaveValues("layers.1.moe.expert_hidden", 16, &v);
  const StashHandle eo = save_collective("layers.1.moe.combined_output", {hidden});
  ASSERT_TRUE(stash_->Compress(hidden, memory::Codec::kBf16).ok());
  absl::Status s = stash_->ApplyPendingDrops();
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(s.message(), ::testing::HasSubstr("'layers.1.moe.combined_output' must be dropped "
                                                "on every rank"));
  EXPECT_THAT(s.message(), ::testing::HasSubstr("layers.1.moe.expert_hidden"));
  EXPECT_EQ(State(eo), StashState::kKept);
  EXPECT_TRUE(stash_->ApplyPendingDrops().ok());  // nothing left pending
  // Offloaded meanwhile.
  const StashHandle xin = save_collective("layers.3.moe.expert_input", {});
  ASSERT_TRUE(stash_->Offload(xin).ok());
  s = stash_->ApplyPendingDrops();
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(s.message(), ::testing::HasSubstr("'layers.3.moe.expert_input'"));
  stash_->WaitForCopies();
  // Kept, with exact inputs: dropped.
  const StashHandle ok = save_collective("layers.5.moe.expert_input", {});
  ASSERT_TRUE(stash_->ApplyPendingDrops().ok());
  EXPECT_EQ(State(ok), StashState::kDropped);
}

// Drop and recompute: a float buffer of n elements filled with `value`, with a rebuild that
// fills a fresh one the same way (counting its calls).
class DropTest : public StashTest {
 protected:
  absl::StatusOr<tensor::Buffer> Filled(int64_t n, float value) {
    absl::StatusOr<tensor::Buffer> b = arena_.Allocate(4 * n, "t");
    if (!b.ok()) return b.status();
    for (int64_t i = 0; i < n; ++i) b->as<float>()[i] = value + static_cast<float>(i);
    return b;
  }
  RecomputeSpec Spec(int64_t n, float value,
                     RecomputeCollective collective = RecomputeCollective::kNone) {
    RecomputeSpec spec{"fill", {}, 1.0 * n, collective};
    spec.rebuild = [this, n, value]() {
      ++rebuilds_;
      return Filled(n, value);
    };
    return spec;
  }
  StashHandle SaveFilled(const std::string& name, int64_t n, float value, RecomputeSpec spec) {
    absl::StatusOr<tensor::Buffer> b = Filled(n, value);
    EXPECT_TRUE(b.ok());
    absl::StatusOr<StashHandle> h =
        stash_.Save(name, 0, std::move(*b), {n}, DType::kF32, std::move(spec));
    EXPECT_TRUE(h.ok()) << h.status();
    return h.ok() ? *h : StashHandle{};
  }
  int rebuilds_ = 0;
};

TEST_F(DropTest, DropFreesTheBytesAndGetRebuildsThem) {
  const StashHandle h = SaveFilled("layers.0.ln1.out", 8, 3.0f, Spec(8, 3.0f));
  const StashHandle keep = SaveFilled("layers.0.attn.residual", 4, 0.0f, {});
  EXPECT_EQ(arena_.current_bytes(), 48u);
  ASSERT_TRUE(stash_.Drop(h).ok());
  EXPECT_EQ(arena_.current_bytes(), 16u);
  EXPECT_EQ(stash_.stashed_bytes(), 16u);
  EXPECT_EQ(stash_.dropped_bytes(), 32u);
  EXPECT_EQ(stash_.Entries()[0].state, StashState::kDropped);
  EXPECT_EQ(rebuilds_, 0);

  absl::StatusOr<tensor::TensorView> v = stash_.Get(h);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(rebuilds_, 1);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(v->as<float>()[i], 3.0f + i);
  EXPECT_EQ(stash_.rebuilt_bytes(), 32u);
  EXPECT_EQ(stash_.stashed_bytes(), 48u);
  EXPECT_EQ(stash_.Entries()[0].state, StashState::kKept);
  ASSERT_TRUE(stash_.Get(h).ok());
  EXPECT_EQ(rebuilds_, 1);  // kept again: no second rebuild
  ASSERT_TRUE(stash_.Release(keep).ok());
}

TEST_F(DropTest, DropRefusals) {
  const StashHandle plain = SaveFilled("embedding.tokens", 4, 0.0f, {"embedding", {}, 0});
  absl::Status s = stash_.Drop(plain);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), ::testing::HasSubstr("no rebuild"));

  const StashHandle expert = SaveFilled("layers.1.moe.expert_input", 4, 1.0f,
                                        Spec(4, 1.0f, RecomputeCollective::kExpertDispatch));
  s = stash_.Drop(expert);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), ::testing::HasSubstr("all-to-all"));

  const StashHandle h = SaveFilled("layers.0.ln1.out", 4, 2.0f, Spec(4, 2.0f));
  ASSERT_TRUE(stash_.Drop(h).ok());
  EXPECT_EQ(stash_.Drop(h).code(), absl::StatusCode::kFailedPrecondition);  // already dropped
  EXPECT_EQ(stash_.Drop(StashHandle{99}).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(stash_.Acquire({StashHandle{99}}).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(DropTest, AcquireRebuildsInOrderAndPinsUntilTheLeaseEnds) {
  // b's rebuild reads a: acquiring {a, b} rebuilds a first; acquiring b alone rebuilds a for it.
  const StashHandle a = SaveFilled("layers.0.ln2.out", 4, 1.0f, Spec(4, 1.0f));
  RecomputeSpec from_a{"gelu", {a}, 4};
  std::vector<std::string> order;
  from_a.rebuild = [this, a, &order]() -> absl::StatusOr<tensor::Buffer> {
    order.push_back("b");
    absl::StatusOr<tensor::TensorView> in = stash_.Get(a);
    if (!in.ok()) return in.status();
    absl::StatusOr<tensor::Buffer> out = arena_.Allocate(16, "b");
    if (!out.ok()) return out.status();
    for (int i = 0; i < 4; ++i) out->as<float>()[i] = 2 * in->as<float>()[i];
    return out;
  };
  const StashHandle b = SaveFilled("layers.0.mlp.hidden", 4, 2.0f, std::move(from_a));
  ASSERT_TRUE(stash_.Drop(a).ok());
  ASSERT_TRUE(stash_.Drop(b).ok());
  {
    absl::StatusOr<Stash::Lease> lease = stash_.Acquire({b, StashHandle{}});
    ASSERT_TRUE(lease.ok()) << lease.status();
    EXPECT_EQ(rebuilds_, 1);  // a, as b's input
    EXPECT_EQ(stash_.Get(b)->as<float>()[3], 8.0f);
    // Pinned: b cannot be dropped while the backward holds it; a (not acquired) can.
    EXPECT_EQ(stash_.Drop(b).code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_TRUE(stash_.Drop(a).ok());
    Stash::Lease moved = std::move(*lease);
    EXPECT_EQ(stash_.Drop(b).code(), absl::StatusCode::kFailedPrecondition);
  }
  EXPECT_TRUE(stash_.Drop(b).ok());  // the lease is gone
  {
    absl::StatusOr<Stash::Lease> lease = stash_.Acquire({a, b});
    ASSERT_TRUE(lease.ok());
    EXPECT_EQ(rebuilds_, 2);
    EXPECT_EQ(order.size(), 2u);
    // The owner may release a pinned entry at the end of its backward.
    EXPECT_TRUE(stash_.Release(a).ok());
    EXPECT_TRUE(stash_.Release(b).ok());
  }
  EXPECT_EQ(arena_.current_bytes(), 0u);
  // A failed Acquire leaves nothing pinned.
  const StashHandle c = SaveFilled("layers.0.ln1.out", 4, 5.0f, Spec(4, 5.0f));
  EXPECT_FALSE(stash_.Acquire({c, StashHandle{1234}}).ok());
  EXPECT_TRUE(stash_.Drop(c).ok());
}

TEST_F(DropTest, SavePolicyDropsAfterForwardOnly) {
  stash_.SetSavePolicy([](const StashEntryInfo& e) {
    return memory::StaticSaveAction(memory::MemoryPolicy::kFullRecompute,
                                    memory::TensorTag(e.producer));
  });
  const StashHandle ln = SaveFilled("layers.1.ln2.out", 4, 1.0f, Spec(4, 1.0f));
  // A collective rebuild may be dropped by the policy (every rank applies the same one).
  const StashHandle ex = SaveFilled("layers.1.moe.expert_input", 6, 2.0f,
                                    Spec(6, 2.0f, RecomputeCollective::kExpertDispatch));
  const StashHandle res = SaveFilled("layers.1.moe.residual", 2, 0.0f, {});
  EXPECT_EQ(stash_.stashed_bytes(), 48u);  // pending until the module's forward is done
  ASSERT_TRUE(stash_.Get(ln).ok());
  EXPECT_EQ(rebuilds_, 0);
  ASSERT_TRUE(stash_.ApplyPendingDrops().ok());
  EXPECT_EQ(stash_.stashed_bytes(), 8u);
  EXPECT_EQ(stash_.dropped_bytes(), 40u);
  ASSERT_TRUE(stash_.ApplyPendingDrops().ok());  // nothing left pending
  EXPECT_EQ(stash_.dropped_bytes(), 40u);
  absl::StatusOr<Stash::Lease> lease = stash_.Acquire({ln, ex, res});
  ASSERT_TRUE(lease.ok());
  EXPECT_EQ(rebuilds_, 2);
  EXPECT_EQ(stash_.Get(ex)->as<float>()[5], 7.0f);

  // The policy dropping a tensor without a rebuild is refused at Save, naming it.
  absl::StatusOr<tensor::Buffer> b = Filled(4, 0);
  ASSERT_TRUE(b.ok());
  absl::StatusOr<StashHandle> bad =
      stash_.Save("layers.2.moe.expert_pre", 2, std::move(*b), {4}, DType::kF32, {});
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), ::testing::HasSubstr("layers.2.moe.expert_pre"));
}

// The save policy sees the micro-batch a tensor is saved in: the adaptive planner's plan for
// micro-batch j names j's tensors, never micro-batch 0's (a plan made for a spike in micro-batch
// 1 dropped nothing, and micro-batch 0's plan dropped micro-batch 1's tensors instead).
TEST_F(DropTest, SavePolicySeesTheMicroBatch) {
  std::vector<int> seen;
  stash_.SetSavePolicy([&seen](const StashEntryInfo& e) {
    seen.push_back(e.micro);
    return e.micro == 1 ? memory::SaveAction::kDropAfterForward : memory::SaveAction::kKeep;
  });
  const StashHandle m0 = SaveFilled("layers.1.ln2.out", 4, 1.0f, Spec(4, 1.0f));
  stash_.set_micro_batch(1);
  const StashHandle m1 = SaveFilled("layers.1.ln2.out", 4, 1.0f, Spec(4, 1.0f));
  stash_.set_micro_batch(0);
  EXPECT_EQ(seen, (std::vector<int>{0, 1}));
  ASSERT_TRUE(stash_.ApplyPendingDrops().ok());
  EXPECT_EQ(stash_.dropped_bytes(), 16u);  // micro-batch 1's, not micro-batch 0's
  EXPECT_EQ(stash_.stashed_bytes(), 16u);
  EXPECT_TRUE(stash_.Release(m0).ok());
  EXPECT_TRUE(stash_.Release(m1).ok());
}

TEST_F(DropTest, RebuildErrorsLeaveTheEntryDropped) {
  RecomputeSpec failing{"fill", {}, 0};
  failing.rebuild = []() -> absl::StatusOr<tensor::Buffer> {
    return absl::ResourceExhaustedError("arena full");
  };
  const StashHandle f = SaveFilled("layers.0.ln1.out", 4, 0.0f, std::move(failing));
  ASSERT_TRUE(stash_.Drop(f).ok());
  EXPECT_EQ(stash_.Get(f).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(stash_.Entries()[0].state, StashState::kDropped);

  const StashHandle w = SaveFilled("layers.0.ln2.out", 4, 0.0f, Spec(3, 0.0f));  // wrong size
  ASSERT_TRUE(stash_.Drop(w).ok());
  EXPECT_EQ(stash_.Get(w).status().code(), absl::StatusCode::kInternal);

  RecomputeSpec cyclic{"self", {}, 0};
  StashHandle self{2};  // the next id
  cyclic.rebuild = [this, &self]() -> absl::StatusOr<tensor::Buffer> {
    absl::StatusOr<tensor::TensorView> v = stash_.Get(self);
    if (!v.ok()) return v.status();
    return Filled(4, 0);
  };
  self = SaveFilled("layers.0.mlp.hidden", 4, 0.0f, std::move(cyclic));
  ASSERT_TRUE(stash_.Drop(self).ok());
  absl::Status s = stash_.Get(self).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(s.message(), ::testing::HasSubstr("needs itself"));
}

// The static offload's share of a layer's expert buffers (here in the demo's proportions: input
// and combined output 1/6 each, pre-activation and hidden 1/3 each): the subset closest to the
// ratio, and never nothing for a ratio above 0 (it was "each buffer that still fits", which for
// any ratio below 1/6 moved nothing at all).
TEST(MemoryPolicyTest, TheOffloadShareIsTheSubsetClosestToTheRatio) {
  using ::testing::ElementsAre;
  const std::vector<uint64_t> bytes = {100, 200, 200, 100};
  EXPECT_THAT(memory::OffloadShare(bytes, 0.05), ElementsAre(0));
  EXPECT_THAT(memory::OffloadShare(bytes, 0.1), ElementsAre(0));
  EXPECT_THAT(memory::OffloadShare(bytes, 1.0 / 3), ElementsAre(1));  // 200 over 100 + 100
  EXPECT_THAT(memory::OffloadShare(bytes, 0.5), ElementsAre(0, 1));   // 300 of 600
  EXPECT_THAT(memory::OffloadShare(bytes, 0.75), ElementsAre(1, 2));  // 450: 400 ties 500
  EXPECT_THAT(memory::OffloadShare(bytes, 1.0), ElementsAre(0, 1, 2, 3));
  EXPECT_THAT(memory::OffloadShare(bytes, 0.25), ElementsAre(0));  // 100 and 200 tie: fewer bytes
  EXPECT_TRUE(memory::OffloadShare(bytes, 0).empty());
  EXPECT_TRUE(memory::OffloadShare({0, 0}, 0.5).empty());
  EXPECT_THAT(memory::OffloadShare({0, 50}, 0.01), ElementsAre(1));  // an empty buffer is no share
}

TEST(MemoryPolicyTest, ParseTagsAndActions) {
  using memory::MemoryPolicy;
  using memory::SaveAction;
  EXPECT_EQ(*memory::ParseMemoryPolicy("selective"), MemoryPolicy::kSelective);
  EXPECT_EQ(*memory::ParseMemoryPolicy("full_recompute"), MemoryPolicy::kFullRecompute);
  EXPECT_EQ(*memory::ParseMemoryPolicy("none"), MemoryPolicy::kNone);
  EXPECT_EQ(*memory::ParseMemoryPolicy("offload"), MemoryPolicy::kOffload);
  EXPECT_EQ(*memory::ParseMemoryPolicy("adaptive"), MemoryPolicy::kAdaptive);
  absl::Status bad = memory::ParseMemoryPolicy("lazy").status();
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.message(), ::testing::HasSubstr("memory.policy"));
  EXPECT_EQ(memory::TensorTag("layers.12.moe.expert_hidden"), "moe.expert_hidden");
  EXPECT_EQ(memory::TensorTag("lnf.out"), "lnf.out");
  for (const char* tag : {"ln1.out", "ln2.out", "lnf.out", "mlp.hidden", "moe.expert_hidden"}) {
    EXPECT_EQ(memory::StaticSaveAction(MemoryPolicy::kNone, tag), SaveAction::kKeep);
    EXPECT_EQ(memory::StaticSaveAction(MemoryPolicy::kOffload, tag), SaveAction::kKeep);
    EXPECT_EQ(memory::StaticSaveAction(MemoryPolicy::kSelective, tag),
              SaveAction::kDropAfterForward);
    EXPECT_EQ(memory::StaticSaveAction(MemoryPolicy::kFullRecompute, tag),
              SaveAction::kDropAfterForward);
  }
  for (const char* tag : {"moe.router_probs", "moe.expert_input", "moe.combined_output"}) {
    EXPECT_EQ(memory::StaticSaveAction(MemoryPolicy::kOffload, tag), SaveAction::kKeep);
    EXPECT_EQ(memory::StaticSaveAction(MemoryPolicy::kSelective, tag), SaveAction::kKeep);
    EXPECT_EQ(memory::StaticSaveAction(MemoryPolicy::kFullRecompute, tag),
              SaveAction::kDropAfterForward);
  }
  for (const char* tag : {"moe.residual", "ln2.mean", "attn.qkv", "embedding.out"}) {
    EXPECT_EQ(memory::StaticSaveAction(MemoryPolicy::kFullRecompute, tag), SaveAction::kKeep);
  }
}

}  // namespace
}  // namespace furnace::model
