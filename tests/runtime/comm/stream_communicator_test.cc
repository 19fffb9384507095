// StreamCommunicator on the emulated discrete device, over the emulated transport (each rank a
// thread with its own device, a compute stream and a communication stream per group): every
// collective on device memory, on host memory and on a mix gives bit for bit what the same
// collective gives on host buffers over the in-process fake, with the same byte counts; the
// ordering is by events only (the inputs are uploaded and the outputs read back on the compute
// stream, with no host synchronisation in between); and the two events are necessary: without the
// producer wait (the compute stream held by PauseStream while it still has to write the input) or
// without the consumer join (the communication stream held), the result is wrong.
#include "runtime/comm/stream_communicator.h"

#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "emulated_ranks.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/base/status.h"
#include "runtime/comm/emulated_transport.h"
#include "runtime/comm/in_flight.h"
#include "runtime/comm/local_communicator.h"
#include "runtime/comm/nccl_stream.h"
#include "tests/testing/forwarding_communicator.h"

namespace furnace::comm {
namespace {

using device::CopyKind;
using emulated_ranks::Connect;
using emulated_ranks::EmulatedRank;
using emulated_ranks::Eventually;
using emulated_ranks::MakeRank;
using emulated_ranks::RunRanks;

// Values whose sums depend on the order of the additions, so a reduction in another order shows.
float Value(int rank, int64_t i) {
  return static_cast<float>(rank + 1) * 0.37f + static_cast<float>(i % 101) * 1e-3f +
         (rank % 2 == 0 ? 1e4f : 0.0f);
}
std::vector<float> Values(int rank, int64_t n, int64_t salt = 0) {
  std::vector<float> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = Value(rank, i + salt);
  return v;
}
// A word that says who sent it to whom.
int32_t Word(int sender, int receiver, int64_t j) {
  return (sender << 24) | (receiver << 16) | static_cast<int32_t>(j & 0xffff);
}

// n ranks, each with one stream communicator (group `name`) and one host member of a twin group
// for the reference run.
struct World {
  std::vector<std::unique_ptr<EmulatedRank>> ranks;
  std::vector<std::unique_ptr<StreamCommunicator>> comms;
  std::vector<std::unique_ptr<Communicator>> host;
};

World MakeWorld(int n, const std::string& name) {
  World w;
  LocalGroup group(n, {.name = name});
  LocalGroup twin(n, {.name = absl::StrCat(name, "/host")});
  for (int r = 0; r < n; ++r) {
    w.ranks.push_back(MakeRank());
    w.comms.push_back(Connect(*w.ranks[r], group.Member(r)));
    w.host.push_back(twin.Member(r));
  }
  return w;
}

TEST(StreamCommunicatorTest, EveryCollectiveOnDeviceMemoryMatchesTheHostRunBitForBit) {
  constexpr int kRanks = 3;
  World w = MakeWorld(kRanks, "g[0,1,2]");
  RunRanks(w.ranks, [&](int r) {
    EmulatedRank& me = *w.ranks[r];
    StreamCommunicator& comm = *w.comms[r];
    Communicator& host = *w.host[r];
    const int n = kRanks;

    // all_reduce, in place. The input is uploaded on the compute stream and not waited for.
    const int64_t count = 1001;
    const std::vector<float> ar_in = Values(r, count);
    float* d_ar = me.Alloc<float>(count);
    me.Put(d_ar, ar_in);
    ASSERT_TRUE(comm.AllReduce(d_ar, count).ok());
    std::vector<float> ar_want = ar_in;
    ASSERT_TRUE(host.AllReduce(ar_want.data(), count).ok());
    EXPECT_EQ(me.Get(d_ar, count), ar_want);

    // reduce_scatter
    const int64_t per = 37;
    const std::vector<float> rs_in = Values(r, per * n, 5);
    float* d_rs_in = me.Alloc<float>(per * n);
    float* d_rs_out = me.Alloc<float>(per);
    me.Put(d_rs_in, rs_in);
    ASSERT_TRUE(comm.ReduceScatter(d_rs_in, d_rs_out, per).ok());
    std::vector<float> rs_want(per);
    ASSERT_TRUE(host.ReduceScatter(rs_in.data(), rs_want.data(), per).ok());
    EXPECT_EQ(me.Get(d_rs_out, per), rs_want);

    // reduce_scatter_v with uneven counts, one zero
    const std::vector<int64_t> counts = {5, 0, 11};
    const std::vector<float> rsv_in = Values(r, 16, 9);
    float* d_rsv_in = me.Alloc<float>(16);
    float* d_rsv_out = me.Alloc<float>(11);
    me.Put(d_rsv_in, rsv_in);
    ASSERT_TRUE(comm.ReduceScatterV(d_rsv_in, d_rsv_out, counts).ok());
    std::vector<float> rsv_want(counts[r]);
    ASSERT_TRUE(host.ReduceScatterV(rsv_in.data(), rsv_want.data(), counts).ok());
    EXPECT_EQ(me.Get(d_rsv_out, counts[r]), rsv_want);

    // all_gather and all_gather_v
    std::vector<int32_t> ag_in(20);
    for (int j = 0; j < 20; ++j) ag_in[j] = Word(r, r, j);
    int32_t* d_ag_in = me.Alloc<int32_t>(20);
    int32_t* d_ag_out = me.Alloc<int32_t>(20 * n);
    me.Put(d_ag_in, ag_in);
    ASSERT_TRUE(comm.AllGather(d_ag_in, d_ag_out, 80).ok());
    std::vector<int32_t> ag_want(20 * n);
    ASSERT_TRUE(host.AllGather(ag_in.data(), ag_want.data(), 80).ok());
    EXPECT_EQ(me.Get(d_ag_out, 20 * n), ag_want);
    const std::vector<int64_t> gather_bytes = {8, 0, 12};
    int32_t* d_agv_out = me.Alloc<int32_t>(5);
    ASSERT_TRUE(comm.AllGatherV(d_ag_in, gather_bytes[r], d_agv_out, gather_bytes).ok());
    std::vector<int32_t> agv_want(5);
    ASSERT_TRUE(host.AllGatherV(ag_in.data(), gather_bytes[r], agv_want.data(), gather_bytes).ok());
    EXPECT_EQ(me.Get(d_agv_out, 5), agv_want);

    // all_to_all_v with uneven sizes, some zero
    std::vector<int64_t> send(n), recv(n);
    std::vector<int32_t> a2a_in;
    for (int p = 0; p < n; ++p) {
      const int64_t out_words = (r + 2 * p) % 3 * 7 + (r == p);
      const int64_t in_words = (p + 2 * r) % 3 * 7 + (r == p);
      send[p] = out_words * 4;
      recv[p] = in_words * 4;
      for (int64_t j = 0; j < out_words; ++j) a2a_in.push_back(Word(r, p, j));
    }
    const int64_t recv_words = std::accumulate(recv.begin(), recv.end(), int64_t{0}) / 4;
    int32_t* d_a2a_in = me.Alloc<int32_t>(a2a_in.size());
    int32_t* d_a2a_out = me.Alloc<int32_t>(recv_words);
    me.Put(d_a2a_in, a2a_in);
    ASSERT_TRUE(comm.AllToAllV(d_a2a_in, send, d_a2a_out, recv).ok());
    std::vector<int32_t> a2a_want(recv_words);
    ASSERT_TRUE(host.AllToAllV(a2a_in.data(), send, a2a_want.data(), recv).ok());
    EXPECT_EQ(me.Get(d_a2a_out, recv_words), a2a_want);

    // broadcast from the last rank
    std::vector<int32_t> bc(33);
    for (int j = 0; j < 33; ++j) bc[j] = r == n - 1 ? Word(r, 0, j) : -1;
    int32_t* d_bc = me.Alloc<int32_t>(33);
    me.Put(d_bc, bc);
    ASSERT_TRUE(comm.Broadcast(d_bc, 33 * 4, n - 1).ok());
    std::vector<int32_t> bc_want = bc;
    ASSERT_TRUE(host.Broadcast(bc_want.data(), 33 * 4, n - 1).ok());
    EXPECT_EQ(me.Get(d_bc, 33), bc_want);

    // a ring of sends before the receives, then the barrier
    const int next = (r + 1) % n, prev = (r + n - 1) % n;
    std::vector<int32_t> ring(50);
    for (int j = 0; j < 50; ++j) ring[j] = Word(r, next, j);
    int32_t* d_ring_out = me.Alloc<int32_t>(50);
    int32_t* d_ring_in = me.Alloc<int32_t>(50);
    me.Put(d_ring_out, ring);
    ASSERT_TRUE(comm.Send(d_ring_out, 200, next, 3).ok());
    ASSERT_TRUE(comm.PostSends().ok());  // on their way already here; through to the transport
    ASSERT_TRUE(comm.Recv(d_ring_in, 200, prev, 3).ok());
    ASSERT_TRUE(comm.WaitSends().ok());
    ASSERT_TRUE(host.Send(ring.data(), 200, next, 3).ok());
    std::vector<int32_t> ring_want(50);
    ASSERT_TRUE(host.Recv(ring_want.data(), 200, prev, 3).ok());
    ASSERT_TRUE(host.WaitSends().ok());
    EXPECT_EQ(me.Get(d_ring_in, 50), ring_want);
    ASSERT_TRUE(comm.Barrier().ok());
    ASSERT_TRUE(host.Barrier().ok());

    // The byte counts are the host run's, op by op; the watchdog sees every call complete and
    // counts its stream time.
    ASSERT_TRUE(Eventually([&] { return me.watchdog->outstanding() == 0; }));
    for (int op = 0; op < kNumCollectiveOps; ++op) {
      const auto o = static_cast<CollectiveOp>(op);
      SCOPED_TRACE(CollectiveOpName(o));
      EXPECT_EQ(comm.counters().bytes(o), host.counters().bytes(o));
      EXPECT_EQ(comm.counters().calls(o), host.counters().calls(o));
      EXPECT_EQ(comm.stream_counters().calls(o), comm.counters().calls(o));
      EXPECT_EQ(comm.stream_counters().bytes(o), comm.counters().bytes(o));
      EXPECT_GE(comm.stream_counters().seconds(o), 0.0);
    }
    EXPECT_TRUE(comm.AsyncError().ok()) << comm.AsyncError();
    for (void* p :
         std::vector<void*>{d_ar, d_rs_in, d_rs_out, d_rsv_in, d_rsv_out, d_ag_in, d_ag_out,
                            d_agv_out, d_a2a_in, d_a2a_out, d_bc, d_ring_out, d_ring_in}) {
      me.dev->Free(p);
    }
  });
}

// The MoE dispatcher's counts and the trainer's scalars live on the host: the call stages them
// through the device and returns with the result, also when the other argument is device memory.
TEST(StreamCommunicatorTest, HostArgumentsAreStagedAndTheCallReturnsWithTheResult) {
  constexpr int kRanks = 2;
  World w = MakeWorld(kRanks, "g[0,1]");
  RunRanks(w.ranks, [&](int r) {
    EmulatedRank& me = *w.ranks[r];
    StreamCommunicator& comm = *w.comms[r];
    Communicator& host = *w.host[r];
    // A scalar all-reduce on the host.
    std::vector<float> loss = {Value(r, 3), Value(r, 4)};
    std::vector<float> loss_want = loss;
    ASSERT_TRUE(comm.AllReduce(loss.data(), 2).ok());
    ASSERT_TRUE(host.AllReduce(loss_want.data(), 2).ok());
    EXPECT_EQ(loss, loss_want);
    // Counts exchanged on the host.
    std::vector<int64_t> counts = {10 * r + 1, 10 * r + 2}, got(2), want(2);
    const std::vector<int64_t> eight(2, 8);
    ASSERT_TRUE(comm.AllToAllV(counts.data(), eight, got.data(), eight).ok());
    ASSERT_TRUE(host.AllToAllV(counts.data(), eight, want.data(), eight).ok());
    EXPECT_EQ(got, want);
    // A mix: host input, device output; then device input, host output.
    std::vector<int32_t> mine = {Word(r, 0, 1), Word(r, 0, 2)};
    int32_t* d_gathered = me.Alloc<int32_t>(4);
    ASSERT_TRUE(comm.AllGather(mine.data(), d_gathered, 8).ok());
    std::vector<int32_t> gathered_want(4);
    ASSERT_TRUE(host.AllGather(mine.data(), gathered_want.data(), 8).ok());
    EXPECT_EQ(me.Get(d_gathered, 4), gathered_want);
    std::vector<int32_t> back(8);
    ASSERT_TRUE(comm.AllGather(d_gathered, back.data(), 16).ok());
    std::vector<int32_t> back_want(8);
    ASSERT_TRUE(host.AllGather(gathered_want.data(), back_want.data(), 16).ok());
    EXPECT_EQ(back, back_want);
    // A broadcast of a host value.
    int64_t step = r == 0 ? 1234 : -1;
    ASSERT_TRUE(comm.Broadcast(&step, sizeof(step), 0).ok());
    EXPECT_EQ(step, 1234);
    EXPECT_EQ(comm.counters().bytes(CollectiveOp::kAllToAll), 16);
    EXPECT_EQ(comm.counters().bytes(CollectiveOp::kAllGather), 8 + 16);
    me.dev->Free(d_gathered);
  });
}

// ---- The events are necessary: each test shows the right result with them and a wrong one
// without (the stream that must be waited for is held, so the race is certain). ----

struct Single {
  std::unique_ptr<EmulatedRank> rank = MakeRank();
  std::unique_ptr<StreamCommunicator> comm =
      Connect(*rank, LocalGroup(1, {.name = "solo[0]"}).Member(0));
};

constexpr int64_t kWords = 64;

std::vector<int32_t> Pattern(int32_t base) {
  std::vector<int32_t> v(kWords);
  for (int64_t j = 0; j < kWords; ++j) v[j] = base + static_cast<int32_t>(j);
  return v;
}

// The collective reads its input after the producer: the upload of the new input is still queued
// on the held compute stream when the all-gather is called.
void ProducerCase(bool wait_for_producer, std::vector<int32_t>* result) {
  Single s;
  EmulatedRank& me = *s.rank;
  const device::StreamScope scope(*me.compute);
  const std::vector<int32_t> stale = Pattern(100), fresh = Pattern(5000);
  int32_t* d_in = me.Upload(stale);
  int32_t* d_out = me.Upload(Pattern(-7));
  ASSERT_TRUE(me.dev->PauseStream(*me.compute).ok());
  me.Put(d_in, fresh);  // the producer, held
  {
    std::unique_ptr<StreamCommunicator::ScopedOrdering> no_wait;
    if (!wait_for_producer) {
      no_wait = std::make_unique<StreamCommunicator::ScopedOrdering>(*s.comm, nullptr, true);
    }
    ASSERT_TRUE(s.comm->AllGather(d_in, d_out, kWords * 4).ok());
  }
  if (wait_for_producer) {
    // Outstanding while the producer is held, and named in flight.
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    EXPECT_EQ(me.watchdog->outstanding(), 1u);
    const auto call = ProcessInFlight().Oldest();
    ASSERT_TRUE(call.has_value());
    EXPECT_EQ(call->op, "all_gather");
    EXPECT_EQ(call->group, "solo[0]");
  } else {
    ASSERT_TRUE(me.dev->SynchronizeStream(s.comm->stream()).ok());  // it ran on the stale input
  }
  ASSERT_TRUE(me.dev->ResumeStream(*me.compute).ok());
  *result = me.Get(d_out, kWords);
  EXPECT_TRUE(Eventually([&] { return me.watchdog->outstanding() == 0; }));
  me.dev->Free(d_in);
  me.dev->Free(d_out);
}

TEST(StreamCommunicatorOrderingTest, TheCollectiveWaitsForTheProducerOfItsInput) {
  std::vector<int32_t> with, without;
  ProducerCase(true, &with);
  EXPECT_EQ(with, Pattern(5000));
  ProducerCase(false, &without);
  EXPECT_EQ(without, Pattern(100)) << "without the producer event the stale input is gathered";
}

// The consumer reads the output after the collective: the communication stream is held while a
// copy of the output is enqueued on the compute stream.
void ConsumerCase(bool join, std::vector<int32_t>* result) {
  Single s;
  EmulatedRank& me = *s.rank;
  const device::StreamScope scope(*me.compute);
  int32_t* d_in = me.Upload(Pattern(300));
  int32_t* d_out = me.Upload(Pattern(-1));
  int32_t* d_check = me.Upload(Pattern(-2));
  ASSERT_TRUE(me.dev->PauseStream(s.comm->stream()).ok());
  {
    std::unique_ptr<StreamCommunicator::ScopedOrdering> no_join;
    if (!join) {
      no_join =
          std::make_unique<StreamCommunicator::ScopedOrdering>(*s.comm, me.compute.get(), false);
    }
    ASSERT_TRUE(s.comm->AllGather(d_in, d_out, kWords * 4).ok());
  }
  ASSERT_TRUE(
      me.dev->Copy(d_check, d_out, kWords * 4, CopyKind::kDeviceToDevice, *me.compute).ok());
  if (!join) {
    ASSERT_TRUE(me.dev->SynchronizeStream(*me.compute).ok());  // it copied the old output
  }
  ASSERT_TRUE(me.dev->ResumeStream(s.comm->stream()).ok());
  *result = me.Get(d_check, kWords);
  EXPECT_TRUE(Eventually([&] { return me.watchdog->outstanding() == 0; }));
  for (int32_t* p : {d_in, d_out, d_check}) me.dev->Free(p);
}

TEST(StreamCommunicatorOrderingTest, TheConsumerWaitsForTheCollective) {
  std::vector<int32_t> with, without;
  ConsumerCase(true, &with);
  EXPECT_EQ(with, Pattern(300));
  ConsumerCase(false, &without);
  EXPECT_EQ(without, Pattern(-1)) << "without the join the consumer reads the old output";
}

// A transport that enqueues the all-gather on its stream and then fails (as an NCCL group call can
// fail midway): the call fails, and the compute stream still waits for what was enqueued, or it
// would free and reuse the buffers the collective still reads and writes. (What then runs on the
// aborted transport's stream is nothing, as with an aborted NCCL communicator.)
class FailsAfterEnqueue final : public testing::ForwardingCommunicator {
 public:
  using ForwardingCommunicator::ForwardingCommunicator;
  absl::Status AllGather(const void* in, void* out, int64_t bytes_per_rank) override {
    RETURN_IF_ERROR(ForwardingCommunicator::AllGather(in, out, bytes_per_rank));
    return absl::InternalError("failed after enqueueing");
  }
};

TEST(StreamCommunicatorOrderingTest, AFailureAfterTheEnqueueStillJoinsTheCaller) {
  auto me = MakeRank();
  auto stream = me->dev->CreateStream();
  ASSERT_TRUE(stream.ok());
  auto transport = CreateEmulatedTransport(LocalGroup(1, {.name = "solo[0]"}).Member(0), *me->dev,
                                           **stream, {.timeout_s = 30});
  ASSERT_TRUE(transport.ok()) << transport.status();
  auto comm = StreamCommunicator::Create(std::make_unique<FailsAfterEnqueue>(std::move(*transport)),
                                         std::move(*stream), *me->dev, me->watchdog);
  ASSERT_TRUE(comm.ok()) << comm.status();
  const device::StreamScope scope(*me->compute);
  int32_t* d_in = me->Upload(Pattern(300));
  int32_t* d_out = me->Upload(Pattern(-1));
  ASSERT_TRUE(me->dev->SynchronizeStream(*me->compute).ok());
  ASSERT_TRUE(me->dev->PauseStream((*comm)->stream()).ok());
  const absl::Status failed = (*comm)->AllGather(d_in, d_out, kWords * 4);
  EXPECT_THAT(failed.message(), ::testing::HasSubstr("failed after enqueueing"));
  // The consumer, on the compute stream: it must not run while the collective's stream is held.
  std::vector<int32_t> seen(kWords, 12345);
  ASSERT_TRUE(
      me->dev->Copy(seen.data(), d_out, kWords * 4, CopyKind::kDeviceToHost, *me->compute).ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // time to run ahead, were it free
  EXPECT_EQ(seen, std::vector<int32_t>(kWords, 12345))
      << "the consumer ran ahead of the collective";
  ASSERT_TRUE(me->dev->ResumeStream((*comm)->stream()).ok());
  ASSERT_TRUE(me->dev->SynchronizeStream(*me->compute).ok());
  EXPECT_NE(seen, std::vector<int32_t>(kWords, 12345));
  for (int32_t* p : {d_in, d_out}) me->dev->Free(p);
}

// The host calls the emulated transport makes, in the stream's order.
class RecordsHostCalls final : public testing::ForwardingCommunicator {
 public:
  RecordsHostCalls(std::unique_ptr<Communicator> inner, std::vector<std::string>* log,
                   std::mutex* mu)
      : ForwardingCommunicator(std::move(inner)), log_(log), mu_(mu) {}
  absl::Status Send(const void* data, int64_t bytes, int peer, uint32_t tag) override {
    Note("send");
    return ForwardingCommunicator::Send(data, bytes, peer, tag);
  }
  absl::Status Recv(void* data, int64_t bytes, int peer, uint32_t tag) override {
    Note("recv");
    return ForwardingCommunicator::Recv(data, bytes, peer, tag);
  }
  absl::Status AllReduce(float* data, int64_t count) override {
    Note("all_reduce");
    return ForwardingCommunicator::AllReduce(data, count);
  }
  absl::Status PostSends() override {
    Note("post_sends");
    return ForwardingCommunicator::PostSends();
  }
  absl::Status WaitSends() override {
    Note("wait_sends");
    return ForwardingCommunicator::WaitSends();
  }

 private:
  void Note(const char* call) {
    std::lock_guard<std::mutex> lock(*mu_);
    log_->push_back(call);
  }
  std::vector<std::string>* log_;
  std::mutex* mu_;
};

// Sends complete in stream order, as NCCL's (posted with the next Recv, or alone before any other
// operation): the transport waits for the host's sends right after the next Recv, or before the
// next other operation, so the host transport (Gloo keeps each payload until it is waited for)
// holds none beyond that point. Before, a fused exchange on streams, which never calls WaitSends,
// left every send's copy with Gloo for the rest of the run.
TEST(StreamCommunicatorOrderingTest, TheTransportWaitsForItsSendsWhereNcclsWouldComplete) {
  auto me = MakeRank();
  auto stream = me->dev->CreateStream();
  ASSERT_TRUE(stream.ok());
  std::vector<std::string> log;
  std::mutex mu;
  auto transport = CreateEmulatedTransport(
      std::make_unique<RecordsHostCalls>(LocalGroup(1, {.name = "solo[0]"}).Member(0), &log, &mu),
      *me->dev, **stream, {.timeout_s = 30});
  ASSERT_TRUE(transport.ok()) << transport.status();
  Communicator& t = **transport;
  int32_t* a = me->Upload(Pattern(1));
  int32_t* b = me->Upload(Pattern(2));
  float* f = me->Alloc<float>(kWords);
  ASSERT_TRUE(t.Send(a, kWords * 4, 0, 2).ok());
  ASSERT_TRUE(t.Recv(b, kWords * 4, 0, 2).ok());
  ASSERT_TRUE(t.Send(a, kWords * 4, 0, 3).ok());
  ASSERT_TRUE(t.AllReduce(f, kWords).ok());
  ASSERT_TRUE(t.Recv(b, kWords * 4, 0, 3).ok());  // no send since the all-reduce: nothing to wait
  ASSERT_TRUE(t.Send(a, kWords * 4, 0, 4).ok());
  ASSERT_TRUE(t.PostSends().ok());
  ASSERT_TRUE(t.Recv(b, kWords * 4, 0, 4).ok());
  ASSERT_TRUE(t.WaitSends().ok());
  std::lock_guard<std::mutex> lock(mu);
  EXPECT_EQ(log, (std::vector<std::string>{"send", "recv", "wait_sends", "send", "wait_sends",
                                           "all_reduce", "recv", "send", "wait_sends", "post_sends",
                                           "recv", "wait_sends"}));
  EXPECT_EQ(me->Get(b, kWords), Pattern(1));
  for (void* p : {static_cast<void*>(a), static_cast<void*>(b), static_cast<void*>(f)}) {
    me->dev->Free(p);
  }
}

// PostSends (where NCCL enqueues the sends it held) is followed by the watchdog between two marks:
// while the communication stream has not run it, it is outstanding and named in flight, so a send
// a peer never receives is reported as itself. It adds nothing to the stream counters (the sends
// were counted when made).
TEST(StreamCommunicatorOrderingTest, PostSendsIsFollowedUntilTheStreamRunsIt) {
  Single s;
  EmulatedRank& me = *s.rank;
  const device::StreamScope scope(*me.compute);
  ASSERT_TRUE(me.dev->PauseStream(s.comm->stream()).ok());
  ASSERT_TRUE(s.comm->PostSends().ok());
  EXPECT_EQ(me.watchdog->outstanding(), 1u);
  const auto call = ProcessInFlight().Oldest();
  ASSERT_TRUE(call.has_value());
  EXPECT_EQ(call->op, "post_sends");
  EXPECT_EQ(call->group, "solo[0]");
  ASSERT_TRUE(me.dev->ResumeStream(s.comm->stream()).ok());
  EXPECT_TRUE(Eventually([&] { return me.watchdog->outstanding() == 0; }));
  EXPECT_EQ(s.comm->stream_counters().calls(CollectiveOp::kSend), 0);
}

// A call with host arguments that fails while its staging copies are still queued on the
// communication stream (here: aborted while that stream is held) leaves them there; destroying
// the communicator then must not free the pinned staging they read and write (the emulated device
// reports a FreeHost with copies pending as its sticky error). The held stream runs them when it
// is destroyed.
TEST(StreamCommunicatorOrderingTest, DestructionKeepsTheStagingAFailedCallsCopiesStillUse) {
  Single s;
  EmulatedRank& me = *s.rank;
  const device::StreamScope scope(*me.compute);
  ASSERT_TRUE(me.dev->PauseStream(s.comm->stream()).ok());
  std::vector<float> loss = {1.0f, 2.0f};
  absl::Status call;
  std::thread caller([&] {
    const device::StreamScope caller_scope(*me.compute);
    call = s.comm->AllReduce(loss.data(), 2);
  });
  // Enqueued (the watchdog follows it from then on), and waiting for its result.
  ASSERT_TRUE(Eventually([&] { return me.watchdog->outstanding() == 1; }));
  s.comm->Abort("test");
  caller.join();
  EXPECT_EQ(call.code(), absl::StatusCode::kCancelled) << call;
  s.comm.reset();
  EXPECT_TRUE(me.dev->SynchronizeStream(*me.compute).ok());
  EXPECT_TRUE(me.dev->sticky_error().ok()) << me.dev->sticky_error();
}

// Compute and communication overlap: with the communication stream held, the compute stream
// still runs work that does not depend on the collective.
TEST(StreamCommunicatorOrderingTest, ComputeNotWaitingForTheCollectiveOverlapsIt) {
  Single s;
  EmulatedRank& me = *s.rank;
  const device::StreamScope scope(*me.compute);
  int32_t* d_in = me.Upload(Pattern(1));
  int32_t* d_out = me.Alloc<int32_t>(kWords);
  int32_t* d_other = me.Alloc<int32_t>(kWords);
  const std::vector<int32_t> other = Pattern(77);
  me.Put(d_other, other);
  ASSERT_TRUE(me.dev->SynchronizeStream(*me.compute).ok());
  ASSERT_TRUE(me.dev->PauseStream(s.comm->stream()).ok());
  ASSERT_TRUE(s.comm->AllGather(d_in, d_out, kWords * 4).ok());  // returns at once
  // Work enqueued before the call is not held back: a second stream reads d_other meanwhile.
  auto side = me.dev->CreateStream();
  ASSERT_TRUE(side.ok());
  std::vector<int32_t> seen(kWords);
  ASSERT_TRUE(me.dev->Copy(seen.data(), d_other, kWords * 4, CopyKind::kDeviceToHost, **side).ok());
  ASSERT_TRUE(me.dev->SynchronizeStream(**side).ok());
  EXPECT_EQ(seen, other);
  EXPECT_EQ(me.watchdog->outstanding(), 1u);
  ASSERT_TRUE(me.dev->ResumeStream(s.comm->stream()).ok());
  EXPECT_EQ(me.Get(d_out, kWords), Pattern(1));
  for (int32_t* p : {d_in, d_out, d_other}) me.dev->Free(p);
}

TEST(StreamCommunicatorTest, HostMemoryGivenToTheTransportDirectlyIsRefused) {
  auto rank = MakeRank();
  auto stream = rank->dev->CreateStream();
  ASSERT_TRUE(stream.ok());
  auto transport =
      CreateEmulatedTransport(LocalGroup(1, {.name = "t[0]"}).Member(0), *rank->dev, **stream);
  ASSERT_TRUE(transport.ok());
  std::vector<float> host(4, 1.0f);
  const absl::Status status = (*transport)->AllReduce(host.data(), 4);
  EXPECT_TRUE(absl::IsInvalidArgument(status)) << status;
  EXPECT_THAT(status.message(), ::testing::HasSubstr("is not memory of device"));
  EXPECT_EQ((*transport)->AsyncError(), status) << "sticky";
}

TEST(StreamCommunicatorTest, CreateRefusesMissingParts) {
  auto rank = MakeRank();
  auto stream = rank->dev->CreateStream();
  ASSERT_TRUE(stream.ok());
  EXPECT_TRUE(absl::IsInvalidArgument(
      StreamCommunicator::Create(nullptr, std::move(*stream), *rank->dev, rank->watchdog)
          .status()));
  EXPECT_TRUE(absl::IsInvalidArgument(
      StreamCommunicator::Create(LocalGroup(1).Member(0), nullptr, *rank->dev, rank->watchdog)
          .status()));
}

// The worker's NCCL factory refuses a device that is not CUDA, whatever the build.
TEST(StreamCommunicatorTest, TheNcclGroupFactoryRefusesADeviceThatIsNotCuda) {
  auto rank = MakeRank();
  InMemoryKvStore store;
  auto made =
      CreateNcclStreamCommunicator(store, "tp/0", "tp[0]", 0, 1, *rank->dev, rank->watchdog, {});
  EXPECT_TRUE(absl::IsInvalidArgument(made.status())) << made.status();
  EXPECT_THAT(made.status().message(), ::testing::HasSubstr("is not a CUDA device"));
}

}  // namespace
}  // namespace furnace::comm
