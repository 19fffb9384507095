// The commcheck on its two kinds of group: real Gloo communicators over TCP on 127.0.0.1 between
// CPU ranks (one thread per rank, each with its own CPU device, rendezvous on a shared
// InMemoryKvStore), and stream-ordered communicators on emulated discrete devices (the way a GPU
// rank runs NCCL: buffers the host cannot read, collectives on their own streams).
#include "runtime/comm/commcheck.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <tuple>

#include "emulated_ranks.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/comm/gloo_communicator.h"
#include "runtime/comm/gloo_context.h"
#include "runtime/comm/kv_store.h"
#include "runtime/comm/local_communicator.h"
#include "tests/testing/forwarding_communicator.h"

namespace furnace::comm {
namespace {

using ::testing::AnyOf;

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Runs `body(rank, group, device)` on one thread per rank after each connected a Gloo
// communicator (rendezvous within `timeout_s`, each collective within `op_timeout_s`, 0: the
// same); returns per-rank status of the connect (or of body, if connect succeeded).
std::vector<absl::Status> RunWorld(
    int world, double timeout_s,
    const std::function<absl::Status(int, std::unique_ptr<Communicator>&, device::Device&)>& body,
    double op_timeout_s = 0) {
  InMemoryKvStore store;
  std::vector<absl::Status> statuses(world);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world; ++rank) {
    threads.emplace_back([&, rank] {
      GlooOptions options;
      options.timeout_s = timeout_s;
      options.op_timeout_s = op_timeout_s;
      absl::StatusOr<std::unique_ptr<Communicator>> group =
          CreateGlooCommunicator(store, "commcheck", "world", rank, world, options);
      std::unique_ptr<device::Device> cpu = device::CreateCpuDevice();
      statuses[rank] = group.ok() ? body(rank, *group, *cpu) : group.status();
    });
  }
  for (std::thread& t : threads) t.join();
  return statuses;
}

CommcheckOptions SmallOptions() {
  CommcheckOptions options;
  options.min_bytes = 4096;
  options.max_bytes = 64 << 10;
  options.step_factor = 4;  // 4 KiB, 16 KiB, 64 KiB
  options.iters = 3;
  options.warmup_iters = 1;
  options.rounds = 2;
  options.timeout_s = 10;
  return options;
}

class CommcheckWorldTest : public ::testing::TestWithParam<int> {};

TEST_P(CommcheckWorldTest, EveryResultVerifiedAndReported) {
  const int world = GetParam();
  const CommcheckOptions options = SmallOptions();
  std::mutex mu;
  // (rank, round, collective, bytes) -> result
  std::map<std::tuple<int, uint32_t, std::string, uint64_t>, CommResult> seen;
  std::map<int, std::vector<uint32_t>> rounds_done;

  std::vector<absl::Status> statuses =
      RunWorld(world, 10, [&](int rank, std::unique_ptr<Communicator>& group, device::Device& dev) {
        return RunCommcheck(*group, dev, options,
                            [&](uint32_t round, const CommResult* result, bool round_done) {
                              std::lock_guard<std::mutex> lock(mu);
                              if (round_done) {
                                EXPECT_EQ(result, nullptr);
                                rounds_done[rank].push_back(round);
                              } else {
                                seen[{rank, round, result->collective, result->bytes}] = *result;
                              }
                              return absl::OkStatus();
                            });
      });
  for (int rank = 0; rank < world; ++rank) EXPECT_TRUE(statuses[rank].ok()) << statuses[rank];

  const std::vector<uint64_t> sizes = {4096, 16384, 65536};
  EXPECT_EQ(seen.size(), world * options.rounds * sizes.size() * options.collectives.size());
  for (int rank = 0; rank < world; ++rank) {
    EXPECT_EQ(rounds_done[rank], std::vector<uint32_t>({0, 1})) << "rank " << rank;
    for (uint32_t round = 0; round < options.rounds; ++round) {
      for (const std::string& collective : options.collectives) {
        for (uint64_t bytes : sizes) {
          auto it = seen.find({rank, round, collective, bytes});
          ASSERT_NE(it, seen.end()) << rank << " " << round << " " << collective << " " << bytes;
          const CommResult& r = it->second;
          EXPECT_TRUE(r.verified) << collective << " " << bytes;
          EXPECT_EQ(r.errors, 0u);
          EXPECT_EQ(r.world_size, world);
          EXPECT_GT(r.time_s, 0);
          EXPECT_GT(r.algbw_gbps, 0);
          if (world > 1) {
            EXPECT_GT(r.busbw_gbps, 0);
          }
          // The time is agreed: every rank reports rank 0's number.
          const CommResult& rank0 = seen[std::make_tuple(0, round, collective, bytes)];
          EXPECT_EQ(r.time_s, rank0.time_s);
        }
      }
    }
  }
  for (const auto& [key, r] : seen) {
    if (std::get<0>(key) != 0 || std::get<1>(key) != options.rounds - 1) continue;
    std::printf(
        "commcheck world %d %-9s %7llu B  %9.1f us  algbw %7.3f GB/s  busbw %7.3f GB/s  %s\n",
        world, r.collective.c_str(), static_cast<unsigned long long>(r.bytes), r.time_s * 1e6,
        r.algbw_gbps, r.busbw_gbps, r.verified ? "OK" : "FAIL");
  }
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, CommcheckWorldTest, ::testing::Values(1, 2, 3, 4));

TEST(CommcheckTest, InvalidOptionsAreRejectedBeforeCommunicating) {
  std::vector<absl::Status> statuses =
      RunWorld(1, 5, [](int, std::unique_ptr<Communicator>& group, device::Device& dev) {
        CommcheckOptions options;
        options.collectives = {"allreduce", "reduce_scatter"};
        absl::Status unknown = RunCommcheck(*group, dev, options, nullptr);
        EXPECT_TRUE(absl::IsInvalidArgument(unknown)) << unknown;
        options = CommcheckOptions();
        options.min_bytes = 8192;
        options.max_bytes = 4096;
        return RunCommcheck(*group, dev, options, nullptr);
      });
  EXPECT_TRUE(absl::IsInvalidArgument(statuses[0])) << statuses[0];
}

TEST(CommcheckTest, CallbackErrorStopsTheRunAndIsReturned) {
  int calls = 0;
  std::vector<absl::Status> statuses =
      RunWorld(1, 5, [&](int, std::unique_ptr<Communicator>& group, device::Device& dev) {
        return RunCommcheck(*group, dev, SmallOptions(), [&](uint32_t, const CommResult*, bool) {
          ++calls;
          return absl::CancelledError("operator stopped it");
        });
      });
  EXPECT_TRUE(absl::IsCancelled(statuses[0])) << statuses[0];
  EXPECT_EQ(calls, 1);
}

// World 3: rank 2 connects, then destroys its communicator without taking part. Ranks 0 and 1 must
// get a non-OK status (by the closed connections or the 2 s collective timeout), never hang
// (ctest's timeout catches that) and never crash.
TEST(CommcheckFailureTest, PeerThatClosesItsGroupFailsTheOthers) {
  std::vector<double> elapsed(3, 0);
  std::vector<absl::Status> statuses = RunWorld(
      3, 5,
      [&](int rank, std::unique_ptr<Communicator>& group, device::Device& dev) {
        if (rank == 2) {
          group.reset();  // closes its sockets
          return absl::OkStatus();
        }
        const auto start = std::chrono::steady_clock::now();
        absl::Status status = RunCommcheck(*group, dev, SmallOptions(), nullptr);
        elapsed[rank] = SecondsSince(start);
        return status;
      },
      /*op_timeout_s=*/2);
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_THAT(statuses[rank].code(),
                AnyOf(absl::StatusCode::kUnavailable, absl::StatusCode::kDeadlineExceeded))
        << statuses[rank];
    std::printf("rank %d after %.2f s: %s\n", rank, elapsed[rank],
                statuses[rank].ToString().c_str());
  }
}

