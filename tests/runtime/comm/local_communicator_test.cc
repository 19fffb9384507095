// LocalGroup: every collective against a serial computation on 1..5 threads (sizes 0 and uneven
// splits included), exact byte counters, point-to-point with tags, argument mismatches, timeouts
// and Abort. Payloads encode their source (and destination) so a misrouted chunk shows by value.
#include "runtime/comm/local_communicator.h"

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace furnace::comm {
namespace {

using ::testing::HasSubstr;

// Runs body(communicator) for every member of a fresh group of n, one thread each.
void RunRanks(int n, const std::function<void(Communicator&)>& body,
              LocalGroupOptions options = {.name = "g[test]"}) {
  LocalGroup group(n, std::move(options));
  std::vector<std::unique_ptr<Communicator>> comms;
  for (int r = 0; r < n; ++r) {
    comms.push_back(group.Member(r));
    ASSERT_NE(comms.back(), nullptr);
  }
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) threads.emplace_back([&, r] { body(*comms[r]); });
  for (std::thread& t : threads) t.join();
}

// Different magnitudes per rank, so the summation order shows in the rounding.
float Value(int rank, int64_t i) {
  return static_cast<float>(rank + 1) * 0.37f + static_cast<float>(i % 101) * 1e-3f +
         (rank % 2 == 0 ? 1e4f : 0.0f);
}

uint8_t Byte(int src, int dst, int64_t i) { return static_cast<uint8_t>(src * 31 + dst * 7 + i); }

// Sum over ranks 0..n-1 in order of Value(r, offset + i).
float SerialSum(int n, int64_t offset, int64_t i) {
  float acc = Value(0, offset + i);
  for (int r = 1; r < n; ++r) acc += Value(r, offset + i);
  return acc;
}

const std::vector<int64_t> kCounts = {0, 1, 7, 1000};

TEST(LocalCommunicatorTest, MembersAreTakenOnce) {
  LocalGroup group(2);
  EXPECT_EQ(group.size(), 2);
  EXPECT_EQ(group.Member(-1), nullptr);
  EXPECT_EQ(group.Member(2), nullptr);
  std::unique_ptr<Communicator> m = group.Member(1);
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(m->rank(), 1);
  EXPECT_EQ(m->size(), 2);
  EXPECT_EQ(m->name(), "local");
  EXPECT_EQ(group.Member(1), nullptr);
}

TEST(LocalCommunicatorTest, AllReduce) {
  for (int n = 1; n <= 5; ++n) {
    RunRanks(n, [n](Communicator& c) {
      int64_t bytes = 0;
      for (int64_t count : kCounts) {
        std::vector<float> data(count);
        for (int64_t i = 0; i < count; ++i) data[i] = Value(c.rank(), i);
        ASSERT_TRUE(c.AllReduce(data.data(), count).ok());
        for (int64_t i = 0; i < count; ++i) ASSERT_EQ(data[i], SerialSum(n, 0, i)) << i;
        bytes += count * 4;
      }
      EXPECT_EQ(c.counters().bytes(CollectiveOp::kAllReduce), bytes);
      EXPECT_EQ(c.counters().calls(CollectiveOp::kAllReduce), 4);
    });
  }
}

TEST(LocalCommunicatorTest, ReduceScatter) {
  for (int n = 1; n <= 5; ++n) {
    RunRanks(n, [n](Communicator& c) {
      int64_t bytes = 0;
      for (int64_t per_rank : kCounts) {
        std::vector<float> in(n * per_rank), out(per_rank, -1.0f);
        for (int64_t i = 0; i < n * per_rank; ++i) in[i] = Value(c.rank(), i);
        ASSERT_TRUE(c.ReduceScatter(in.data(), out.data(), per_rank).ok());
        for (int64_t i = 0; i < per_rank; ++i) {
          ASSERT_EQ(out[i], SerialSum(n, c.rank() * per_rank, i));
        }
        bytes += n * per_rank * 4;
      }
      EXPECT_EQ(c.counters().bytes(CollectiveOp::kReduceScatter), bytes);
      EXPECT_EQ(c.counters().calls(CollectiveOp::kReduceScatter), 4);
    });
  }
}

TEST(LocalCommunicatorTest, ReduceScatterVUneven) {
  for (int n = 1; n <= 5; ++n) {
    std::vector<int64_t> counts(n);
    for (int r = 0; r < n; ++r) counts[r] = (r * 3 + 1) % 4 * 5;  // 5, 0, 15, 10, 5
    int64_t total = 0;
    for (int64_t x : counts) total += x;
    RunRanks(n, [&, n](Communicator& c) {
      std::vector<float> in(total), out(counts[c.rank()]);
      for (int64_t i = 0; i < total; ++i) in[i] = Value(c.rank(), i);
      ASSERT_TRUE(c.ReduceScatterV(in.data(), out.data(), counts).ok());
      int64_t offset = 0;
      for (int r = 0; r < c.rank(); ++r) offset += counts[r];
      for (int64_t i = 0; i < counts[c.rank()]; ++i) ASSERT_EQ(out[i], SerialSum(n, offset, i));
      EXPECT_EQ(c.counters().bytes(CollectiveOp::kReduceScatter), total * 4);
    });
  }
}

TEST(LocalCommunicatorTest, InPlaceReduceScatterAliasesItsInput) {
  RunRanks(3, [](Communicator& c) {
    std::vector<float> buf(3 * 4);
    for (int64_t i = 0; i < 12; ++i) buf[i] = Value(c.rank(), i);
    ASSERT_TRUE(c.ReduceScatter(buf.data(), buf.data(), 4).ok());
    for (int64_t i = 0; i < 4; ++i) ASSERT_EQ(buf[i], SerialSum(3, c.rank() * 4, i));
  });
}

TEST(LocalCommunicatorTest, AllGather) {
  for (int n = 1; n <= 5; ++n) {
    RunRanks(n, [n](Communicator& c) {
      int64_t bytes = 0;
      for (int64_t per_rank : kCounts) {
        std::vector<uint8_t> in(per_rank), out(n * per_rank);
        for (int64_t i = 0; i < per_rank; ++i) in[i] = Byte(c.rank(), 0, i);
        ASSERT_TRUE(c.AllGather(in.data(), out.data(), per_rank).ok());
        for (int r = 0; r < n; ++r) {
          for (int64_t i = 0; i < per_rank; ++i) ASSERT_EQ(out[r * per_rank + i], Byte(r, 0, i));
        }
        bytes += per_rank;
      }
      EXPECT_EQ(c.counters().bytes(CollectiveOp::kAllGather), bytes);
    });
  }
}

TEST(LocalCommunicatorTest, AllGatherVUneven) {
  for (int n = 1; n <= 5; ++n) {
    std::vector<int64_t> recv(n);
    for (int r = 0; r < n; ++r) recv[r] = (r + 2) % 3 * 5;  // 10, 0, 5, 10, 0
    RunRanks(n, [&, n](Communicator& c) {
      std::vector<uint8_t> in(recv[c.rank()]);
      for (size_t i = 0; i < in.size(); ++i) in[i] = Byte(c.rank(), 0, i);
      int64_t total = 0;
      for (int64_t x : recv) total += x;
      std::vector<uint8_t> out(total);
      ASSERT_TRUE(c.AllGatherV(in.data(), in.size(), out.data(), recv).ok());
      int64_t offset = 0;
      for (int r = 0; r < n; ++r) {
        for (int64_t i = 0; i < recv[r]; ++i) ASSERT_EQ(out[offset + i], Byte(r, 0, i));
        offset += recv[r];
      }
      EXPECT_EQ(c.counters().bytes(CollectiveOp::kAllGather), recv[c.rank()]);
    });
  }
}

// Bytes from src to dst in the uneven all-to-all (zeros included).
int64_t Chunk(int src, int dst) { return (src * 7 + dst * 3) % 5 * 3; }

TEST(LocalCommunicatorTest, AllToAllVUneven) {
  for (int n = 1; n <= 5; ++n) {
    RunRanks(n, [n](Communicator& c) {
      const int me = c.rank();
      std::vector<int64_t> send(n), recv(n);
      std::vector<uint8_t> in;
      int64_t sent = 0, received = 0;
      for (int r = 0; r < n; ++r) {
        send[r] = Chunk(me, r);
        recv[r] = Chunk(r, me);
        for (int64_t i = 0; i < send[r]; ++i) in.push_back(Byte(me, r, i));
        sent += send[r];
        received += recv[r];
      }
      std::vector<uint8_t> out(received);
      ASSERT_TRUE(c.AllToAllV(in.data(), send, out.data(), recv).ok());
      int64_t offset = 0;
      for (int r = 0; r < n; ++r) {
        for (int64_t i = 0; i < recv[r]; ++i) ASSERT_EQ(out[offset + i], Byte(r, me, i));
        offset += recv[r];
      }
      EXPECT_EQ(c.counters().bytes(CollectiveOp::kAllToAll), sent);
      EXPECT_EQ(c.counters().calls(CollectiveOp::kAllToAll), 1);
    });
  }
}

TEST(LocalCommunicatorTest, BroadcastFromEveryRoot) {
  for (int n = 1; n <= 5; ++n) {
    RunRanks(n, [n](Communicator& c) {
      int64_t bytes = 0;
      for (int root = n - 1; root >= 0; --root) {
        for (int64_t size : {int64_t{0}, int64_t{13}}) {
          std::vector<uint8_t> data(size);
          for (int64_t i = 0; i < size; ++i) data[i] = Byte(c.rank(), 0, i);
          ASSERT_TRUE(c.Broadcast(data.data(), size, root).ok());
          for (int64_t i = 0; i < size; ++i) ASSERT_EQ(data[i], Byte(root, 0, i));
          bytes += size;
        }
      }
      EXPECT_EQ(c.counters().bytes(CollectiveOp::kBroadcast), bytes);
      EXPECT_EQ(c.counters().calls(CollectiveOp::kBroadcast), 2 * n);
    });
  }
}

TEST(LocalCommunicatorTest, BarrierCountsCallsNotBytes) {
  RunRanks(4, [](Communicator& c) {
    for (int i = 0; i < 3; ++i) ASSERT_TRUE(c.Barrier().ok());
    EXPECT_EQ(c.counters().bytes(CollectiveOp::kBarrier), 0);
    EXPECT_EQ(c.counters().calls(CollectiveOp::kBarrier), 3);
    // Each call's wall time (waiting for the other threads included) is counted.
    EXPECT_GT(c.counters().seconds(CollectiveOp::kBarrier), 0);
    EXPECT_EQ(c.counters().seconds(CollectiveOp::kAllReduce), 0);
  });
}

TEST(LocalCommunicatorTest, SendRecvWithTags) {
  for (int n = 1; n <= 5; ++n) {
    RunRanks(n, [n](Communicator& c) {
      const int me = c.rank(), next = (me + 1) % n, prev = (me + n - 1) % n;
      std::vector<uint8_t> a(10), b(3), d(0);
      for (int i = 0; i < 10; ++i) a[i] = Byte(me, next, i);
      for (int i = 0; i < 3; ++i) b[i] = Byte(me, next, 100 + i);
      ASSERT_TRUE(c.Send(a.data(), 10, next, 1).ok());
      ASSERT_TRUE(c.Send(b.data(), 3, next, 2).ok());
      ASSERT_TRUE(c.Send(b.data(), 3, next, 1).ok());  // same tag: arrives after `a`
      ASSERT_TRUE(c.Send(d.data(), 0, next, 1).ok());
      a.assign(10, 0);  // Send copied the payload
      ASSERT_TRUE(c.WaitSends().ok());

      std::vector<uint8_t> got(10);
      ASSERT_TRUE(c.Recv(got.data(), 3, prev, 2).ok());  // tags are independent queues
      for (int i = 0; i < 3; ++i) EXPECT_EQ(got[i], Byte(prev, me, 100 + i));
      ASSERT_TRUE(c.Recv(got.data(), 10, prev, 1).ok());
      for (int i = 0; i < 10; ++i) EXPECT_EQ(got[i], Byte(prev, me, i));
      ASSERT_TRUE(c.Recv(got.data(), 3, prev, 1).ok());
      for (int i = 0; i < 3; ++i) EXPECT_EQ(got[i], Byte(prev, me, 100 + i));
      ASSERT_TRUE(c.Recv(got.data(), 0, prev, 1).ok());
      EXPECT_EQ(c.counters().bytes(CollectiveOp::kSend), 16);
      EXPECT_EQ(c.counters().calls(CollectiveOp::kSend), 4);
      EXPECT_EQ(c.counters().bytes(CollectiveOp::kRecv), 16);
      EXPECT_EQ(c.counters().calls(CollectiveOp::kRecv), 4);
      EXPECT_TRUE(c.Barrier().ok());
    });
  }
}

TEST(LocalCommunicatorTest, MismatchedCollectivesFailOnEveryRank) {
  RunRanks(3, [](Communicator& c) {
    float x[4] = {};
    absl::Status s = c.rank() == 1 ? c.Barrier() : c.AllReduce(x, 4);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(s.message(), HasSubstr("rank 1 called barrier while rank 0 called all_reduce"));
    EXPECT_THAT(s.message(), HasSubstr("group 'g[test]'"));
    EXPECT_EQ(c.Barrier(), s);  // sticky
    EXPECT_EQ(c.AsyncError(), s);
  });
  RunRanks(2, [](Communicator& c) {
    float x[5] = {};
    absl::Status s = c.AllReduce(x, 4 + c.rank());
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(s.message(), HasSubstr("all_reduce on group 'g[test]': rank 1 passed size 5"));
    EXPECT_EQ(c.counters().calls(CollectiveOp::kAllReduce), 0);
  });
  RunRanks(2, [](Communicator& c) {
    std::vector<int64_t> send = {1, 1}, recv = {1, c.rank() == 0 ? int64_t{2} : int64_t{1}};
    uint8_t in[2] = {}, out[3] = {};
    absl::Status s = c.AllToAllV(in, send, out, recv);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(s.message(), HasSubstr("rank 0 expects 2 bytes from rank 1, which sends 1"));
  });
}

// What one member can check alone (collective_checks.h, as Gloo and NCCL check it) fails the
// group at once: the others, already waiting, get the same error instead of a timeout.
TEST(LocalCommunicatorTest, ArgumentsOneMemberGotWrongFailTheGroupAtOnce) {
  const LocalGroupOptions slow = {.name = "g[test]", .timeout_s = 600};
  RunRanks(
      2,
      [](Communicator& c) {
        float x[4] = {};
        absl::Status s = c.AllReduce(c.rank() == 1 ? nullptr : x, 4);
        EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
        EXPECT_THAT(s.message(), HasSubstr("all_reduce on group 'g[test]' (rank 1 of 2): invalid "
                                           "arguments: count 4 with null data"));
      },
      slow);
  RunRanks(
      3,
      [](Communicator& c) {
        uint8_t b[4] = {};
        absl::Status s = c.Broadcast(b, 4, c.rank() == 2 ? 3 : 0);
        EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
        EXPECT_THAT(s.message(), HasSubstr("broadcast on group 'g[test]' (rank 2 of 3)"));
        EXPECT_THAT(s.message(), HasSubstr("root 3"));
      },
      slow);
  RunRanks(
      2,
      [](Communicator& c) {
        std::vector<int64_t> sizes = {1, 1, 1};
        uint8_t in[3] = {}, out[3] = {};
        absl::Status s = c.rank() == 0 ? c.AllToAllV(in, sizes, out, sizes)
                                       : c.AllToAllV(in, {1, 1}, out, {1, 1});
        EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
        EXPECT_THAT(s.message(), HasSubstr("send_bytes has 3 entries"));
      },
      slow);
  RunRanks(
      2,
      [](Communicator& c) {
        absl::Status s = c.rank() == 0 ? c.Send(nullptr, 8, 1, 0) : c.Recv(nullptr, 0, 0, 0);
        EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
        EXPECT_THAT(s.message(), HasSubstr("send on group 'g[test]' (rank 0 of 2): invalid "
                                           "arguments: bytes 8, peer 1"));
      },
      slow);
}

TEST(LocalCommunicatorTest, RecvOfTheWrongSizeFails) {
  RunRanks(2, [](Communicator& c) {
    uint8_t buf[8] = {};
    if (c.rank() == 0) {
      ASSERT_TRUE(c.Send(buf, 8, 1, 0).ok());
    } else {
      absl::Status s = c.Recv(buf, 4, 0, 0);
      EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
      EXPECT_THAT(s.message(), HasSubstr("expected 4 bytes from rank 0 with tag 0"));
    }
  });
}

TEST(LocalCommunicatorTest, AbsentRankTimesOut) {
  LocalGroup group(3, {.name = "tp[0,1,2]", .timeout_s = 0.2});
  std::unique_ptr<Communicator> late = group.Member(2);
  std::vector<absl::Status> results(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r, c = group.Member(r)] {
      float x[2] = {1, 2};
      results[r] = c->AllReduce(x, 2);
    });
  }
  for (std::thread& t : threads) t.join();
  for (const absl::Status& s : results) {
    EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
    EXPECT_THAT(s.message(), HasSubstr("all_reduce on group 'tp[0,1,2]'"));
    EXPECT_THAT(s.message(), HasSubstr("timed out after 0.2 s waiting for rank(s) 2"));
  }
  // The failure is group-wide and sticky: the late rank fails fast with it.
  float y[2] = {};
  EXPECT_EQ(late->AllReduce(y, 2), results[0]);
  EXPECT_EQ(late->AsyncError(), results[0]);
}

