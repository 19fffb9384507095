// GlooCommunicator with real processes: every rank is a fork()ed child that rendezvouses through a
// FileKvStore in a fresh directory and talks Gloo over TCP on 127.0.0.1. Children check every
// result against a serial computation of what all ranks hold (each child can compute every other
// rank's inputs) and exit non-zero, saying why on stderr, when one does not match. Payloads encode
// the sending rank, the destination and the index, so a misrouted chunk shows by value.
#include "runtime/comm/gloo_communicator.h"

#include <signal.h>

#include <array>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <ostream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "fork_world.h"
#include "gtest/gtest.h"
#include "runtime/comm/file_kv_store.h"

namespace furnace::comm {
namespace {

using forked::ChildExit;
using forked::RunForked;
using forked::TempDir;
using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// `op_timeout_s` 0: every operation within `timeout_s` too.
absl::StatusOr<std::unique_ptr<Communicator>> Connect(const std::string& dir,
                                                      const std::string& prefix, int rank, int size,
                                                      double timeout_s, double op_timeout_s = 0) {
  FileKvStore store(dir);
  GlooOptions options;
  options.rank = 0;  // replaced by the arguments
  options.size = 1;
  options.timeout_s = timeout_s;
  options.op_timeout_s = op_timeout_s;
  return CreateGlooCommunicator(store, prefix, absl::StrCat(prefix, "[", size, "]"), rank, size,
                                options);
}

void ExpectAllPassed(const std::vector<ChildExit>& exits) {
  for (const ChildExit& exit : exits) EXPECT_TRUE(exit.ok()) << exit.Describe();
}

// ---- Payloads: functions of (sender, destination, index), computable on every rank. ----

float ExactValue(int sender, int64_t i) { return static_cast<float>(sender * 1000 + i % 997); }
// Not exactly representable sums, so rounding order matters.
float InexactValue(int sender, int dest, int64_t i) {
  return 0.37f * static_cast<float>(sender + 1) + 0.011f * static_cast<float>(dest) +
         1e-4f * static_cast<float>(i) + std::sin(static_cast<float>(i + 3 * sender));
}
uint8_t ByteValue(int sender, int64_t j) { return static_cast<uint8_t>(sender * 131 + j * 7 + 1); }
int32_t WordValue(int sender, int dest, int64_t j) {
  return (sender << 24) | (dest << 16) | static_cast<int32_t>(j & 0xffff);
}
uint8_t MessageByte(int sender, uint32_t tag, int64_t size, int64_t j) {
  return static_cast<uint8_t>(sender * 37 + tag * 11 + size * 3 + j);
}

// Bitwise comparison; prints the first difference.
template <typename T>
bool SameBits(int rank, const char* what, const std::vector<T>& got, const std::vector<T>& want) {
  if (got.size() != want.size()) {
    std::fprintf(stderr, "rank %d: %s: %zu elements, want %zu\n", rank, what, got.size(),
                 want.size());
    return false;
  }
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::memcmp(&got[i], &want[i], sizeof(T)) != 0) {
      std::fprintf(stderr, "rank %d: %s: element %zu is %.9g, want %.9g\n", rank, what, i,
                   static_cast<double>(got[i]), static_cast<double>(want[i]));
      return false;
    }
  }
  return true;
}

// The analytical byte and call counts of communicator.h, accumulated as the child goes.
struct ExpectedCounters {
  std::array<int64_t, kNumCollectiveOps> bytes{};
  std::array<int64_t, kNumCollectiveOps> calls{};
  void Add(CollectiveOp op, int64_t b) {
    bytes[static_cast<int>(op)] += b;
    calls[static_cast<int>(op)] += 1;
  }
  bool Match(int rank, const CommCounters& counters) const {
    bool ok = true;
    for (int i = 0; i < kNumCollectiveOps; ++i) {
      const auto op = static_cast<CollectiveOp>(i);
      if (counters.bytes(op) != bytes[i] || counters.calls(op) != calls[i]) {
        std::fprintf(stderr, "rank %d: counters %s: %lld bytes in %lld calls, want %lld in %lld\n",
                     rank, CollectiveOpName(op), static_cast<long long>(counters.bytes(op)),
                     static_cast<long long>(counters.calls(op)), static_cast<long long>(bytes[i]),
                     static_cast<long long>(calls[i]));
        ok = false;
      }
    }
    return ok;
  }
};

