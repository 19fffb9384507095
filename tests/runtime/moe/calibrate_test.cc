// Calibrate on 4 threads as ranks (LocalGroup): tp 2 x ep 2, every rank gets a bit-identical
// profile with positive betas on the measured (kind, group) fits and none elsewhere. On a
// discrete device (the emulated one) every timed collective gets the device's memory.
#include "runtime/moe/calibrate.h"

#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/comm/device_staging.h"
#include "runtime/comm/local_communicator.h"
#include "runtime/device/emulated_device.h"
#include "tests/testing/forwarding_communicator.h"

namespace furnace::moe {
namespace {

using ::testing::HasSubstr;

TEST(CalibrateTest, EveryRankFitsTheSameProfile) {
  // Ranks 0..3, tp fastest: tp groups {0,1}, {2,3}; ep groups {0,2}, {1,3}.
  constexpr int kWorld = 4;
  comm::LocalGroup world(kWorld, {.name = "world"});
  comm::LocalGroup tp0(2, {.name = "tp[0,1]"}), tp1(2, {.name = "tp[2,3]"});
  comm::LocalGroup ep0(2, {.name = "ep[0,2]"}), ep1(2, {.name = "ep[1,3]"});
  std::vector<std::unique_ptr<comm::Communicator>> w, tp, ep;
  for (int r = 0; r < kWorld; ++r) {
    w.push_back(world.Member(r));
    tp.push_back((r < 2 ? tp0 : tp1).Member(r % 2));
    ep.push_back((r % 2 == 0 ? ep0 : ep1).Member(r / 2));
  }
  CalibrationOptions options;
  // Sizes far enough apart that copying dominates the rendezvous, so the slopes are positive.
  options.sizes_bytes = {64 << 10, 1 << 20, 8 << 20};
  options.repeats = 3;
  options.gemm_seconds = [](int64_t flops) { return 1e-5 + 1e-11 * static_cast<double>(flops); };
  std::vector<absl::StatusOr<CostProfile>> out(kWorld, absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (int r = 0; r < kWorld; ++r) {
    threads.emplace_back([&, r] {
      CalibrationGroups g{.world = w[r].get(), .tp = tp[r].get(), .ep = ep[r].get()};
      out[r] = Calibrate(g, options);
    });
  }
  for (std::thread& t : threads) t.join();

  for (int r = 0; r < kWorld; ++r) ASSERT_TRUE(out[r].ok()) << out[r].status();
  const CostProfile& p = *out[0];
  for (int r = 1; r < kWorld; ++r) EXPECT_EQ(out[r]->ToJson(), p.ToJson()) << "rank " << r;

  const AlphaBeta& tp_ag = p.at(CollectiveKind::kAllGather, OpGroup::kTp);
  const AlphaBeta& ep_a2a = p.at(CollectiveKind::kAllToAll, OpGroup::kEp);
  EXPECT_EQ(tp_ag.points, 3);
  EXPECT_EQ(ep_a2a.points, 3);
  EXPECT_GT(tp_ag.beta, 0);
  EXPECT_GT(ep_a2a.beta, 0);
  // Not used by any schedule, or a group of one: unfitted.
  EXPECT_EQ(p.at(CollectiveKind::kAllToAll, OpGroup::kTp).points, 0);
  EXPECT_EQ(p.at(CollectiveKind::kAllGather, OpGroup::kEsp).points, 0);
  // The caller's GEMM: an exact line.
  EXPECT_EQ(p.gemm.points, 3);
  EXPECT_NEAR(p.gemm.beta, 1e-11, 1e-13);
  EXPECT_GT(p.seconds_spent, 0);
  EXPECT_THAT(p.source, HasSubstr("fitted on tp 2 x ep 2 x esp 1 (world 4)"));
}

TEST(CalibrateTest, RejectsOptionsThatCannotRun) {
  CalibrationOptions o;
  o.sizes_bytes.clear();
  EXPECT_TRUE(absl::IsInvalidArgument(Calibrate({}, o).status()));
  o = CalibrationOptions{};
  o.repeats = 0;
  EXPECT_TRUE(absl::IsInvalidArgument(Calibrate({}, o).status()));
}

TEST(CalibrateTest, ASingleRankFitsNoCollective) {
  absl::StatusOr<CostProfile> p = Calibrate({}, CalibrationOptions{});
  ASSERT_TRUE(p.ok()) << p.status();
  for (OpGroup g : kCommGroups) {
    for (CollectiveKind k : kAllCollectiveKinds) EXPECT_EQ(p->at(k, g).points, 0);
  }
  EXPECT_EQ(p->gemm.points, 0);  // no gemm_seconds: DefaultProfile's numbers
  EXPECT_GT(p->gemm.beta, 0);
}

// Forwards to `inner`, counting the timed collectives' buffers that are (not) `device`'s memory.
class PointerCheck final : public testing::ForwardingCommunicator {
 public:
  PointerCheck(std::unique_ptr<comm::Communicator> inner, const device::Device& device)
      : ForwardingCommunicator(std::move(inner)), device_(device) {}
  absl::Status ReduceScatter(const float* in, float* out, int64_t count_per_rank) override {
    Note(in, out);
    return ForwardingCommunicator::ReduceScatter(in, out, count_per_rank);
  }
  absl::Status AllGather(const void* in, void* out, int64_t bytes_per_rank) override {
    Note(in, out);
    return ForwardingCommunicator::AllGather(in, out, bytes_per_rank);
  }
  absl::Status AllToAllV(const void* in, const std::vector<int64_t>& send_bytes, void* out,
                         const std::vector<int64_t>& recv_bytes) override {
    Note(in, out);
    return ForwardingCommunicator::AllToAllV(in, send_bytes, out, recv_bytes);
  }

  int on_device() const { return on_device_; }
  int on_host() const { return on_host_; }

 private:
  void Note(const void* in, const void* out) {
    const bool both = device_.IsDeviceMemory(in) && device_.IsDeviceMemory(out);
    ++(both ? on_device_ : on_host_);
  }
  const device::Device& device_;
  int on_device_ = 0, on_host_ = 0;
};

TEST(CalibrateTest, OnADeviceEveryCollectiveGetsDeviceMemory) {
  constexpr int kWorld = 2;
  comm::LocalGroup world(kWorld, {.name = "world"}), tp(kWorld, {.name = "tp"});
  std::vector<std::unique_ptr<device::EmulatedDevice>> devices;
  std::vector<std::unique_ptr<comm::Communicator>> w;
  std::vector<PointerCheck*> checks;
  std::vector<std::unique_ptr<comm::Communicator>> t;
  for (int r = 0; r < kWorld; ++r) {
    absl::StatusOr<std::unique_ptr<device::EmulatedDevice>> d =
        device::CreateEmulatedDevice({.memory_bytes = size_t{64} << 20});
    ASSERT_TRUE(d.ok()) << d.status();
    devices.push_back(*std::move(d));
    w.push_back(comm::ForDevice(world.Member(r), *devices[r]));
    auto check =
        std::make_unique<PointerCheck>(comm::ForDevice(tp.Member(r), *devices[r]), *devices[r]);
    checks.push_back(check.get());
    t.push_back(std::move(check));
  }
  CalibrationOptions options;
  options.sizes_bytes = {16 << 10, 64 << 10};
  options.repeats = 2;
  std::vector<absl::StatusOr<CostProfile>> out(kWorld, absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (int r = 0; r < kWorld; ++r) {
    threads.emplace_back([&, r] {
      CalibrationOptions o = options;
      o.device = devices[r].get();
      out[r] = Calibrate({.world = w[r].get(), .tp = t[r].get()}, o);
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (int r = 0; r < kWorld; ++r) {
    ASSERT_TRUE(out[r].ok()) << out[r].status();
    EXPECT_EQ(checks[r]->on_host(), 0) << "rank " << r;
    // tp: all_gather at 2 sizes, 2 calls each.
    EXPECT_EQ(checks[r]->on_device(), 4) << "rank " << r;
  }
  EXPECT_EQ(out[0]->ToJson(), out[1]->ToJson());
  EXPECT_EQ(out[0]->at(CollectiveKind::kAllGather, OpGroup::kTp).points, 2);
  // The same calibration without a device hands the collectives host memory.
  threads.clear();
  for (int r = 0; r < kWorld; ++r) {
    threads.emplace_back(
        [&, r] { out[r] = Calibrate({.world = w[r].get(), .tp = t[r].get()}, options); });
  }
  for (std::thread& thread : threads) thread.join();
  for (int r = 0; r < kWorld; ++r) {
    ASSERT_TRUE(out[r].ok()) << out[r].status();
    EXPECT_EQ(checks[r]->on_host(), 4) << "rank " << r;
  }
}

}  // namespace
}  // namespace furnace::moe
