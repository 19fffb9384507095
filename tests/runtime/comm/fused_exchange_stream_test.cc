// FusedAllToAllAllGather on device communicators: every rank a thread with its own emulated
// discrete device, a2a and ag StreamCommunicators over the emulated transport (each on its own
// communication stream), `in` and `out` in device memory. The results are the host version's and
// the closed form's byte for byte (the same topologies and payloads: fused_exchange_cases.h), with
// the same byte counts; the input is uploaded and the output read back on the compute stream with
// no host synchronisation in between, and the call returns while the compute stream is still held
// (it only enqueues); the all-gather of one step runs on its stream while the next step is
// exchanged on the other (the device, not a host thread, overlaps them); a failing all-gather
// fails the call on every rank while the exchange completes on the healthy a2a groups.
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "emulated_ranks.h"
#include "fused_exchange_cases.h"
#include "gtest/gtest.h"
#include "runtime/comm/fused_exchange.h"
#include "runtime/comm/stream_communicator.h"

namespace furnace::comm {
namespace {

using emulated_ranks::Connect;
using emulated_ranks::EmulatedRank;
using emulated_ranks::MakeRank;
using fused_cases::Case;
using fused_cases::ClosedForm;
using fused_cases::Comms;
using fused_cases::FirstDifference;
using fused_cases::Grid;
using fused_cases::HookedCommunicator;
using fused_cases::kSentinel;
using fused_cases::MakeCase;
using fused_cases::MakeComms;
using fused_cases::Reference;
using fused_cases::RunThreads;
using fused_cases::SameMembers;
using fused_cases::Sizes;
using fused_cases::Topology;

// Thread t's rank: its device and its two device communicators around the host members in
// `comms` (moved out). `separate_watchdogs`: a2a and ag followed by two watchdogs, so that one
// group's failure does not stop the other (a rank's groups share one in production).
struct StreamRanks {
  std::vector<std::unique_ptr<EmulatedRank>> ranks;
  std::vector<std::unique_ptr<StreamCommunicator>> a2a, ag;
};

StreamRanks MakeStreamRanks(const Topology& topology, Comms& comms,
                            bool separate_watchdogs = false) {
  StreamRanks s;
  for (int t = 0; t < topology.world(); ++t) {
    s.ranks.push_back(MakeRank());
    EmulatedRank& rank = *s.ranks[t];
    std::shared_ptr<CommWatchdog> ag_watchdog = rank.watchdog;
    if (separate_watchdogs) ag_watchdog = *CommWatchdog::Create();
    s.a2a.push_back(Connect(rank, std::move(comms.a2a[t])));
    s.ag.push_back(Connect(rank, std::move(comms.ag[t]), ag_watchdog));
  }
  return s;
}

class FusedExchangeStreamTest : public ::testing::TestWithParam<Topology> {};

TEST_P(FusedExchangeStreamTest, MatchesTheHostVersionAndTheClosedFormByteForByte) {
  const Topology& topology = GetParam();
  const int G = topology.G;
  for (uint32_t seed : {1u, 2u}) {
    SCOPED_TRACE(absl::StrCat("seed ", seed));
    const std::vector<std::vector<int64_t>> sizes = Sizes(topology, seed);
    Comms fused = MakeComms(topology, "stream/");
    Comms reference = MakeComms(topology, "ref/");
    StreamRanks s = MakeStreamRanks(topology, fused);
    RunThreads(topology.world(), [&](int t) {
      EmulatedRank& me = *s.ranks[t];
      const device::StreamScope scope(*me.compute);
      const Case c = MakeCase(topology, sizes, seed, t);
      std::vector<uint8_t> ref;
      ASSERT_TRUE(Reference(topology, sizes, c, t, *reference.a2a[t], *reference.ag[t], ref).ok());
      EXPECT_EQ(FirstDifference(ref, ClosedForm(topology, c, t)), "") << "reference, thread " << t;
      uint8_t* d_in = me.Alloc<uint8_t>(c.in.size());
      uint8_t* d_out = me.Alloc<uint8_t>(c.out_bytes);
      const std::vector<uint8_t> sentinel(c.out_bytes, kSentinel);
      for (int call = 0; call < 2; ++call) {
        // Uploaded on the compute stream and not waited for: the call orders itself after it.
        me.Put(d_in, c.in);
        me.Put(d_out, sentinel);
        const absl::Status status =
            FusedAllToAllAllGather(*s.a2a[t], *s.ag[t], d_in, d_out, c.out_bytes, c.layout);
        ASSERT_TRUE(status.ok()) << status;
        EXPECT_EQ(FirstDifference(me.Get(d_out, c.out_bytes), ref), "")
            << "thread " << t << ", call " << call;
      }
      const int a = topology.places[t].a2a_rank, q0 = topology.places[t].ag_rank;
      int64_t sent = 0, received = 0, gathered = 0;
      for (int i = 0; i < G; ++i) {
        if (i != a) sent += c.layout.send_bytes[i];
        if (i != 0) received += c.layout.chunk_bytes[q0][i];
        gathered += c.layout.chunk_bytes[q0][i];
      }
      const CommCounters& a2a = s.a2a[t]->counters();
      const CommCounters& ag = s.ag[t]->counters();
      EXPECT_EQ(a2a.calls(CollectiveOp::kSend), 2 * (G - 1));
      EXPECT_EQ(a2a.bytes(CollectiveOp::kSend), 2 * sent);
      EXPECT_EQ(a2a.calls(CollectiveOp::kRecv), 2 * (G - 1));
      EXPECT_EQ(a2a.bytes(CollectiveOp::kRecv), 2 * received);
      EXPECT_EQ(ag.calls(CollectiveOp::kAllGather), 2 * G);
      EXPECT_EQ(ag.bytes(CollectiveOp::kAllGather), 2 * gathered);
      me.dev->Free(d_in);
      me.dev->Free(d_out);
    });
  }
}

INSTANTIATE_TEST_SUITE_P(Topologies, FusedExchangeStreamTest,
                         ::testing::Values(Grid(2, 2), Grid(4, 2), Grid(2, 4), Grid(1, 3),
                                           Grid(3, 1), Grid(1, 1), SameMembers(2, false),
                                           SameMembers(3, true)),
                         [](const ::testing::TestParamInfo<Topology>& info) {
                           return info.param.name;
                         });

// Every rank's compute stream is held with the upload of `in` still queued: the call returns
// anyway (it only enqueues), and the result read back after the release is right.
TEST(FusedExchangeStreamOrderingTest, TheCallOnlyEnqueuesAndWaitsForTheProducerOnTheDevice) {
  const Topology topology = Grid(2, 2);
  const std::vector<std::vector<int64_t>> sizes = Sizes(topology, 3);
  Comms comms = MakeComms(topology, "held/");
  StreamRanks s = MakeStreamRanks(topology, comms);
  RunThreads(topology.world(), [&](int t) {
    EmulatedRank& me = *s.ranks[t];
    const device::StreamScope scope(*me.compute);
    const Case c = MakeCase(topology, sizes, 3, t);
    uint8_t* d_in = me.Upload(std::vector<uint8_t>(c.in.size(), 0));  // stale
    uint8_t* d_out = me.Upload(std::vector<uint8_t>(c.out_bytes, kSentinel));
    ASSERT_TRUE(me.dev->PauseStream(*me.compute).ok());
    me.Put(d_in, c.in);  // the producer, held
    ASSERT_TRUE(
        FusedAllToAllAllGather(*s.a2a[t], *s.ag[t], d_in, d_out, c.out_bytes, c.layout).ok());
    ASSERT_TRUE(me.dev->ResumeStream(*me.compute).ok());
    EXPECT_EQ(FirstDifference(me.Get(d_out, c.out_bytes), ClosedForm(topology, c, t)), "")
        << "thread " << t;
    me.dev->Free(d_in);
    me.dev->Free(d_out);
  });
}

// A 4x1 grid, the host members hooked (the hooks run on the communication streams' threads): the
// all-gather of step 1 waits until the exchange's Recv of step 2 has begun, and the Recv of step 3
// until the all-gather of step 1 has begun. Both are possible only if ag's stream runs step 1
// while a2a's stream runs step 2; the calling thread only enqueues.
TEST(FusedExchangeStreamOrderingTest, TheGatherOfOneStepRunsOnItsStreamWhileTheNextIsExchanged) {
  const Topology topology = Grid(4, 1);
  const std::vector<std::vector<int64_t>> sizes = Sizes(topology, 5);
  Comms comms = MakeComms(topology, "overlap/");
  struct Hooks {
    std::mutex mu;
    std::condition_variable cv;
    int recvs_begun = 0, gathers_begun = 0;
    bool waited_too_long = false;
    void WaitFor(std::unique_lock<std::mutex>& lock, const std::function<bool()>& ready) {
      if (!cv.wait_for(lock, std::chrono::seconds(5), ready)) waited_too_long = true;
    }
  };
  std::vector<std::unique_ptr<Hooks>> hooks;
  Comms hooked;
  for (int t = 0; t < topology.world(); ++t) {
    hooks.push_back(std::make_unique<Hooks>());
    Hooks& h = *hooks[t];
    auto on_recv = [&h](int k) {
      std::unique_lock<std::mutex> lock(h.mu);
      h.recvs_begun = k + 1;
      h.cv.notify_all();
      if (k + 1 == 3) h.WaitFor(lock, [&] { return h.gathers_begun >= 2; });
    };
    auto on_all_gather = [&h](int k) {
      std::unique_lock<std::mutex> lock(h.mu);
      h.gathers_begun = k + 1;
      h.cv.notify_all();
      if (k == 1) h.WaitFor(lock, [&] { return h.recvs_begun >= 2; });
    };
    hooked.a2a.push_back(
        std::make_unique<HookedCommunicator>(std::move(comms.a2a[t]), on_recv, nullptr));
    hooked.ag.push_back(
        std::make_unique<HookedCommunicator>(std::move(comms.ag[t]), nullptr, on_all_gather));
  }
  StreamRanks s = MakeStreamRanks(topology, hooked);
  RunThreads(topology.world(), [&](int t) {
    EmulatedRank& me = *s.ranks[t];
    const device::StreamScope scope(*me.compute);
    const Case c = MakeCase(topology, sizes, 5, t);
    uint8_t* d_in = me.Upload(c.in);
    uint8_t* d_out = me.Upload(std::vector<uint8_t>(c.out_bytes, kSentinel));
    ASSERT_TRUE(
        FusedAllToAllAllGather(*s.a2a[t], *s.ag[t], d_in, d_out, c.out_bytes, c.layout).ok());
    EXPECT_EQ(FirstDifference(me.Get(d_out, c.out_bytes), ClosedForm(topology, c, t)), "")
        << "thread " << t;
    EXPECT_FALSE(hooks[t]->waited_too_long)
        << "thread " << t << ": the two streams did not overlap";
    me.dev->Free(d_in);
    me.dev->Free(d_out);
  });
}

// The all-gather groups are aborted on every rank: every call fails with their error, the exchange
// still completes on the healthy a2a groups (which stay usable: a plain all-to-all afterwards).
TEST(FusedExchangeStreamErrorTest, AFailingAllGatherFailsTheCallButTheExchangeCompletes) {
  const Topology topology = Grid(4, 2);
  const std::vector<std::vector<int64_t>> sizes = Sizes(topology, 6);
  Comms comms = MakeComms(topology, "abort/", /*timeout_s=*/5);
  StreamRanks s = MakeStreamRanks(topology, comms, /*separate_watchdogs=*/true);
  for (int t = 0; t < topology.world(); ++t) s.ag[t]->Abort("test");
  RunThreads(topology.world(), [&](int t) {
    EmulatedRank& me = *s.ranks[t];
    const device::StreamScope scope(*me.compute);
    const Case c = MakeCase(topology, sizes, 6, t);
    uint8_t* d_in = me.Upload(c.in);
    uint8_t* d_out = me.Alloc<uint8_t>(c.out_bytes);
    const absl::Status status =
        FusedAllToAllAllGather(*s.a2a[t], *s.ag[t], d_in, d_out, c.out_bytes, c.layout);
    EXPECT_TRUE(absl::IsCancelled(status)) << "thread " << t << ": " << status;
    // The exchange's own chunks landed.
    const std::vector<uint8_t> got = me.Get(d_out, c.out_bytes);
    const std::vector<uint8_t> want = ClosedForm(topology, c, t);
    const int q0 = topology.places[t].ag_rank;
    for (int i = 0; i < topology.G; ++i) {
      for (int64_t k = 0; k < c.layout.chunk_bytes[q0][i]; ++k) {
        const int64_t at = c.layout.chunk_offset[q0][i] + k;
        ASSERT_EQ(got[at], want[at]) << "thread " << t << ", step " << i << ", byte " << k;
      }
    }
    EXPECT_TRUE(s.a2a[t]->AsyncError().ok()) << s.a2a[t]->AsyncError();
    me.dev->Free(d_in);
    me.dev->Free(d_out);
  });
  RunThreads(topology.world(), [&](int t) {
    EmulatedRank& me = *s.ranks[t];
    const device::StreamScope scope(*me.compute);
    const int G = topology.G;
    uint8_t* d_in = me.Upload(std::vector<uint8_t>(G, static_cast<uint8_t>(t)));
    uint8_t* d_got = me.Alloc<uint8_t>(G);
    const std::vector<int64_t> ones(G, 1);
    ASSERT_TRUE(s.a2a[t]->AllToAllV(d_in, ones, d_got, ones).ok());
    const std::vector<uint8_t> got = me.Get(d_got, G);
    for (int r = 0; r < G; ++r) {
      EXPECT_EQ(got[r], topology.A2aThread(topology.places[t].a2a_group, r)) << "thread " << t;
    }
    me.dev->Free(d_in);
    me.dev->Free(d_got);
  });
}

}  // namespace
}  // namespace furnace::comm