// ---- The collectives child, one section per op. ----

int CheckAllReduce(Communicator& comm, ExpectedCounters& expected) {
  const int rank = comm.rank(), world = comm.size();
  for (int64_t count : {0, 1, 5, 1000, 100003}) {
    std::vector<float> data(count), want(count, 0.0f);
    for (int64_t i = 0; i < count; ++i) data[i] = ExactValue(rank, i);
    for (int r = 0; r < world; ++r) {
      for (int64_t i = 0; i < count; ++i) want[i] += ExactValue(r, i);
    }
    CHILD_OK(rank, comm.AllReduce(data.data(), count));
    expected.Add(CollectiveOp::kAllReduce, count * 4);
    CHILD_CHECK(rank, SameBits(rank, "all_reduce exact", data, want));
  }
  // Inexact sums: the same bits on every call and on every rank, close to the serial sum.
  const int64_t count = 4099;
  std::vector<float> first(count), second(count);
  for (int64_t i = 0; i < count; ++i) first[i] = second[i] = InexactValue(rank, 0, i);
  CHILD_OK(rank, comm.AllReduce(first.data(), count));
  CHILD_OK(rank, comm.AllReduce(second.data(), count));
  expected.Add(CollectiveOp::kAllReduce, count * 4);
  expected.Add(CollectiveOp::kAllReduce, count * 4);
  CHILD_CHECK(rank, SameBits(rank, "all_reduce repeated", second, first));
  std::vector<float> everyone(count * world);
  CHILD_OK(rank, comm.AllGather(first.data(), everyone.data(), count * 4));
  expected.Add(CollectiveOp::kAllGather, count * 4);
  for (int r = 0; r < world; ++r) {
    std::vector<float> theirs(everyone.begin() + r * count, everyone.begin() + (r + 1) * count);
    CHILD_CHECK(rank, SameBits(rank, "all_reduce on another rank", theirs, first));
  }
  for (int64_t i = 0; i < count; ++i) {
    double serial = 0;
    for (int r = 0; r < world; ++r) serial += InexactValue(r, 0, i);
    CHILD_CHECK(rank, std::abs(first[i] - serial) <= 1e-5 * (1 + std::abs(serial)));
  }
  return 0;
}

int CheckReduceScatter(Communicator& comm, ExpectedCounters& expected) {
  const int rank = comm.rank(), world = comm.size();
  // Equal chunks, then uneven ones with zeros (ranks 1 and 3 get none), then all empty.
  std::vector<std::vector<int64_t>> cases;
  for (int64_t c : {0, 1, 37}) cases.push_back(std::vector<int64_t>(world, c));
  std::vector<int64_t> uneven(world);
  for (int r = 0; r < world; ++r) uneven[r] = r % 2 == 1 ? 0 : 2 * r + 3;
  cases.push_back(uneven);
  for (size_t k = 0; k < cases.size(); ++k) {
    const std::vector<int64_t>& counts = cases[k];
    const bool equal = k < 3;
    std::vector<int64_t> offsets(world + 1, 0);
    for (int r = 0; r < world; ++r) offsets[r + 1] = offsets[r] + counts[r];
    std::vector<float> in(offsets[world]);
    for (int dst = 0; dst < world; ++dst) {
      for (int64_t i = 0; i < counts[dst]; ++i) in[offsets[dst] + i] = InexactValue(rank, dst, i);
    }
    // Serial: the sum in rank order, exactly as the contract promises.
    std::vector<float> want(counts[rank]);
    for (int64_t i = 0; i < counts[rank]; ++i) {
      float acc = InexactValue(0, rank, i);
      for (int s = 1; s < world; ++s) acc += InexactValue(s, rank, i);
      want[i] = acc;
    }
    std::vector<float> out(counts[rank], -1.0f);
    if (equal) {
      CHILD_OK(rank, comm.ReduceScatter(in.data(), out.data(), counts[0]));
    } else {
      CHILD_OK(rank, comm.ReduceScatterV(in.data(), out.data(), counts));
    }
    expected.Add(CollectiveOp::kReduceScatter, offsets[world] * 4);
    CHILD_CHECK(rank, SameBits(rank, "reduce_scatter", out, want));
  }
  return 0;
}