// World 3: rank 2 stays connected but never calls the collective: the others fail by the 2 s
// collective timeout instead of hanging (ctest's timeout catches a hang).
TEST(CommcheckFailureTest, PeerThatNeverJoinsTimesOutTheOthers) {
  std::atomic<int> finished{0};
  std::vector<double> elapsed(3, 0);
  std::vector<absl::Status> statuses = RunWorld(
      3, 5,
      [&](int rank, std::unique_ptr<Communicator>& group, device::Device& dev) {
        if (rank == 2) {
          const auto start = std::chrono::steady_clock::now();
          while (finished.load() < 2 && SecondsSince(start) < 20) {
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
          }
          return absl::OkStatus();
        }
        const auto start = std::chrono::steady_clock::now();
        absl::Status status = RunCommcheck(*group, dev, SmallOptions(), nullptr);
        elapsed[rank] = SecondsSince(start);
        ++finished;
        return status;
      },
      /*op_timeout_s=*/2);
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_THAT(statuses[rank].code(),
                AnyOf(absl::StatusCode::kUnavailable, absl::StatusCode::kDeadlineExceeded))
        << statuses[rank];
    std::printf("rank %d after %.2f s: %s\n", rank, elapsed[rank],
                statuses[rank].ToString().c_str());
  }
}

