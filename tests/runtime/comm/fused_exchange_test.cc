// FusedAllToAllAllGather against the unfused reference (AllToAllV over the a2a group, then
// AllGatherV of its result over the ag group, on separate LocalGroups), byte for byte, on grids of
// threads (2x2, 4x2, 2x4, 1x3, 3x1, 1x1) and on two groups over the same members (in the same and
// in the reversed rank order), with uneven random sizes, zero-sized chunks, a rank that sends
// nothing and a rank that receives nothing; both results are also checked against a closed form.
// Payload bytes encode (sender, receiver, index) and `out` starts as a sentinel, so a misrouted,
// misplaced or missing chunk, or a write outside the chunks, shows by value. Then: the gather
// really runs beside the exchange; bad layouts fail with InvalidArgument before anything is sent;
// a rank that fails alone, or a failing all-gather, make every rank return instead of hanging; and
// one run over real Gloo processes (fork_world.h).
#include "runtime/comm/fused_exchange.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <numeric>
#include <ostream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "fork_world.h"
#include "fused_exchange_cases.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/base/status.h"
#include "runtime/comm/file_kv_store.h"
#include "runtime/comm/gloo_communicator.h"
#include "runtime/comm/local_communicator.h"

namespace furnace::comm {
namespace {

using fused_cases::Case;
using fused_cases::ClosedForm;
using fused_cases::Comms;
using fused_cases::FirstDifference;
using fused_cases::Grid;
using fused_cases::HookedCommunicator;
using fused_cases::kSentinel;
using fused_cases::MakeCase;
using fused_cases::MakeComms;
using fused_cases::Place;
using fused_cases::RecvBytes;
using fused_cases::Reference;
using fused_cases::RunThreads;
using fused_cases::SameMembers;
using fused_cases::Sizes;
using fused_cases::Topology;

class FusedExchangeTest : public ::testing::TestWithParam<Topology> {};

TEST_P(FusedExchangeTest, MatchesAllToAllThenAllGatherByteForByte) {
  const Topology& topology = GetParam();
  const int G = topology.G;
  for (uint32_t seed : {1u, 2u, 3u}) {
    SCOPED_TRACE(absl::StrCat("seed ", seed));
    const std::vector<std::vector<int64_t>> sizes = Sizes(topology, seed);
    Comms fused = MakeComms(topology, "fused/");
    Comms reference = MakeComms(topology, "ref/");
    RunThreads(topology.world(), [&](int t) {
      const Case c = MakeCase(topology, sizes, seed, t);
      const std::vector<uint8_t> want = ClosedForm(topology, c, t);
      std::vector<uint8_t> ref;
      ASSERT_TRUE(Reference(topology, sizes, c, t, *reference.a2a[t], *reference.ag[t], ref).ok());
      EXPECT_EQ(FirstDifference(ref, want), "") << "reference, thread " << t;
      // Twice on the same communicators: back-to-back calls must not mix their messages.
      for (int call = 0; call < 2; ++call) {
        std::vector<uint8_t> out(c.out_bytes, kSentinel);
        const absl::Status status = FusedAllToAllAllGather(*fused.a2a[t], *fused.ag[t], c.in.data(),
                                                           out.data(), c.out_bytes, c.layout);
        ASSERT_TRUE(status.ok()) << status;
        EXPECT_EQ(FirstDifference(out, ref), "") << "thread " << t << ", call " << call;
      }
      // The counts of the header: G-1 sends and receives on a2a, G all-gathers on ag.
      const int a = topology.places[t].a2a_rank, q0 = topology.places[t].ag_rank;
      int64_t sent = 0, received = 0, gathered = 0;
      for (int i = 0; i < G; ++i) {
        if (i != a) sent += c.layout.send_bytes[i];
        if (i != 0) received += c.layout.chunk_bytes[q0][i];
        gathered += c.layout.chunk_bytes[q0][i];
      }
      const CommCounters& a2a = fused.a2a[t]->counters();
      const CommCounters& ag = fused.ag[t]->counters();
      EXPECT_EQ(a2a.calls(CollectiveOp::kSend), 2 * (G - 1));
      EXPECT_EQ(a2a.bytes(CollectiveOp::kSend), 2 * sent);
      EXPECT_EQ(a2a.calls(CollectiveOp::kRecv), 2 * (G - 1));
      EXPECT_EQ(a2a.bytes(CollectiveOp::kRecv), 2 * received);
      EXPECT_EQ(ag.calls(CollectiveOp::kAllGather), 2 * G);
      EXPECT_EQ(ag.bytes(CollectiveOp::kAllGather), 2 * gathered);
    });
  }
}

INSTANTIATE_TEST_SUITE_P(Topologies, FusedExchangeTest,
                         ::testing::Values(Grid(2, 2), Grid(4, 2), Grid(2, 4), Grid(1, 3),
                                           Grid(3, 1), Grid(1, 1), SameMembers(2, false),
                                           SameMembers(2, true), SameMembers(3, true)),
                         [](const ::testing::TestParamInfo<Topology>& info) {
                           return info.param.name;
                         });

// A 4x1 grid (G = 4, n = 1), every rank hooked: the all-gather of step 1 waits until the exchange
// of step 2 has begun, and the exchange's Recv of step 3 until the all-gather of step 1 has begun:
// both are only possible if they run on different threads at the same time (one thread, in either
// order, would wait for itself and time out).
TEST(FusedExchangeOverlapTest, TheGatherOfOneStepRunsWhileTheNextIsExchanged) {
  const Topology topology = Grid(4, 1);
  const std::vector<std::vector<int64_t>> sizes = Sizes(topology, 5);
  Comms comms = MakeComms(topology, "overlap/");
  RunThreads(topology.world(), [&](int t) {
    std::mutex mu;
    std::condition_variable cv;
    int recvs_begun = 0, gathers_begun = 0;  // Recv k is step k+1; AllGatherV k is step k
    bool waited_too_long = false;
    auto wait_for = [&](std::unique_lock<std::mutex>& lock, const std::function<bool()>& ready) {
      if (!cv.wait_for(lock, std::chrono::seconds(5), ready)) waited_too_long = true;
    };
    auto on_recv = [&](int k) {
      std::unique_lock<std::mutex> lock(mu);
      recvs_begun = k + 1;
      cv.notify_all();
      if (k + 1 == 3) wait_for(lock, [&] { return gathers_begun >= 2; });
    };
    auto on_all_gather = [&](int k) {
      std::unique_lock<std::mutex> lock(mu);
      gathers_begun = k + 1;
      cv.notify_all();
      if (k == 1) wait_for(lock, [&] { return recvs_begun >= 2; });
    };
    HookedCommunicator a2a(std::move(comms.a2a[t]), on_recv, nullptr);
    HookedCommunicator ag(std::move(comms.ag[t]), nullptr, on_all_gather);
    const Case c = MakeCase(topology, sizes, 5, t);
    std::vector<uint8_t> out(c.out_bytes, kSentinel);
    const absl::Status status =
        FusedAllToAllAllGather(a2a, ag, c.in.data(), out.data(), c.out_bytes, c.layout);
    ASSERT_TRUE(status.ok()) << status;
    EXPECT_FALSE(waited_too_long) << "thread " << t
                                  << ": the gather and the exchange did not overlap";
    EXPECT_EQ(FirstDifference(out, ClosedForm(topology, c, t)), "") << "thread " << t;
  });
}

// ---- Errors. ----

TEST(FusedExchangeErrorTest, BadLayoutsFailWithInvalidArgumentBeforeAnythingIsSent) {
  const Topology topology = Grid(2, 2);
  const std::vector<std::vector<int64_t>> sizes = Sizes(topology, 9);
  // Thread 1 (a2a rank 1, ag rank 0) sends and receives something in this draw.
  const Case good = MakeCase(topology, sizes, 9, 1);
  // A short timeout: a layout that slipped through would fail the test in seconds, not hang it.
  Comms comms = MakeComms(topology, "bad/", /*timeout_s=*/2);
  Communicator& a2a = *comms.a2a[1];
  Communicator& ag = *comms.ag[1];
  std::vector<uint8_t> out(good.out_bytes);
  struct Bad {
    std::string what;
    std::function<void(FusedLayout&, int64_t&)> spoil;
  };
  const std::vector<Bad> bads = {
      {"send_bytes too long", [](FusedLayout& l, int64_t&) { l.send_bytes.push_back(0); }},
      {"send_bytes negative", [](FusedLayout& l, int64_t&) { l.send_bytes[0] = -1; }},
      {"chunk_bytes missing a row", [](FusedLayout& l, int64_t&) { l.chunk_bytes.pop_back(); }},
      {"chunk_offset row too short",
       [](FusedLayout& l, int64_t&) { l.chunk_offset[1].pop_back(); }},
      {"chunk beyond out",
       [](FusedLayout& l, int64_t& out_bytes) {
         l.chunk_offset[1][1] = out_bytes - l.chunk_bytes[1][1] + 1;
       }},
      {"offset negative", [](FusedLayout& l, int64_t&) { l.chunk_offset[0][0] = -1; }},
      {"out one byte short of the last chunk",
       [](FusedLayout& l, int64_t& out_bytes) {
         out_bytes = 0;
         for (size_t q = 0; q < l.chunk_bytes.size(); ++q) {
           for (size_t i = 0; i < l.chunk_bytes[q].size(); ++i) {
             out_bytes = std::max(out_bytes, l.chunk_offset[q][i] + l.chunk_bytes[q][i]);
           }
         }
         out_bytes -= 1;
       }},
      {"overlapping chunks",
       [](FusedLayout& l, int64_t&) {
         l.chunk_bytes[0][1] = 10;
         l.chunk_bytes[1][1] = 10;
         l.chunk_offset[1][1] = l.chunk_offset[0][1] + 5;
       }},
      {"self chunk disagrees", [](FusedLayout& l, int64_t&) { l.chunk_bytes[0][0] += 1; }},
  };
  for (const Bad& bad : bads) {
    FusedLayout layout = good.layout;
    int64_t out_bytes = good.out_bytes;
    bad.spoil(layout, out_bytes);
    const absl::Status status =
        FusedAllToAllAllGather(a2a, ag, good.in.data(), out.data(), out_bytes, layout);
    EXPECT_TRUE(absl::IsInvalidArgument(status)) << bad.what << ": " << status;
  }
  const absl::Status same =
      FusedAllToAllAllGather(a2a, a2a, good.in.data(), out.data(), good.out_bytes, good.layout);
  EXPECT_TRUE(absl::IsInvalidArgument(same)) << same;
  EXPECT_THAT(same.message(), ::testing::HasSubstr("different Communicator objects"));
  // Nothing was sent, and both communicators are still healthy.
  for (int op = 0; op < kNumCollectiveOps; ++op) {
    EXPECT_EQ(a2a.counters().calls(static_cast<CollectiveOp>(op)), 0);
    EXPECT_EQ(ag.counters().calls(static_cast<CollectiveOp>(op)), 0);
  }
  EXPECT_TRUE(a2a.AsyncError().ok());
  EXPECT_TRUE(ag.AsyncError().ok());
}

// Thread 0 passes a bad layout and returns at once; the others, waiting for it in the exchange or
// in the all-gather, or for a peer that gave up, fail by their timeout instead of hanging (ctest's
// timeout catches a hang).
TEST(FusedExchangeErrorTest, OneRankWithABadLayoutFailsAloneAndThePeersTimeOut) {
  for (const Topology& topology : {Grid(2, 2), Grid(4, 2)}) {
    SCOPED_TRACE(topology.name);
    const std::vector<std::vector<int64_t>> sizes = Sizes(topology, 4);
    Comms comms = MakeComms(topology, "alone/", /*timeout_s=*/0.5);
    RunThreads(topology.world(), [&](int t) {
      Case c = MakeCase(topology, sizes, 4, t);
      if (t == 0) c.layout.chunk_offset[0][0] = c.out_bytes + 1;
      std::vector<uint8_t> out(c.out_bytes);
      const absl::Status status = FusedAllToAllAllGather(*comms.a2a[t], *comms.ag[t], c.in.data(),
                                                         out.data(), c.out_bytes, c.layout);
      if (t == 0) {
        EXPECT_TRUE(absl::IsInvalidArgument(status)) << status;
      } else {
        EXPECT_TRUE(absl::IsDeadlineExceeded(status)) << "thread " << t << ": " << status;
      }
    });
  }
}

// The all-gather fails on every rank (its groups aborted): the exchange still completes on the
// healthy a2a groups (no rank waits out its timeout there: that would fail the a2a group with a
// sticky DeadlineExceeded, which the checks below would see), and every rank returns the
// gather's error; the a2a groups stay healthy and carry no message of this call into the next one.
TEST(FusedExchangeErrorTest, AFailingAllGatherFailsTheCallButTheExchangeCompletes) {
  const Topology topology = Grid(4, 2);
  const std::vector<std::vector<int64_t>> sizes = Sizes(topology, 6);
  Comms comms = MakeComms(topology, "abort/");
  for (int t = 0; t < topology.world(); ++t) comms.ag[t]->Abort("test");
  RunThreads(topology.world(), [&](int t) {
    const Case c = MakeCase(topology, sizes, 6, t);
    std::vector<uint8_t> out(c.out_bytes);
    const absl::Status status = FusedAllToAllAllGather(*comms.a2a[t], *comms.ag[t], c.in.data(),
                                                       out.data(), c.out_bytes, c.layout);
    EXPECT_TRUE(absl::IsCancelled(status)) << "thread " << t << ": " << status;
    EXPECT_TRUE(comms.a2a[t]->AsyncError().ok()) << comms.a2a[t]->AsyncError();
  });
  // The a2a groups still work: a plain all-to-all of one byte to everyone.
  RunThreads(topology.world(), [&](int t) {
    const int G = topology.G;
    std::vector<uint8_t> in(G, static_cast<uint8_t>(t)), got(G);
    const std::vector<int64_t> ones(G, 1);
    ASSERT_TRUE(comms.a2a[t]->AllToAllV(in.data(), ones, got.data(), ones).ok());
    for (int r = 0; r < G; ++r) {
      EXPECT_EQ(got[r], topology.A2aThread(topology.places[t].a2a_group, r)) << "thread " << t;
    }
  });
}

// ---- Real processes: Gloo over TCP on 127.0.0.1, a 2x2 grid of forked ranks. ----

absl::StatusOr<std::unique_ptr<Communicator>> Connect(const std::string& dir,
                                                      const std::string& prefix, int rank,
                                                      int size) {
  FileKvStore store(dir);
  GlooOptions options;
  options.timeout_s = 30;
  return CreateGlooCommunicator(store, prefix, absl::StrCat(prefix, "[", size, "]"), rank, size,
                                options);
}

TEST(FusedExchangeGlooTest, MatchesTheReferenceOverGlooProcesses) {
  const Topology topology = Grid(2, 2);
  const uint32_t seed = 8;
  const std::vector<std::vector<int64_t>> sizes = Sizes(topology, seed);
  forked::TempDir dir("furnace_fused_exchange_");
  ASSERT_FALSE(dir.path().empty());
  const std::vector<forked::ChildExit> exits = forked::RunForked(4, [&](int t) {
    const Place& p = topology.places[t];
    absl::StatusOr<std::unique_ptr<Communicator>> a2a =
        Connect(dir.path(), absl::StrCat("a2a/", p.a2a_group), p.a2a_rank, topology.G);
    CHILD_OK(t, a2a.status());
    absl::StatusOr<std::unique_ptr<Communicator>> ag =
        Connect(dir.path(), absl::StrCat("ag/", p.ag_group), p.ag_rank, topology.n);
    CHILD_OK(t, ag.status());
    const Case c = MakeCase(topology, sizes, seed, t);
    std::vector<uint8_t> out(c.out_bytes, kSentinel);
    CHILD_OK(t,
             FusedAllToAllAllGather(**a2a, **ag, c.in.data(), out.data(), c.out_bytes, c.layout));
    // The reference on the same communicators, after the fused call.
    std::vector<uint8_t> ref;
    CHILD_OK(t, Reference(topology, sizes, c, t, **a2a, **ag, ref));
    const std::string vs_reference = FirstDifference(out, ref);
    const std::string vs_closed_form = FirstDifference(out, ClosedForm(topology, c, t));
    if (!vs_reference.empty() || !vs_closed_form.empty()) {
      std::fprintf(stderr, "rank %d: vs reference: %s; vs closed form: %s\n", t,
                   vs_reference.c_str(), vs_closed_form.c_str());
      return 1;
    }
    return 0;
  });
  for (const forked::ChildExit& exit : exits) EXPECT_TRUE(exit.ok()) << exit.Describe();
}

}  // namespace
}  // namespace furnace::comm