int CheckAllGather(Communicator& comm, ExpectedCounters& expected) {
  const int rank = comm.rank(), world = comm.size();
  for (int64_t bytes : {0, 1, 7, 65536}) {
    std::vector<uint8_t> in(bytes), out(bytes * world, 0xEE), want(bytes * world);
    for (int64_t j = 0; j < bytes; ++j) in[j] = ByteValue(rank, j);
    for (int r = 0; r < world; ++r) {
      for (int64_t j = 0; j < bytes; ++j) want[r * bytes + j] = ByteValue(r, j);
    }
    CHILD_OK(rank, comm.AllGather(in.data(), out.data(), bytes));
    expected.Add(CollectiveOp::kAllGather, bytes);
    CHILD_CHECK(rank, SameBits(rank, "all_gather", out, want));
  }
  const int64_t pattern[] = {5, 0, 9, 2};
  std::vector<int64_t> recv_bytes(world);
  for (int r = 0; r < world; ++r) recv_bytes[r] = pattern[r % 4];
  std::vector<uint8_t> in(recv_bytes[rank]), want;
  for (int64_t j = 0; j < recv_bytes[rank]; ++j) in[j] = ByteValue(rank, j);
  for (int r = 0; r < world; ++r) {
    for (int64_t j = 0; j < recv_bytes[r]; ++j) want.push_back(ByteValue(r, j));
  }
  std::vector<uint8_t> out(want.size(), 0xEE);
  CHILD_OK(rank, comm.AllGatherV(in.data(), recv_bytes[rank], out.data(), recv_bytes));
  expected.Add(CollectiveOp::kAllGather, recv_bytes[rank]);
  CHILD_CHECK(rank, SameBits(rank, "all_gather_v", out, want));
  return 0;
}

// Words rank `src` sends to rank `dst`: uneven, some zero, never zero to itself.
int64_t AllToAllWords(int src, int dst, int64_t scale) {
  return ((src + 2 * dst) % 3) * scale + (src == dst ? 1 : 0);
}

int CheckAllToAll(Communicator& comm, ExpectedCounters& expected) {
  const int rank = comm.rank(), world = comm.size();
  for (int64_t scale : {int64_t{0}, int64_t{1}, int64_t{5000}}) {
    std::vector<int64_t> send_bytes(world), recv_bytes(world);
    std::vector<int32_t> in, want;
    for (int dst = 0; dst < world; ++dst) {
      const int64_t words = scale == 0 ? 0 : AllToAllWords(rank, dst, scale);
      send_bytes[dst] = words * 4;
      for (int64_t j = 0; j < words; ++j) in.push_back(WordValue(rank, dst, j));
    }
    for (int src = 0; src < world; ++src) {
      const int64_t words = scale == 0 ? 0 : AllToAllWords(src, rank, scale);
      recv_bytes[src] = words * 4;
      for (int64_t j = 0; j < words; ++j) want.push_back(WordValue(src, rank, j));
    }
    std::vector<int32_t> out(want.size(), -1);
    CHILD_OK(rank, comm.AllToAllV(in.data(), send_bytes, out.data(), recv_bytes));
    expected.Add(CollectiveOp::kAllToAll, static_cast<int64_t>(in.size()) * 4);
    CHILD_CHECK(rank, SameBits(rank, "all_to_all", out, want));
  }
  return 0;
}

int CheckBroadcast(Communicator& comm, ExpectedCounters& expected) {
  const int rank = comm.rank(), world = comm.size();
  for (auto [root, bytes] :
       {std::pair{world - 1, int64_t{13}}, std::pair{world - 1, int64_t{100000}},
        std::pair{0, int64_t{0}}, std::pair{world / 2, int64_t{1}}}) {
    std::vector<uint8_t> data(bytes, 0xEE), want(bytes);
    for (int64_t j = 0; j < bytes; ++j) {
      want[j] = ByteValue(root, j);
      if (rank == root) data[j] = want[j];
    }
    CHILD_OK(rank, comm.Broadcast(data.data(), bytes, root));
    expected.Add(CollectiveOp::kBroadcast, bytes);
    CHILD_CHECK(rank, SameBits(rank, "broadcast", data, want));
  }
  return 0;
}