// A transport that corrupts one element of every all-gather it delivers on rank 1: every call's
// output is checked, so the run stops at the first all-gather with DataLoss on every rank (the
// error count is agreed), and the result handed to the callback says how many elements were wrong.
class CorruptingAllGather final : public testing::ForwardingCommunicator {
 public:
  using ForwardingCommunicator::ForwardingCommunicator;
  absl::Status AllGather(const void* in, void* out, int64_t bytes_per_rank) override {
    absl::Status s = ForwardingCommunicator::AllGather(in, out, bytes_per_rank);
    // The payloads' all-gathers, not the small one that agrees on the result.
    const bool payload = bytes_per_rank >= static_cast<int64_t>(SmallOptions().min_bytes);
    if (s.ok() && rank() == 1 && payload) static_cast<int32_t*>(out)[3] ^= 1;
    return s;
  }
};

TEST(CommcheckTest, AWrongElementIsDataLossOnEveryRank) {
  std::mutex mu;
  std::vector<CommResult> unverified;
  std::vector<absl::Status> statuses =
      RunWorld(2, 10, [&](int, std::unique_ptr<Communicator>& group, device::Device& dev) {
        CorruptingAllGather corrupting(std::move(group));
        return RunCommcheck(corrupting, dev, SmallOptions(),
                            [&](uint32_t, const CommResult* result, bool) {
                              if (result != nullptr && !result->verified) {
                                std::lock_guard<std::mutex> lock(mu);
                                unverified.push_back(*result);
                              }
                              return absl::OkStatus();
                            });
      });
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_TRUE(absl::IsDataLoss(statuses[rank])) << statuses[rank];
    EXPECT_NE(std::string(statuses[rank].message()).find("commcheck allgather 4096 B"),
              std::string::npos)
        << statuses[rank];
  }
  EXPECT_NE(std::string(statuses[1].message()).find("first here:"), std::string::npos)
      << statuses[1];
  ASSERT_EQ(unverified.size(), 2u);
  // warmup + iters calls, one wrong element each, all on rank 1.
  EXPECT_EQ(unverified[0].errors, SmallOptions().warmup_iters + SmallOptions().iters);
}

// The same run on emulated discrete devices: buffers the host cannot read, each collective on a
// communication stream of its own (the emulated transport where NCCL stands on a GPU), ordered
// with the compute stream by events, under a watchdog.
class CommcheckDeviceTest : public ::testing::TestWithParam<int> {};

