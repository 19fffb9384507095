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
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/base/status.h"
#include "runtime/comm/file_kv_store.h"
#include "runtime/comm/gloo_communicator.h"
#include "runtime/comm/local_communicator.h"

namespace furnace::comm {
namespace {

using Clock = std::chrono::steady_clock;

// ---- Topology: W threads (or processes), each a member of one a2a group and one ag group. ----

struct Place {
  int a2a_group = 0, a2a_rank = 0, ag_group = 0, ag_rank = 0;
};

struct Topology {
  std::string name;
  int G = 1;                  // a2a group size
  int n = 1;                  // ag group size
  std::vector<Place> places;  // (W)

  int world() const { return static_cast<int>(places.size()); }
  int a2a_groups() const { return world() / G; }
  int ag_groups() const { return world() / n; }
  int A2aThread(int group, int rank) const {
    for (int t = 0; t < world(); ++t) {
      if (places[t].a2a_group == group && places[t].a2a_rank == rank) return t;
    }
    return -1;
  }
  int AgThread(int group, int rank) const {
    for (int t = 0; t < world(); ++t) {
      if (places[t].ag_group == group && places[t].ag_rank == rank) return t;
    }
    return -1;
  }
};

std::ostream& operator<<(std::ostream& os, const Topology& topology) { return os << topology.name; }

// G x n grid: thread t is a2a rank t % G of a2a group t / G and ag rank t / G of ag group t % G
// (the usual layout: a2a inside a node, ag across the nodes at the same position).
Topology Grid(int G, int n) {
  Topology topology{absl::StrCat("grid_", G, "x", n), G, n, {}};
  for (int t = 0; t < G * n; ++t) topology.places.push_back({t / G, t % G, t % G, t / G});
  return topology;
}

// Both groups over the same `size` members, the ag ranks in the same or in reversed order.
Topology SameMembers(int size, bool reversed) {
  Topology topology{absl::StrCat("same_", size, reversed ? "_reversed" : ""), size, size, {}};
  for (int t = 0; t < size; ++t) topology.places.push_back({0, t, 0, reversed ? size - 1 - t : t});
  return topology;
}

// ---- Sizes, payloads and layouts: pure functions of (topology, seed), the same on every rank. --

uint8_t Byte(int sender, int receiver, int64_t k) {
  return static_cast<uint8_t>(sender * 37 + receiver * 11 + k * 3 + (k >> 8) + 1);
}

// sizes[t][j]: bytes thread t sends to a2a rank j of its group. Uneven, with random zeros and
// ones; thread
// 0 sends nothing at all and the last thread receives nothing at all.
std::vector<std::vector<int64_t>> Sizes(const Topology& topology, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int64_t> size(1, 300);
  std::uniform_int_distribution<int> coin(0, 3);
  const int W = topology.world(), G = topology.G;
  std::vector<std::vector<int64_t>> sizes(W, std::vector<int64_t>(G));
  for (int t = 0; t < W; ++t) {
    for (int j = 0; j < G; ++j) {
      const int c = coin(rng);
      sizes[t][j] = c == 0 ? 0 : c == 1 ? 1 : size(rng);
    }
  }
  sizes[0].assign(G, 0);
  const Place& last = topology.places[W - 1];
  for (int r = 0; r < G; ++r) sizes[topology.A2aThread(last.a2a_group, r)][last.a2a_rank] = 0;
  return sizes;
}

// Bytes thread t receives in the all-to-all, from each a2a rank of its group.
std::vector<int64_t> RecvBytes(const Topology& topology,
                               const std::vector<std::vector<int64_t>>& sizes, int t) {
  const Place& p = topology.places[t];
  std::vector<int64_t> recv(topology.G);
  for (int r = 0; r < topology.G; ++r)
    recv[r] = sizes[topology.A2aThread(p.a2a_group, r)][p.a2a_rank];
  return recv;
}

// The thread that ag member q of t's ag group received from at its step i.
int SourceOf(const Topology& topology, int t, int q, int i) {
  const int u = topology.AgThread(topology.places[t].ag_group, q);
  const Place& pu = topology.places[u];
  return topology.A2aThread(pu.a2a_group, (pu.a2a_rank - i + topology.G) % topology.G);
}

struct Case {
  FusedLayout layout;
  int64_t out_bytes = 0;
  std::vector<uint8_t> in;  // the payload thread t sends
};

// Thread t's layout: the ag group's chunks in an order and with gaps drawn from the group's own
// seed (so every member computes the same offsets), plus a tail the op must not touch.
Case MakeCase(const Topology& topology, const std::vector<std::vector<int64_t>>& sizes,
              uint32_t seed, int t) {
  const int G = topology.G, n = topology.n;
  const Place& p = topology.places[t];
  Case c;
  c.layout.send_bytes = sizes[t];
  c.layout.chunk_bytes.assign(n, std::vector<int64_t>(G));
  c.layout.chunk_offset.assign(n, std::vector<int64_t>(G));
  for (int q = 0; q < n; ++q) {
    const int u = topology.AgThread(p.ag_group, q);
    for (int i = 0; i < G; ++i) {
      c.layout.chunk_bytes[q][i] = sizes[SourceOf(topology, t, q, i)][topology.places[u].a2a_rank];
    }
  }
  std::mt19937 rng(seed * 7919 + static_cast<uint32_t>(p.ag_group) + 1);
  std::vector<int> order(n * G);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);
  std::uniform_int_distribution<int64_t> gap(0, 3);
  int64_t end = gap(rng);
  for (int k : order) {
    c.layout.chunk_offset[k / G][k % G] = end;
    end += c.layout.chunk_bytes[k / G][k % G] + gap(rng);
  }
  c.out_bytes = end + 5;
  for (int j = 0; j < G; ++j) {
    const int receiver = topology.A2aThread(p.a2a_group, j);
    for (int64_t k = 0; k < sizes[t][j]; ++k) c.in.push_back(Byte(t, receiver, k));
  }
  return c;
}

constexpr uint8_t kSentinel = 0xEE;

// What `out` must hold, from the payload formula alone.
std::vector<uint8_t> ClosedForm(const Topology& topology, const Case& c, int t) {
  std::vector<uint8_t> want(c.out_bytes, kSentinel);
  const int ag_group = topology.places[t].ag_group;
  for (int q = 0; q < topology.n; ++q) {
    const int receiver = topology.AgThread(ag_group, q);
    for (int i = 0; i < topology.G; ++i) {
      const int sender = SourceOf(topology, t, q, i);
      for (int64_t k = 0; k < c.layout.chunk_bytes[q][i]; ++k) {
        want[c.layout.chunk_offset[q][i] + k] = Byte(sender, receiver, k);
      }
    }
  }
  return want;
}

// The unfused reference on separate communicators: AllToAllV over a2a, AllGatherV of its result
// over ag, then each member's step-i chunk copied to where the layout puts it.
absl::Status Reference(const Topology& topology, const std::vector<std::vector<int64_t>>& sizes,
                       const Case& c, int t, Communicator& a2a, Communicator& ag,
                       std::vector<uint8_t>& out) {
  const int G = topology.G, n = topology.n;
  const std::vector<int64_t> recv = RecvBytes(topology, sizes, t);
  std::vector<uint8_t> exchanged(std::accumulate(recv.begin(), recv.end(), int64_t{0}));
  RETURN_IF_ERROR(a2a.AllToAllV(c.in.data(), c.layout.send_bytes, exchanged.data(), recv));
  std::vector<std::vector<int64_t>> member_recv(n);
  std::vector<int64_t> totals(n);
  for (int q = 0; q < n; ++q) {
    member_recv[q] = RecvBytes(topology, sizes, topology.AgThread(topology.places[t].ag_group, q));
    totals[q] = std::accumulate(member_recv[q].begin(), member_recv[q].end(), int64_t{0});
  }
  std::vector<uint8_t> gathered(std::accumulate(totals.begin(), totals.end(), int64_t{0}));
  RETURN_IF_ERROR(ag.AllGatherV(exchanged.data(), static_cast<int64_t>(exchanged.size()),
                                gathered.data(), totals));
  out.assign(c.out_bytes, kSentinel);
  int64_t base = 0;
  for (int q = 0; q < n; ++q) {
    const int a_q = topology.places[topology.AgThread(topology.places[t].ag_group, q)].a2a_rank;
    for (int i = 0; i < G; ++i) {
      const int s = (a_q - i + G) % G;
      const int64_t within =
          std::accumulate(member_recv[q].begin(), member_recv[q].begin() + s, int64_t{0});
      std::memcpy(out.data() + c.layout.chunk_offset[q][i], gathered.data() + base + within,
                  c.layout.chunk_bytes[q][i]);
    }
    base += totals[q];
  }
  return absl::OkStatus();
}

// Empty when equal, else where and how they first differ.
std::string FirstDifference(const std::vector<uint8_t>& got, const std::vector<uint8_t>& want) {
  if (got.size() != want.size()) return absl::StrCat(got.size(), " bytes, want ", want.size());
  for (size_t k = 0; k < got.size(); ++k) {
    if (got[k] != want[k]) {
      return absl::StrCat("byte ", k, " is ", static_cast<int>(got[k]), ", want ",
                          static_cast<int>(want[k]));
    }
  }
  return "";
}

// ---- Threads as ranks: one LocalGroup per group, fused and reference on separate groups. ----

struct Comms {
  std::vector<std::unique_ptr<Communicator>> a2a, ag;  // (W) the member of thread t
};

Comms MakeComms(const Topology& topology, const std::string& prefix, double timeout_s = 30) {
  std::vector<std::unique_ptr<LocalGroup>> a2a_groups, ag_groups;
  for (int g = 0; g < topology.a2a_groups(); ++g) {
    a2a_groups.push_back(std::make_unique<LocalGroup>(
        topology.G, LocalGroupOptions{absl::StrCat(prefix, "a2a/", g), timeout_s}));
  }
  for (int g = 0; g < topology.ag_groups(); ++g) {
    ag_groups.push_back(std::make_unique<LocalGroup>(
        topology.n, LocalGroupOptions{absl::StrCat(prefix, "ag/", g), timeout_s}));
  }
  Comms comms;
  for (const Place& p : topology.places) {
    comms.a2a.push_back(a2a_groups[p.a2a_group]->Member(p.a2a_rank));
    comms.ag.push_back(ag_groups[p.ag_group]->Member(p.ag_rank));
  }
  return comms;
}

void RunThreads(int world, const std::function<void(int)>& body) {
  std::vector<std::thread> threads;
  for (int t = 0; t < world; ++t) threads.emplace_back(body, t);
  for (std::thread& thread : threads) thread.join();
}

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

// ---- Overlap: the gather of step i-1 runs while step i is exchanged. ----

// Forwards everything to `inner`; Recv and AllGatherV call the hooks first (with the call's
// index, from 0).
class HookedCommunicator : public Communicator {
 public:
  HookedCommunicator(std::unique_ptr<Communicator> inner, std::function<void(int)> on_recv,
                     std::function<void(int)> on_all_gather)
      : inner_(std::move(inner)),
        on_recv_(std::move(on_recv)),
        on_all_gather_(std::move(on_all_gather)) {}
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  const std::string& name() const override { return inner_->name(); }
  absl::Status AllReduce(float* data, int64_t count) override {
    return inner_->AllReduce(data, count);
  }
  absl::Status ReduceScatter(const float* in, float* out, int64_t count_per_rank) override {
    return inner_->ReduceScatter(in, out, count_per_rank);
  }
  absl::Status ReduceScatterV(const float* in, float* out,
                              const std::vector<int64_t>& counts) override {
    return inner_->ReduceScatterV(in, out, counts);
  }
  absl::Status AllGather(const void* in, void* out, int64_t bytes_per_rank) override {
    return inner_->AllGather(in, out, bytes_per_rank);
  }
  absl::Status AllGatherV(const void* in, int64_t in_bytes, void* out,
                          const std::vector<int64_t>& recv_bytes) override {
    if (on_all_gather_) on_all_gather_(all_gathers_++);
    return inner_->AllGatherV(in, in_bytes, out, recv_bytes);
  }
  absl::Status AllToAllV(const void* in, const std::vector<int64_t>& send_bytes, void* out,
                         const std::vector<int64_t>& recv_bytes) override {
    return inner_->AllToAllV(in, send_bytes, out, recv_bytes);
  }
  absl::Status Broadcast(void* data, int64_t bytes, int root) override {
    return inner_->Broadcast(data, bytes, root);
  }
  absl::Status Send(const void* data, int64_t bytes, int peer, uint32_t tag) override {
    return inner_->Send(data, bytes, peer, tag);
  }
  absl::Status Recv(void* data, int64_t bytes, int peer, uint32_t tag) override {
    if (on_recv_) on_recv_(recvs_++);
    return inner_->Recv(data, bytes, peer, tag);
  }
  absl::Status WaitSends() override { return inner_->WaitSends(); }
  absl::Status Barrier() override { return inner_->Barrier(); }
  void Abort(const std::string& reason) override { inner_->Abort(reason); }
  absl::Status AsyncError() const override { return inner_->AsyncError(); }