// A ring: every message to the next rank is posted before any is received (so sends must be
// buffered), then received from the previous rank with the tags in reverse order.
int CheckSendRecv(Communicator& comm, ExpectedCounters& expected) {
  const int rank = comm.rank(), world = comm.size();
  const int next = (rank + 1) % world, prev = (rank + world - 1) % world;
  const uint32_t tags[] = {1, 2, 7};
  const int64_t sizes[] = {0, 3, 4096, 1 << 20};
  for (uint32_t tag : tags) {
    for (int64_t size : sizes) {
      std::vector<uint8_t> message(size);
      for (int64_t j = 0; j < size; ++j) message[j] = MessageByte(rank, tag, size, j);
      CHILD_OK(rank, comm.Send(message.data(), size, next, tag));
      expected.Add(CollectiveOp::kSend, size);
    }
  }
  for (int t = 2; t >= 0; --t) {
    for (int64_t size : sizes) {
      std::vector<uint8_t> got(size, 0xEE), want(size);
      for (int64_t j = 0; j < size; ++j) want[j] = MessageByte(prev, tags[t], size, j);
      CHILD_OK(rank, comm.Recv(got.data(), size, prev, tags[t]));
      expected.Add(CollectiveOp::kRecv, size);
      CHILD_CHECK(rank, SameBits(rank, "recv", got, want));
    }
  }
  CHILD_OK(rank, comm.WaitSends());
  return 0;
}

int CollectivesChild(const std::string& dir, int world, int rank) {
  absl::StatusOr<std::unique_ptr<Communicator>> comm = Connect(dir, "world", rank, world, 30);
  CHILD_OK(rank, comm.status());
  CHILD_CHECK(rank, (*comm)->rank() == rank && (*comm)->size() == world);
  ExpectedCounters expected;
  for (auto check : {CheckAllReduce, CheckReduceScatter, CheckAllGather, CheckAllToAll,
                     CheckBroadcast, CheckSendRecv}) {
    if (int code = check(**comm, expected); code != 0) return code;
  }
  CHILD_OK(rank, (*comm)->Barrier());
  expected.Add(CollectiveOp::kBarrier, 0);
  CHILD_OK(rank, (*comm)->AsyncError());
  CHILD_CHECK(rank, expected.Match(rank, (*comm)->counters()));
  return 0;
}

class GlooCommunicatorWorldTest : public ::testing::TestWithParam<int> {};

TEST_P(GlooCommunicatorWorldTest, EveryCollectiveMatchesTheSerialResultAndCountsExactly) {
  TempDir dir("furnace_gloo_comm_");
  ASSERT_FALSE(dir.path().empty());
  const int world = GetParam();
  ExpectAllPassed(
      RunForked(world, [&](int rank) { return CollectivesChild(dir.path(), world, rank); }));
}

INSTANTIATE_TEST_SUITE_P(Worlds, GlooCommunicatorWorldTest, ::testing::Values(1, 2, 3, 4),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return absl::StrCat("world", info.param);
                         });

// ---- Failure: a peer dies; Abort. ----

bool IsPeerFailure(const absl::Status& status) {
  return absl::IsDeadlineExceeded(status) || absl::IsUnavailable(status);
}

// How rank 2 of 3 leaves after the first collectives.
enum class PeerFate { kKilledBeforeTheCall, kKilledWhileOthersWait, kStalls };
const char* FateName(PeerFate fate) {
  switch (fate) {
    case PeerFate::kKilledBeforeTheCall:
      return "KilledBeforeTheCall";
    case PeerFate::kKilledWhileOthersWait:
      return "KilledWhileOthersWait";
    case PeerFate::kStalls:
      return "Stalls";
  }
  return "Unknown";
}
void PrintTo(PeerFate fate, std::ostream* os) { *os << FateName(fate); }

// The survivors' next all-reduce must fail instead of hanging (RunForked's deadline catches a
// hang), name the op and the group, and the error must stick. A killed peer shows at once (its
// sockets are reset); a stalled one only when the 3 s timeout expires (DeadlineExceeded), after
// which the survivors' closed connections make the stalled rank's own next call fail too.
class GlooCommunicatorPeerFailureTest : public ::testing::TestWithParam<PeerFate> {};