TEST_P(CommcheckDeviceTest, EveryResultVerifiedOnTheDevice) {
  const int world = GetParam();
  using namespace emulated_ranks;  // NOLINT(build/namespaces): test helpers
  std::vector<std::unique_ptr<EmulatedRank>> ranks;
  LocalGroup host(world);
  std::vector<std::unique_ptr<StreamCommunicator>> groups;
  for (int r = 0; r < world; ++r) {
    ranks.push_back(MakeRank());
    groups.push_back(Connect(*ranks[r], host.Member(r)));
    ASSERT_NE(groups.back(), nullptr);
  }
  std::mutex mu;
  std::map<std::tuple<int, std::string, uint64_t>, CommResult> seen;
  std::vector<absl::Status> statuses(world);
  const CommcheckOptions options = SmallOptions();
  RunRanks(ranks, [&](int r) {
    statuses[r] = RunCommcheck(*groups[r], *ranks[r]->dev, options,
                               [&](uint32_t round, const CommResult* result, bool) {
                                 if (result != nullptr && round == options.rounds - 1) {
                                   std::lock_guard<std::mutex> lock(mu);
                                   seen[{r, result->collective, result->bytes}] = *result;
                                 }
                                 return absl::OkStatus();
                               });
  });
  for (int r = 0; r < world; ++r)
    EXPECT_TRUE(statuses[r].ok()) << "rank " << r << ": " << statuses[r];
  EXPECT_EQ(seen.size(), world * 3 * options.collectives.size());
  for (const auto& [key, result] : seen) {
    EXPECT_TRUE(result.verified) << std::get<1>(key) << " " << std::get<2>(key);
    EXPECT_EQ(result.world_size, world);
    EXPECT_GT(result.time_s, 0);
  }
  // Each collective ran on the communication stream: the watchdog saw them complete there.
  for (int r = 0; r < world; ++r) {
    EXPECT_GT(groups[r]->stream_counters().calls(CollectiveOp::kAllToAll), 0) << "rank " << r;
  }
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, CommcheckDeviceTest, ::testing::Values(1, 2, 3));

// On the device a peer that never takes part is the watchdog's: the collective does not complete
// within its timeout, the group is aborted, and the commcheck fails instead of waiting forever.
// The host group's and the transport's own timeouts are longer than ctest's, so nothing but the
// watchdog can end the wait (without it the test hangs).
TEST(CommcheckDeviceFailureTest, APeerThatNeverJoinsIsTheWatchdogs) {
  using namespace emulated_ranks;  // NOLINT(build/namespaces): test helpers
  constexpr double kLongerThanTheTestS = 600;
  std::vector<std::unique_ptr<EmulatedRank>> ranks;
  LocalGroup host(2, {.timeout_s = kLongerThanTheTestS});
  std::vector<std::unique_ptr<StreamCommunicator>> groups;
  for (int r = 0; r < 2; ++r) {
    ranks.push_back(MakeRank({.timeout_s = 1}));
    groups.push_back(Connect(*ranks[r], host.Member(r), nullptr, kLongerThanTheTestS));
  }
  absl::Status status;
  double elapsed = 0;
  std::thread rank0([&] {
    const device::StreamScope scope(*ranks[0]->compute);
    const auto start = std::chrono::steady_clock::now();
    status = RunCommcheck(*groups[0], *ranks[0]->dev, SmallOptions(), nullptr);
    elapsed = SecondsSince(start);
  });
  rank0.join();
  EXPECT_FALSE(status.ok());
  EXPECT_THAT(status.code(), AnyOf(absl::StatusCode::kDeadlineExceeded,
                                   absl::StatusCode::kCancelled, absl::StatusCode::kUnavailable))
      << status;
  std::printf("rank 0 after %.2f s: %s\n", elapsed, status.ToString().c_str());
  groups[1]->Abort("the test is over");
}

// World 2 with only rank 0 present: rendezvous gives up within its timeout and ticked meanwhile.
TEST(ConnectGlooTest, RendezvousTimesOutWhenAPeerNeverComes) {
  InMemoryKvStore store;
  std::atomic<int> ticks{0};
  GlooOptions options;
  options.rank = 0;
  options.size = 2;
  options.timeout_s = 2;
  options.on_wait_tick = [&] { ++ticks; };
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<std::shared_ptr<gloo::Context>> context = ConnectGloo(store, options);
  const double elapsed = SecondsSince(start);
  EXPECT_TRUE(absl::IsDeadlineExceeded(context.status())) << context.status();
  EXPECT_GE(elapsed, 1.5);  // not before the timeout (ctest's timeout catches a hang)
  EXPECT_GE(ticks.load(), 1);
  std::printf("after %.2f s, %d ticks: %s\n", elapsed, ticks.load(),
              context.status().ToString().c_str());
}

TEST(ConnectGlooTest, BadRankIsInvalidArgument) {
  InMemoryKvStore store;
  GlooOptions options;
  options.rank = 2;
  options.size = 2;
  EXPECT_TRUE(absl::IsInvalidArgument(ConnectGloo(store, options).status()));
  options.rank = 0;
  options.size = 0;
  EXPECT_TRUE(absl::IsInvalidArgument(ConnectGloo(store, options).status()));
}

}  // namespace
}  // namespace furnace::comm