 private:
  std::unique_ptr<Communicator> inner_;
  std::function<void(int)> on_recv_, on_all_gather_;
  int recvs_ = 0, all_gathers_ = 0;
};

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
// in the all-gather, or for a peer that gave up, fail by their timeout instead of hanging.
TEST(FusedExchangeErrorTest, OneRankWithABadLayoutFailsAloneAndThePeersTimeOut) {
  for (const Topology& topology : {Grid(2, 2), Grid(4, 2)}) {
    SCOPED_TRACE(topology.name);
    const std::vector<std::vector<int64_t>> sizes = Sizes(topology, 4);
    Comms comms = MakeComms(topology, "alone/", /*timeout_s=*/0.5);
    const Clock::time_point start = Clock::now();
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
    EXPECT_LT(std::chrono::duration<double>(Clock::now() - start).count(), 10.0);
  }
}

// The all-gather fails on every rank (its groups aborted): the exchange still completes on the
// healthy a2a groups (no rank waits out its timeout there), and every rank returns the gather's
// error; the a2a groups stay healthy and carry no message of this call into the next one.
TEST(FusedExchangeErrorTest, AFailingAllGatherFailsTheCallButTheExchangeCompletes) {
  const Topology topology = Grid(4, 2);
  const std::vector<std::vector<int64_t>> sizes = Sizes(topology, 6);
  Comms comms = MakeComms(topology, "abort/", /*timeout_s=*/5);
  for (int t = 0; t < topology.world(); ++t) comms.ag[t]->Abort("test");
  const Clock::time_point start = Clock::now();
  RunThreads(topology.world(), [&](int t) {
    const Case c = MakeCase(topology, sizes, 6, t);
    std::vector<uint8_t> out(c.out_bytes);
    const absl::Status status = FusedAllToAllAllGather(*comms.a2a[t], *comms.ag[t], c.in.data(),
                                                       out.data(), c.out_bytes, c.layout);
    EXPECT_TRUE(absl::IsCancelled(status)) << "thread " << t << ": " << status;
    EXPECT_TRUE(comms.a2a[t]->AsyncError().ok()) << comms.a2a[t]->AsyncError();
  });
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - start).count(), 4.0);
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