TEST_P(GlooCommunicatorPeerFailureTest, SurvivorsFailWithinTheTimeoutAndStayFailed) {
  TempDir dir("furnace_gloo_comm_");
  const PeerFate fate = GetParam();
  const double timeout_s = 3;
  std::vector<ChildExit> exits = RunForked(3, [&](int rank) {
    absl::StatusOr<std::unique_ptr<Communicator>> comm =
        Connect(dir.path(), "doomed", rank, 3, timeout_s);
    CHILD_OK(rank, comm.status());
    std::vector<float> data(1000, 1.0f);
    CHILD_OK(rank, (*comm)->AllReduce(data.data(), 1000));
    CHILD_OK(rank, (*comm)->Barrier());
    if (rank == 2) {
      if (fate == PeerFate::kKilledWhileOthersWait) {
        std::this_thread::sleep_for(std::chrono::milliseconds(500));
      }
      if (fate != PeerFate::kStalls) raise(SIGKILL);
      std::this_thread::sleep_for(std::chrono::duration<double>(timeout_s + 2));
      CHILD_CHECK(rank, !(*comm)->Barrier().ok());
      return 0;
    }
    const Clock::time_point start = Clock::now();
    const absl::Status status = (*comm)->AllReduce(data.data(), 1000);
    const double seconds = SecondsSince(start);
    std::fprintf(stderr, "rank %d: after the peer left: %.2f s: %s\n", rank, seconds,
                 status.ToString().c_str());
    CHILD_CHECK(rank, IsPeerFailure(status));
    if (fate == PeerFate::kStalls) CHILD_CHECK(rank, absl::IsDeadlineExceeded(status));
    CHILD_CHECK(rank, absl::StrContains(status.message(), "all_reduce"));
    CHILD_CHECK(rank, absl::StrContains(status.message(), "doomed[3]"));
    // Sticky: the next call fails with the same error.
    CHILD_CHECK(rank, (*comm)->Barrier() == status);
    CHILD_CHECK(rank, (*comm)->AsyncError() == status);
    return 0;
  });
  ASSERT_EQ(exits.size(), 3u);
  EXPECT_TRUE(exits[0].ok()) << exits[0].Describe();
  EXPECT_TRUE(exits[1].ok()) << exits[1].Describe();
  if (fate == PeerFate::kStalls) {
    EXPECT_TRUE(exits[2].ok()) << exits[2].Describe();
  } else {
    EXPECT_TRUE(!exits[2].exited && exits[2].signal == SIGKILL) << exits[2].Describe();
  }
}

INSTANTIATE_TEST_SUITE_P(Fates, GlooCommunicatorPeerFailureTest,
                         ::testing::Values(PeerFate::kKilledBeforeTheCall,
                                           PeerFate::kKilledWhileOthersWait, PeerFate::kStalls),
                         [](const ::testing::TestParamInfo<PeerFate>& info) {
                           return FateName(info.param);
                         });

// Longer than RunForked's deadline (and ctest's timeout): a blocked call that nothing but its own
// timeout could end shows as a hang, not as a slow pass.
constexpr double kNoOpTimeoutS = 3600;

// Rank 0 aborts; its next call fails with Cancelled, and rank 1, blocked in an all-reduce with
// it, is released because the abort closed the connections: its operations have no timeout that
// could end the wait first (kNoOpTimeoutS).
TEST(GlooCommunicatorAbortTest, AbortFailsLaterCallsAndReleasesBlockedPeers) {
  TempDir dir("furnace_gloo_comm_");
  ExpectAllPassed(RunForked(2, [&](int rank) {
    absl::StatusOr<std::unique_ptr<Communicator>> comm =
        Connect(dir.path(), "ab", rank, 2, 20, kNoOpTimeoutS);
    CHILD_OK(rank, comm.status());
    std::vector<float> data(100, 1.0f);
    const Clock::time_point start = Clock::now();
    if (rank == 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      (*comm)->Abort("test says stop");
      const absl::Status status = (*comm)->AllReduce(data.data(), 100);
      CHILD_CHECK(rank, absl::IsCancelled(status));
      CHILD_CHECK(rank, absl::StrContains(status.message(), "aborted: test says stop"));
      (*comm)->Abort("a later reason");  // the first error stays
      CHILD_CHECK(rank, (*comm)->AsyncError() == status);
    } else {
      const absl::Status status = (*comm)->AllReduce(data.data(), 100);
      std::fprintf(stderr, "rank 1: peer aborted: %.2f s: %s\n", SecondsSince(start),
                   status.ToString().c_str());
      CHILD_CHECK(rank, !status.ok());
    }
    return 0;
  }));
}

