// CommWatchdog on the emulated discrete device, through StreamCommunicators over the emulated
// transport: a collective that cannot complete (a peer that never joins, or a producer stream
// held by PauseStream) fails the rank's communicators with DeadlineExceeded naming the op, the
// group and how long, once the timeout is up (on a FakeClock where the test says when the time is
// up; on the real clock not before it, and ctest's timeout catches a hang), and every later call
// fails with that error; while it is outstanding it is named in ProcessInFlight. A transport's
// asynchronous error (a peer's failure) stops the rank's other communicators too.
#include "runtime/comm/comm_watchdog.h"

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "emulated_ranks.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/comm/emulated_transport.h"
#include "runtime/comm/in_flight.h"
#include "runtime/comm/local_communicator.h"
#include "runtime/comm/stream_communicator.h"
#include "tests/testing/forwarding_communicator.h"

namespace furnace::comm {
namespace {

using emulated_ranks::Connect;
using emulated_ranks::EmulatedRank;
using emulated_ranks::Eventually;
using emulated_ranks::MakeRank;
using ::testing::HasSubstr;
using SteadyClock = std::chrono::steady_clock;

double SecondsSince(SteadyClock::time_point start) {
  return std::chrono::duration<double>(SteadyClock::now() - start).count();
}

TEST(CommWatchdogTest, CreateRefusesNonPositiveIntervals) {
  EXPECT_TRUE(absl::IsInvalidArgument(CommWatchdog::Create({.timeout_s = 0}).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(CommWatchdog::Create({.poll_interval_s = -1}).status()));
  EXPECT_TRUE(
      absl::IsInvalidArgument(CommWatchdog::Create({.async_error_interval_s = 0}).status()));
}

// The producer stream is held: the all-reduce waits for it on its stream. Not a failure before the
// timeout (FakeClock: nothing happens until the test moves the time), DeadlineExceeded for every
// communicator of the rank once it is past.
TEST(CommWatchdogTest, AHeldProducerTimesOutTheCollectiveAndStopsEveryCommunicator) {
  FakeClock clock;
  auto me = MakeRank({.timeout_s = 5, .clock = &clock});
  auto dp = Connect(*me, LocalGroup(1, {.name = "dp[0]"}).Member(0));
  auto tp = Connect(*me, LocalGroup(1, {.name = "tp[0]"}).Member(0));
  const device::StreamScope scope(*me->compute);
  float* d = me->Upload(std::vector<float>(16, 1.0f));
  ASSERT_TRUE(me->dev->PauseStream(*me->compute).ok());
  ASSERT_TRUE(dp->AllReduce(d, 16).ok());  // enqueued behind the held producer

  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  clock.Advance(4.9);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_TRUE(me->watchdog->error().ok()) << "not before the timeout";
  EXPECT_EQ(me->watchdog->outstanding(), 1u);
  const auto call = ProcessInFlight().Oldest();
  ASSERT_TRUE(call.has_value());
  EXPECT_EQ(call->op, "all_reduce");
  EXPECT_EQ(call->group, "dp[0]");
  // Its stream has not reached it: queued behind this rank's own (held) device work, not waiting
  // on its peers, which is what tells a rank whose kernel hangs from the peers waiting for it.
  EXPECT_FALSE(call->started);

  clock.Advance(0.2);
  ASSERT_TRUE(Eventually([&] { return !dp->AsyncError().ok(); }));
  const absl::Status error = dp->AsyncError();
  EXPECT_TRUE(absl::IsDeadlineExceeded(error)) << error;
  EXPECT_THAT(error.message(),
              HasSubstr("all_reduce on dp[0] (1 rank) not started (queued behind this rank's own "
                        "device work, which has not finished) on its stream"));
  EXPECT_THAT(error.message(), HasSubstr("after 5.1 s (collective timeout 5 s)"));
  EXPECT_EQ(me->watchdog->error(), error);
  EXPECT_EQ(tp->AsyncError(), error) << "every communicator of the rank is stopped";
  EXPECT_EQ(me->watchdog->outstanding(), 0u);
  EXPECT_FALSE(ProcessInFlight().Oldest().has_value()) << "no longer holds the rank";
  // Later calls fail fast with the same error, on both groups.
  EXPECT_EQ(dp->AllReduce(d, 16), error);
  EXPECT_EQ(tp->Barrier(), error);
  std::vector<float> host(2);
  EXPECT_EQ(tp->AllReduce(host.data(), 2), error);
  // The held work is released: the aborted transport skips the queued all-reduce.
  ASSERT_TRUE(me->dev->ResumeStream(*me->compute).ok());
  ASSERT_TRUE(me->dev->SynchronizeStream(dp->stream()).ok());
  me->dev->Free(d);
}

// Rank 1 of the group never calls: rank 0's all-reduce on device memory returns at once and fails
// by the watchdog's timeout; a call with host arguments fails by it itself.
TEST(CommWatchdogTest, APeerThatNeverJoinsFailsTheCollectiveWithinTheTimeout) {
  for (const bool host_args : {false, true}) {
    SCOPED_TRACE(host_args ? "host arguments" : "device memory");
    auto me = MakeRank({.timeout_s = 0.3});
    LocalGroup group(2, {.name = "ep[0,1]", .timeout_s = 600});  // only the watchdog times out
    auto ep = Connect(*me, group.Member(0));
    auto peer = group.Member(1);  // never calls
    const device::StreamScope scope(*me->compute);
    std::vector<float> host(8, 2.0f);
    float* d = me->Upload(host);
    const SteadyClock::time_point start = SteadyClock::now();
    absl::Status status;
    if (host_args) {
      status = ep->AllReduce(host.data(), 8);  // waits for its result
    } else {
      ASSERT_TRUE(ep->AllReduce(d, 8).ok());
      ASSERT_TRUE(Eventually([&] { return !ep->AsyncError().ok(); }));
      status = ep->AsyncError();
    }
    const double took = SecondsSince(start);
    EXPECT_TRUE(absl::IsDeadlineExceeded(status)) << status;
    // Its stream reached it (started): it waits on its peer, not behind this rank's own work.
    EXPECT_THAT(status.message(), HasSubstr("all_reduce on ep[0,1] (2 ranks) not complete"));
    EXPECT_THAT(status.message(), HasSubstr("collective timeout 0.3 s"));
    EXPECT_GE(took, 0.3);
    // Fails with the sticky error from now on, without enqueueing (the call with host arguments
    // would wait for its result on the peer that never comes: a hang, which ctest's timeout
    // catches); the transport was aborted, which released the stream's thread blocked in the host
    // group.
    EXPECT_EQ(ep->AllReduce(d, 8), status);
    EXPECT_EQ(ep->AllReduce(host.data(), 8), status);
    EXPECT_TRUE(absl::IsCancelled(ep->transport().AsyncError())) << ep->transport().AsyncError();
    ASSERT_TRUE(me->dev->SynchronizeStream(ep->stream()).ok());
    me->dev->Free(d);
  }
}

// A peer's failure reaches this rank as its transport's asynchronous error (the host group failed
// group-wide); the watchdog stops the rank's other communicators with it, although nothing of
// theirs is outstanding.
TEST(CommWatchdogTest, ATransportsAsynchronousErrorStopsTheOtherCommunicators) {
  auto me = MakeRank({.timeout_s = 600, .async_error_interval_s = 0.01});
  LocalGroup group(2, {.name = "pp[0,1]"});
  auto pp = Connect(*me, group.Member(0));
  auto dp = Connect(*me, LocalGroup(1, {.name = "dp[0]"}).Member(0));
  auto peer = group.Member(1);
  peer->Abort("peer crashed");
  ASSERT_TRUE(Eventually([&] { return !dp->AsyncError().ok(); }));
  const absl::Status error = dp->AsyncError();
  EXPECT_TRUE(absl::IsCancelled(error)) << error;
  EXPECT_THAT(error.message(), HasSubstr("group pp[0,1] failed"));
  EXPECT_THAT(error.message(), HasSubstr("peer crashed"));
  EXPECT_EQ(dp->Barrier(), error);
  EXPECT_EQ(me->watchdog->error(), error);
}

TEST(CommWatchdogTest, AbortAllStopsTheRankAndACommunicatorMadeLater) {
  auto me = MakeRank();
  auto a = Connect(*me, LocalGroup(1, {.name = "a[0]"}).Member(0));
  me->watchdog->AbortAll(absl::UnavailableError("the step failed"));
  me->watchdog->AbortAll(absl::InternalError("second"));  // the first stays
  EXPECT_EQ(a->AsyncError(), absl::UnavailableError("the step failed"));
  auto b = Connect(*me, LocalGroup(1, {.name = "b[0]"}).Member(0));
  EXPECT_EQ(b->Barrier(), absl::UnavailableError("the step failed"));
}

// A transport whose Abort does not return until its partner's Abort has begun (at most 10 s, then
// it notes that it waited that out): as an NCCL abort, which frees device memory, waits for a
// kernel of another communicator stuck on a dead peer until that one is aborted too.
class AbortNeedsPartner final : public testing::ForwardingCommunicator {
 public:
  struct Latch {
    absl::Mutex mu;
    int begun = 0;
    bool waited_out = false;
  };
  AbortNeedsPartner(std::unique_ptr<Communicator> inner, std::shared_ptr<Latch> latch)
      : ForwardingCommunicator(std::move(inner)), latch_(std::move(latch)) {}

  void Abort(const std::string& reason) override {
    {
      absl::MutexLock lock(&latch_->mu);
      ++latch_->begun;
      const auto both = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(latch_->mu) {
        return latch_->begun >= 2;
      };
      if (!latch_->mu.AwaitWithTimeout(absl::Condition(&both), absl::Seconds(10))) {
        latch_->waited_out = true;
      }
    }
    ForwardingCommunicator::Abort(reason);
  }

 private:
  std::shared_ptr<Latch> latch_;
};

// The watchdog aborts a rank's transports all at once: in turn, the first abort would wait for
// the second forever (here: until the latch gives up).
TEST(CommWatchdogTest, TransportsAreAbortedTogetherNotInTurn) {
  auto me = MakeRank();
  auto latch = std::make_shared<AbortNeedsPartner::Latch>();
  std::vector<std::unique_ptr<StreamCommunicator>> comms;
  for (const char* name : {"dp[0]", "tp[0]"}) {
    auto stream = me->dev->CreateStream();
    ASSERT_TRUE(stream.ok());
    auto transport = CreateEmulatedTransport(LocalGroup(1, {.name = name}).Member(0), *me->dev,
                                             **stream, {.timeout_s = 30});
    ASSERT_TRUE(transport.ok()) << transport.status();
    auto comm = StreamCommunicator::Create(
        std::make_unique<AbortNeedsPartner>(std::move(*transport), latch), std::move(*stream),
        *me->dev, me->watchdog);
    ASSERT_TRUE(comm.ok()) << comm.status();
    comms.push_back(std::move(*comm));
  }
  me->watchdog->AbortAll(absl::UnavailableError("a peer is gone"));
  absl::MutexLock lock(&latch->mu);
  EXPECT_EQ(latch->begun, 2);
  EXPECT_FALSE(latch->waited_out) << "one abort waited for the other";
  for (const auto& comm : comms)
    EXPECT_EQ(comm->AsyncError(), absl::UnavailableError("a peer is gone"));
}

// Healthy collectives complete, leave nothing outstanding, and get their stream time.
TEST(CommWatchdogTest, CompletedCollectivesAreForgottenWithTheirStreamTime) {
  auto me = MakeRank();
  auto g = Connect(*me, LocalGroup(1, {.name = "g[0]"}).Member(0));
  const device::StreamScope scope(*me->compute);
  float* d = me->Upload(std::vector<float>(1024, 3.0f));
  for (int i = 0; i < 20; ++i) ASSERT_TRUE(g->AllReduce(d, 1024).ok());
  ASSERT_TRUE(Eventually([&] { return me->watchdog->outstanding() == 0; }));
  EXPECT_EQ(g->stream_counters().calls(CollectiveOp::kAllReduce), 20);
  EXPECT_EQ(g->stream_counters().bytes(CollectiveOp::kAllReduce), 20 * 1024 * 4);
  EXPECT_GT(g->stream_counters().seconds(CollectiveOp::kAllReduce), 0.0);
  EXPECT_TRUE(me->watchdog->error().ok());
  me->dev->Free(d);
}

}  // namespace
}  // namespace furnace::comm