TEST(LocalCommunicatorTest, RecvTimesOut) {
  LocalGroup group(2, {.name = "pp[0,4]", .timeout_s = 0.1});
  std::unique_ptr<Communicator> c = group.Member(0);
  uint8_t buf[4];
  absl::Status s = c->Recv(buf, 4, 1, 7);
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(s.message(), HasSubstr("recv on group 'pp[0,4]' (rank 0 of 2)"));
  EXPECT_THAT(s.message(), HasSubstr("from rank 1 with tag 7"));
}

// The group's timeout is longer than ctest's: only the abort can end the waits (without it the
// test hangs).
TEST(LocalCommunicatorTest, AbortWakesBlockedPeers) {
  LocalGroup group(4, {.name = "dp[0,1,2,3]", .timeout_s = 600});
  std::vector<std::unique_ptr<Communicator>> comms;
  for (int r = 0; r < 4; ++r) comms.push_back(group.Member(r));
  std::vector<absl::Status> results(3);
  std::vector<std::thread> threads;
  // Ranks 0 and 1 wait for rank 3 in an all-reduce, rank 2 for a message that never comes.
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      float x[3] = {};
      results[r] = comms[r]->AllReduce(x, 3);
    });
  }
  threads.emplace_back([&] {
    uint8_t buf[1];
    results[2] = comms[2]->Recv(buf, 1, 0, 0);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  comms[3]->Abort("test over");
  for (std::thread& t : threads) t.join();
  for (const absl::Status& s : results) {
    EXPECT_EQ(s.code(), absl::StatusCode::kCancelled) << s;
    EXPECT_THAT(s.message(), HasSubstr("aborted: test over"));
  }
  for (auto& c : comms) {
    EXPECT_EQ(c->Barrier().code(), absl::StatusCode::kCancelled);
    uint8_t b = 0;
    EXPECT_EQ(c->Send(&b, 1, 0, 0).code(), absl::StatusCode::kCancelled);
    EXPECT_EQ(c->WaitSends().code(), absl::StatusCode::kCancelled);
    EXPECT_EQ(c->AsyncError().code(), absl::StatusCode::kCancelled);
  }
  // A second Abort keeps the first error.
  comms[0]->Abort("again");
  EXPECT_THAT(comms[1]->AsyncError().message(), HasSubstr("test over"));
}

}  // namespace
}  // namespace furnace::comm