// Abort from a watchdog thread releases this rank's blocked Recv; the peer, blocked in WaitSends
// on a message nobody receives, is released by the closed connection. Neither has a timeout that
// could end its wait instead (kNoOpTimeoutS).
TEST(GlooCommunicatorAbortTest, AbortFromAnotherThreadReleasesBlockedRecvAndWaitSends) {
  TempDir dir("furnace_gloo_comm_");
  ExpectAllPassed(RunForked(2, [&](int rank) {
    absl::StatusOr<std::unique_ptr<Communicator>> comm =
        Connect(dir.path(), "wd", rank, 2, 20, kNoOpTimeoutS);
    CHILD_OK(rank, comm.status());
    std::vector<char> buffer(16);
    const Clock::time_point start = Clock::now();
    if (rank == 0) {
      std::thread watchdog([&] {
        std::this_thread::sleep_for(std::chrono::milliseconds(300));
        (*comm)->Abort("watchdog");
      });
      const absl::Status status = (*comm)->Recv(buffer.data(), 16, 1, 5);
      watchdog.join();
      CHILD_CHECK(rank, absl::IsCancelled(status));
      CHILD_CHECK(rank, absl::StrContains(status.message(), "aborted: watchdog"));
    } else {
      CHILD_OK(rank, (*comm)->Send(buffer.data(), 16, 0, 9));  // rank 0 never receives tag 9
      const absl::Status status = (*comm)->WaitSends();
      std::fprintf(stderr, "rank 1: peer aborted: %.2f s: %s\n", SecondsSince(start),
                   status.ToString().c_str());
      CHILD_CHECK(rank, !status.ok());
    }
    return 0;
  }));
}

// ---- Several groups from one store. ----

// Four processes build three groups from one store: everyone ("all"), pairs {0,1} and {2,3}
// ("pair/0", "pair/1"), and everyone again under another prefix; each sums its own ranks.
TEST(GlooCommunicatorGroupsTest, GroupsWithDifferentPrefixesShareOneStore) {
  TempDir dir("furnace_gloo_comm_");
  ExpectAllPassed(RunForked(4, [&](int rank) {
    absl::StatusOr<std::unique_ptr<Communicator>> all = Connect(dir.path(), "all", rank, 4, 30);
    CHILD_OK(rank, all.status());
    absl::StatusOr<std::unique_ptr<Communicator>> pair =
        Connect(dir.path(), absl::StrCat("pair/", rank / 2), rank % 2, 2, 30);
    CHILD_OK(rank, pair.status());
    absl::StatusOr<std::unique_ptr<Communicator>> again = Connect(dir.path(), "again", rank, 4, 30);
    CHILD_OK(rank, again.status());
    float x = static_cast<float>(1 << rank);
    CHILD_OK(rank, (*pair)->AllReduce(&x, 1));
    CHILD_CHECK(rank, x == (rank < 2 ? 3.0f : 12.0f));
    float y = static_cast<float>(1 << rank);
    CHILD_OK(rank, (*all)->AllReduce(&y, 1));
    CHILD_CHECK(rank, y == 15.0f);
    float z = static_cast<float>(10 * rank);
    CHILD_OK(rank, (*again)->AllReduce(&z, 1));
    CHILD_CHECK(rank, z == 60.0f);
    return 0;
  }));
}

// ---- In process: a group of one, argument errors. ----

// Fails every call: a group of one must not use its store.
class UnusableKvStore : public KvStore {
 public:
  absl::Status Set(const std::string&, const std::string&) override {
    return absl::InternalError("store used");
  }
  absl::StatusOr<std::vector<std::string>> Get(const std::vector<std::string>&, double) override {
    return absl::InternalError("store used");
  }
};

GlooOptions SoloOptions() {
  GlooOptions options;
  options.rank = 0;
  options.size = 1;
  return options;
}

std::unique_ptr<Communicator> SizeOne() {
  UnusableKvStore store;
  const GlooOptions options = SoloOptions();
  absl::StatusOr<std::unique_ptr<Communicator>> comm =
      CreateGlooCommunicator(store, "solo", "solo[0]", 0, 1, options);
  EXPECT_TRUE(comm.ok()) << comm.status();
  return comm.ok() ? *std::move(comm) : nullptr;
}

