// Real Gloo over TCP on 127.0.0.1, one thread per rank, each with its own ConnectGloo on a shared
// InMemoryKvStore.
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

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/comm/gloo_context.h"
#include "runtime/comm/kv_store.h"

namespace furnace::comm {
namespace {

using ::testing::AnyOf;

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Runs `body(rank, context)` on one thread per rank after each connected; returns per-rank status
// of the connect (or of body, if connect succeeded).
std::vector<absl::Status> RunWorld(
    int world, double timeout_s,
    const std::function<absl::Status(int, std::shared_ptr<gloo::Context>)>& body) {
  InMemoryKvStore store;
  std::vector<absl::Status> statuses(world);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world; ++rank) {
    threads.emplace_back([&, rank] {
      GlooOptions options;
      options.rank = rank;
      options.size = world;
      options.timeout_s = timeout_s;
      absl::StatusOr<std::shared_ptr<gloo::Context>> context = ConnectGloo(store, options);
      statuses[rank] = context.ok() ? body(rank, *std::move(context)) : context.status();
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
      RunWorld(world, 10, [&](int rank, std::shared_ptr<gloo::Context> context) {
        return RunCommcheck(*context, options,
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
      RunWorld(1, 5, [](int, std::shared_ptr<gloo::Context> context) {
        CommcheckOptions options;
        options.collectives = {"allreduce", "reduce_scatter"};
        absl::Status unknown = RunCommcheck(*context, options, nullptr);
        EXPECT_TRUE(absl::IsInvalidArgument(unknown)) << unknown;
        options = CommcheckOptions();
        options.min_bytes = 8192;
        options.max_bytes = 4096;
        return RunCommcheck(*context, options, nullptr);
      });
  EXPECT_TRUE(absl::IsInvalidArgument(statuses[0])) << statuses[0];
}

TEST(CommcheckTest, CallbackErrorStopsTheRunAndIsReturned) {
  int calls = 0;
  std::vector<absl::Status> statuses =
      RunWorld(1, 5, [&](int, std::shared_ptr<gloo::Context> context) {
        return RunCommcheck(*context, SmallOptions(), [&](uint32_t, const CommResult*, bool) {
          ++calls;
          return absl::CancelledError("operator stopped it");
        });
      });
  EXPECT_TRUE(absl::IsCancelled(statuses[0])) << statuses[0];
  EXPECT_EQ(calls, 1);
}

// World 3: rank 2 connects, then destroys its context without taking part. Ranks 0 and 1 must get
// a non-OK status within the 2 s collective timeout (plus slack), never hang and never crash.
TEST(CommcheckFailureTest, PeerThatClosesItsContextFailsTheOthers) {
  CommcheckOptions options = SmallOptions();
  options.timeout_s = 2;
  std::vector<double> elapsed(3, 0);
  std::vector<absl::Status> statuses =
      RunWorld(3, 5, [&](int rank, std::shared_ptr<gloo::Context> context) {
        if (rank == 2) {
          context.reset();  // closes its sockets
          return absl::OkStatus();
        }
        const auto start = std::chrono::steady_clock::now();
        absl::Status status = RunCommcheck(*context, options, nullptr);
        elapsed[rank] = SecondsSince(start);
        return status;
      });
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_THAT(statuses[rank].code(),
                AnyOf(absl::StatusCode::kUnavailable, absl::StatusCode::kDeadlineExceeded))
        << statuses[rank];
    EXPECT_LT(elapsed[rank], 6.0) << statuses[rank];
    std::printf("rank %d after %.2f s: %s\n", rank, elapsed[rank],
                statuses[rank].ToString().c_str());
  }
}

// World 3: rank 2 stays connected but never calls the collective.
TEST(CommcheckFailureTest, PeerThatNeverJoinsTimesOutTheOthers) {
  CommcheckOptions options = SmallOptions();
  options.timeout_s = 2;
  std::atomic<int> finished{0};
  std::vector<double> elapsed(3, 0);
  std::vector<absl::Status> statuses =
      RunWorld(3, 5, [&](int rank, std::shared_ptr<gloo::Context> context) {
        if (rank == 2) {
          const auto start = std::chrono::steady_clock::now();
          while (finished.load() < 2 && SecondsSince(start) < 20) {
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
          }
          return absl::OkStatus();
        }
        const auto start = std::chrono::steady_clock::now();
        absl::Status status = RunCommcheck(*context, options, nullptr);
        elapsed[rank] = SecondsSince(start);
        ++finished;
        return status;
      });
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_THAT(statuses[rank].code(),
                AnyOf(absl::StatusCode::kUnavailable, absl::StatusCode::kDeadlineExceeded))
        << statuses[rank];
    EXPECT_LT(elapsed[rank], 6.0) << statuses[rank];
    std::printf("rank %d after %.2f s: %s\n", rank, elapsed[rank],
                statuses[rank].ToString().c_str());
  }
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
  EXPECT_GE(elapsed, 1.5);
  EXPECT_LT(elapsed, 5.0);
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