TEST(GlooCommunicatorTest, SizeOneNeedsNoStoreAndSendsToItself) {
  std::unique_ptr<Communicator> comm = SizeOne();
  ASSERT_NE(comm, nullptr);
  const char hello[] = "hello";
  char got[sizeof(hello)] = {};
  ASSERT_TRUE(comm->Send(hello, sizeof(hello), 0, 3).ok());
  ASSERT_TRUE(comm->Recv(got, sizeof(got), 0, 3).ok());
  EXPECT_STREQ(got, hello);
  const absl::Status status = comm->Recv(got, sizeof(got), 0, 3);
  EXPECT_TRUE(absl::IsFailedPrecondition(status)) << status;
  EXPECT_EQ(comm->Barrier(), status);
}

TEST(GlooCommunicatorTest, InvalidArgumentsFailAndAreSticky) {
  std::unique_ptr<Communicator> comm = SizeOne();
  ASSERT_NE(comm, nullptr);
  char buffer[8] = {};
  const absl::Status status = comm->AllToAllV(buffer, {4, 4}, buffer, {4, 4});
  EXPECT_TRUE(absl::IsInvalidArgument(status)) << status;
  EXPECT_TRUE(absl::StrContains(status.message(), "solo[0]")) << status;
  EXPECT_EQ(comm->Barrier(), status);
  EXPECT_EQ(comm->AsyncError(), status);
}

// AllReduce and ReduceScatter go through the same argument checks as every other op (shared with
// the NCCL communicator): one message per misuse, before any transport call.
TEST(GlooCommunicatorTest, BadAllReduceAndReduceScatterArgumentsAreRefused) {
  float x[4] = {};
  struct Misuse {
    std::function<absl::Status(Communicator&)> call;
    std::string message;
  };
  const std::vector<Misuse> misuses = {
      {[](Communicator& c) { return c.AllReduce(nullptr, 2); }, "count 2 with null data"},
      {[&](Communicator& c) { return c.AllReduce(x, -1); }, "count -1 with non-null data"},
      {[&](Communicator& c) { return c.ReduceScatter(nullptr, x, 1); }, "count_per_rank 1"},
      {[&](Communicator& c) { return c.ReduceScatter(x, x, -2); }, "count_per_rank -2"},
      {[&](Communicator& c) { return c.ReduceScatterV(x, nullptr, {1}); }, "null buffer"},
  };
  for (const Misuse& m : misuses) {
    std::unique_ptr<Communicator> comm = SizeOne();
    ASSERT_NE(comm, nullptr);
    const absl::Status status = m.call(*comm);
    EXPECT_TRUE(absl::IsInvalidArgument(status)) << status;
    EXPECT_TRUE(absl::StrContains(status.message(), m.message)) << status;
    EXPECT_EQ(comm->AsyncError(), status);
  }
}

TEST(GlooCommunicatorTest, AbortIsStickyAndKeepsTheFirstReason) {
  std::unique_ptr<Communicator> comm = SizeOne();
  ASSERT_NE(comm, nullptr);
  comm->Abort("first");
  comm->Abort("second");
  float x = 1;
  const absl::Status status = comm->AllReduce(&x, 1);
  EXPECT_TRUE(absl::IsCancelled(status)) << status;
  EXPECT_EQ(status.message(), "aborted: first");
  EXPECT_EQ(comm->counters().calls(CollectiveOp::kAllReduce), 0);
  EXPECT_EQ(comm->counters().seconds(CollectiveOp::kAllReduce), 0);  // failed calls add no time
}

TEST(GlooCommunicatorTest, CreateRejectsABadRank) {
  UnusableKvStore store;
  const GlooOptions options = SoloOptions();
  EXPECT_TRUE(
      absl::IsInvalidArgument(CreateGlooCommunicator(store, "p", "g", 2, 2, options).status()));
  EXPECT_TRUE(
      absl::IsInvalidArgument(CreateGlooCommunicator(store, "p", "g", 0, 0, options).status()));
}

TEST(CollectiveOpNameTest, NamesAreTheMetricLabels) {
  EXPECT_STREQ(CollectiveOpName(CollectiveOp::kAllReduce), "all_reduce");
  EXPECT_STREQ(CollectiveOpName(CollectiveOp::kReduceScatter), "reduce_scatter");
  EXPECT_STREQ(CollectiveOpName(CollectiveOp::kAllToAll), "all_to_all");
  EXPECT_STREQ(CollectiveOpName(CollectiveOp::kBarrier), "barrier");
}

}  // namespace
}  // namespace furnace::comm
