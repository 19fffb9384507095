// The stream-ordered communicator over NCCL on a real GPU (label gpu; every case skips itself,
// saying why, where no GPU is present). Each case runs in a fork()ed child (the parent never
// touches CUDA: gpu_children.h). One GPU allows NCCL communicators of one rank only (NCCL refuses
// two ranks on one device), so the groups here have one member, except the one whose second member
// never joins:
//   * every collective (device memory, host memory, a mix) against the in-process fake's result on
//     the same inputs, with the same byte counts, and the stream time counted;
//   * the event ordering with kernels: a producer kernel on the compute stream held behind a
//     200 ms sleep kernel, a consumer kernel after the collective; without the producer event the
//     stale input is gathered;
//   * the watchdog aborting a real NCCL communicator whose collective cannot complete (its producer
//     stream held by a kernel spinning on a host flag): DeadlineExceeded naming the op and the
//     group, the rank's other group stopped too, later calls failing fast;
//   * a two-rank communicator whose rank 1 never joins: DeadlineExceeded at creation;
//   * the fused all-to-all + all-gather on two NCCL communicators and their streams;
//   * the commcheck on a one-rank NCCL group, every payload on the device;
//   * the eight groups of a train rank (world, tp, dp, pp, ep, esp, edp, embedding) as NCCL
//     communicators, each on a stream of its own, as rank_groups.cc creates them.
#include <cuda_runtime.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "cuda_test_kernels.h"
#include "fork_world.h"
#include "fused_exchange_cases.h"
#include "gpu_children.h"
#include "gtest/gtest.h"
#include "runtime/comm/comm_watchdog.h"
#include "runtime/comm/commcheck.h"
#include "runtime/comm/file_kv_store.h"
#include "runtime/comm/fused_exchange.h"
#include "runtime/comm/in_flight.h"
#include "runtime/comm/local_communicator.h"
#include "runtime/comm/nccl_stream.h"
#include "runtime/comm/stream_communicator.h"
#include "runtime/device/current_stream.h"
#include "runtime/device/device.h"

namespace furnace::comm {
namespace {

using forked::ChildExit;
using forked::RunForked;
using forked::TempDir;
using SteadyClock = std::chrono::steady_clock;

// One rank on GPU 0: the device, its compute stream (current on the child's thread) and the
// rank's watchdog.
struct GpuRank {
  std::unique_ptr<device::Device> dev;
  std::unique_ptr<device::Stream> compute;
  std::shared_ptr<CommWatchdog> watchdog;

  cudaStream_t native() const { return static_cast<cudaStream_t>(compute->native()); }

  template <typename T>
  T* Alloc(size_t n) {
    auto d = dev->Allocate(std::max<size_t>(n, 1) * sizeof(T));
    return d.ok() ? static_cast<T*>(*d) : nullptr;
  }
  template <typename T>
  T* Upload(const std::vector<T>& host) {
    T* d = Alloc<T>(host.size());
    if (d == nullptr) return nullptr;
    if (!dev->Copy(d, host.data(), host.size() * sizeof(T), device::CopyKind::kHostToDevice,
                   *compute)
             .ok() ||
        !dev->SynchronizeStream(*compute).ok()) {
      return nullptr;
    }
    return d;
  }
  template <typename T>
  std::vector<T> Download(const T* d, size_t n) {
    std::vector<T> host(n);
    if (!dev->Copy(host.data(), d, n * sizeof(T), device::CopyKind::kDeviceToHost, *compute).ok() ||
        !dev->SynchronizeStream(*compute).ok()) {
      return {};
    }
    return host;
  }
};

absl::StatusOr<std::unique_ptr<GpuRank>> MakeGpuRank(double watchdog_timeout_s) {
  auto rank = std::make_unique<GpuRank>();
  auto dev = device::CreateCudaDevice(0);
  if (!dev.ok()) return dev.status();
  rank->dev = std::move(*dev);
  if (const cudaError_t e = test_kernels::Preload(); e != cudaSuccess) {
    return absl::InternalError(absl::StrCat("test kernels: ", cudaGetErrorString(e)));
  }
  auto compute = rank->dev->CreateStream();
  if (!compute.ok()) return compute.status();
  rank->compute = std::move(*compute);
  auto watchdog = CommWatchdog::Create({.timeout_s = watchdog_timeout_s});
  if (!watchdog.ok()) return watchdog.status();
  rank->watchdog = std::move(*watchdog);
  return rank;
}

absl::StatusOr<std::unique_ptr<StreamCommunicator>> Group(KvStore& store, GpuRank& rank,
                                                          const std::string& name, int member = 0,
                                                          int size = 1, double timeout_s = 60) {
  auto made = CreateNcclStreamCommunicator(store, name, name, member, size, *rank.dev,
                                           rank.watchdog, {.timeout_s = timeout_s});
  if (!made.ok()) return made.status();
  auto* comm = dynamic_cast<StreamCommunicator*>(made->get());
  if (comm == nullptr) return absl::InternalError("not a StreamCommunicator");
  made->release();
  return std::unique_ptr<StreamCommunicator>(comm);
}

bool Eventually(const std::function<bool()>& done, double seconds) {
  const auto deadline = SteadyClock::now() + std::chrono::duration_cast<SteadyClock::duration>(
                                                 std::chrono::duration<double>(seconds));
  while (!done()) {
    if (SteadyClock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

std::vector<float> Floats(int64_t n, float scale) {
  std::vector<float> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = scale * static_cast<float>(i % 113) + 0.25f;
  return v;
}
std::vector<int32_t> Pattern(int64_t n, int32_t base) {
  std::vector<int32_t> v(n);
  for (int64_t j = 0; j < n; ++j) v[j] = base + static_cast<int32_t>(j);
  return v;
}

void RunChild(const std::function<int(const std::string& dir)>& body, double deadline_s = 120) {
  TempDir dir("furnace_stream_nccl_");
  ASSERT_FALSE(dir.path().empty());
  for (const ChildExit& exit : RunForked(
           1, [&](int) { return body(dir.path()); }, deadline_s)) {
    EXPECT_TRUE(exit.ok()) << exit.Describe();
  }
}

int EveryCollectiveChild(const std::string& dir) {
  auto made = MakeGpuRank(60);
  CHILD_OK(0, made.status());
  GpuRank& me = **made;
  const device::StreamScope scope(*me.compute);
  FileKvStore store(dir);
  auto group = Group(store, me, "solo[0]");
  CHILD_OK(0, group.status());
  StreamCommunicator& comm = **group;
  LocalGroup twin(1, {.name = "solo[0]/host"});
  std::unique_ptr<Communicator> host = twin.Member(0);

  const int64_t n = 10007;
  const std::vector<float> ar = Floats(n, 0.37f);
  float* d_ar = me.Upload(ar);
  CHILD_CHECK(0, d_ar != nullptr);
  CHILD_OK(0, comm.AllReduce(d_ar, n));
  std::vector<float> ar_want = ar;
  CHILD_OK(0, host->AllReduce(ar_want.data(), n));
  CHILD_CHECK(0, me.Download(d_ar, n) == ar_want);

  float* d_rs = me.Alloc<float>(n);
  CHILD_OK(0, comm.ReduceScatter(d_ar, d_rs, n));
  std::vector<float> rs_want(n);
  CHILD_OK(0, host->ReduceScatter(ar_want.data(), rs_want.data(), n));
  CHILD_CHECK(0, me.Download(d_rs, n) == rs_want);
  CHILD_OK(0, comm.ReduceScatterV(d_ar, d_rs, {n}));
  CHILD_OK(0, host->ReduceScatterV(ar_want.data(), rs_want.data(), {n}));
  CHILD_CHECK(0, me.Download(d_rs, n) == rs_want);

  const std::vector<int32_t> words = Pattern(777, 1 << 20);
  int32_t* d_words = me.Upload(words);
  int32_t* d_gathered = me.Alloc<int32_t>(777);
  CHILD_OK(0, comm.AllGather(d_words, d_gathered, 777 * 4));
  std::vector<int32_t> gathered(777);
  CHILD_OK(0, host->AllGather(words.data(), gathered.data(), 777 * 4));
  CHILD_CHECK(0, me.Download(d_gathered, 777) == gathered);
  CHILD_OK(0, comm.AllGatherV(d_words, 400, d_gathered, {400}));
  CHILD_CHECK(
      0, me.Download(d_gathered, 100) == std::vector<int32_t>(words.begin(), words.begin() + 100));
  CHILD_OK(0, host->AllGatherV(words.data(), 400, gathered.data(), {400}));
  int32_t* d_a2a = me.Upload(Pattern(777, -5));
  CHILD_OK(0, comm.AllToAllV(d_words, {777 * 4}, d_a2a, {777 * 4}));
  std::vector<int32_t> a2a(777);
  CHILD_OK(0, host->AllToAllV(words.data(), {777 * 4}, a2a.data(), {777 * 4}));
  CHILD_CHECK(0, me.Download(d_a2a, 777) == a2a);
  CHILD_OK(0, comm.Broadcast(d_words, 777 * 4, 0));
  std::vector<int32_t> bc = words;
  CHILD_OK(0, host->Broadcast(bc.data(), 777 * 4, 0));
  CHILD_CHECK(0, me.Download(d_words, 777) == bc);
  int32_t* d_recv = me.Upload(Pattern(777, -9));
  CHILD_OK(0, comm.Send(d_words, 777 * 4, 0, 1));
  CHILD_OK(0, comm.Recv(d_recv, 777 * 4, 0, 1));
  CHILD_OK(0, comm.WaitSends());
  CHILD_OK(0, host->Send(words.data(), 777 * 4, 0, 1));
  std::vector<int32_t> received(777);
  CHILD_OK(0, host->Recv(received.data(), 777 * 4, 0, 1));
  CHILD_CHECK(0, me.Download(d_recv, 777) == received);
  CHILD_OK(0, comm.Barrier());
  CHILD_OK(0, host->Barrier());

  // Host arguments: a scalar all-reduce, counts exchanged, a mix of host and device buffers.
  std::vector<float> loss = {2.5f, -1.0f};
  CHILD_OK(0, comm.AllReduce(loss.data(), 2));
  std::vector<float> loss_want = {2.5f, -1.0f};
  CHILD_OK(0, host->AllReduce(loss_want.data(), 2));
  CHILD_CHECK(0, loss == loss_want);
  std::vector<int64_t> counts = {42}, got_counts = {0};
  CHILD_OK(0, comm.AllToAllV(counts.data(), {8}, got_counts.data(), {8}));
  CHILD_OK(0, host->AllToAllV(counts.data(), {8}, counts.data(), {8}));
  CHILD_CHECK(0, got_counts == counts);
  std::vector<int32_t> back(777);
  CHILD_OK(0, comm.AllGather(d_gathered, back.data(), 777 * 4));
  CHILD_OK(0, host->AllGather(gathered.data(), gathered.data(), 777 * 4));
  CHILD_CHECK(0, back == me.Download(d_gathered, 777));

  CHILD_CHECK(0, Eventually([&] { return me.watchdog->outstanding() == 0; }, 30));
  for (int op = 0; op < kNumCollectiveOps; ++op) {
    const auto o = static_cast<CollectiveOp>(op);
    if (comm.counters().bytes(o) != host->counters().bytes(o) ||
        comm.counters().calls(o) != host->counters().calls(o) ||
        comm.stream_counters().calls(o) != comm.counters().calls(o)) {
      std::fprintf(stderr, "%s: bytes %lld vs host %lld, calls %lld vs host %lld, stream %lld\n",
                   CollectiveOpName(o), static_cast<long long>(comm.counters().bytes(o)),
                   static_cast<long long>(host->counters().bytes(o)),
                   static_cast<long long>(comm.counters().calls(o)),
                   static_cast<long long>(host->counters().calls(o)),
                   static_cast<long long>(comm.stream_counters().calls(o)));
      return 1;
    }
  }
  std::fprintf(stderr, "stream time of %lld all_reduce calls: %.6f s (host: %.6f s)\n",
               static_cast<long long>(comm.stream_counters().calls(CollectiveOp::kAllReduce)),
               comm.stream_counters().seconds(CollectiveOp::kAllReduce),
               comm.counters().seconds(CollectiveOp::kAllReduce));
  CHILD_OK(0, comm.AsyncError());
  for (void* p : std::vector<void*>{d_ar, d_rs, d_words, d_gathered, d_a2a, d_recv}) {
    me.dev->Free(p);
  }
  return 0;
}

TEST(StreamCommunicatorNcclTest, EveryCollectiveMatchesTheHostResult) {
  SKIP_WITHOUT_GPUS(1);
  RunChild(EveryCollectiveChild);
}

// The commcheck (commcheck.h) on a one-rank NCCL group: every collective's payload uploaded to
// device memory, run on NCCL's stream, timed to its completion and checked by value after the
// download, 4 KiB to 4 MiB. The bandwidths printed are the GPU's own copies (one rank: no link).
int CommcheckChild(const std::string& dir) {
  auto made = MakeGpuRank(60);
  CHILD_OK(0, made.status());
  GpuRank& me = **made;
  const device::StreamScope scope(*me.compute);
  FileKvStore store(dir);
  auto group = Group(store, me, "commcheck[0]");
  CHILD_OK(0, group.status());
  CommcheckOptions options;
  options.min_bytes = 4096;
  options.max_bytes = 4 << 20;
  options.step_factor = 4;
  options.iters = 3;
  int results = 0, unverified = 0;
  const auto report = [&](uint32_t, const CommResult* r, bool) -> absl::Status {
    if (r == nullptr) return absl::OkStatus();
    ++results;
    unverified += r->verified ? 0 : 1;
    std::printf("REPORT commcheck on NCCL (1 rank) %-9s %8llu B %9.1f us algbw %8.2f GB/s %s\n",
                r->collective.c_str(), static_cast<unsigned long long>(r->bytes), r->time_s * 1e6,
                r->algbw_gbps, r->verified ? "OK" : "ERRORS");
    return absl::OkStatus();
  };
  CHILD_OK(0, RunCommcheck(**group, *me.dev, options, report));
  CHILD_CHECK(0, results == 4 * 6 && unverified == 0);
  return 0;
}

TEST(StreamCommunicatorNcclTest, TheCommcheckVerifiesEveryCollectiveOnTheDevice) {
  SKIP_WITHOUT_GPUS(1);
  RunChild(CommcheckChild);
}

// A producer kernel held behind a sleep on the compute stream; the collective, then a consumer
// kernel. With the producer event the fresh input is gathered, without it the stale one.
int OrderingChild(const std::string& dir, bool wait_for_producer) {
  auto made = MakeGpuRank(60);
  CHILD_OK(0, made.status());
  GpuRank& me = **made;
  const device::StreamScope scope(*me.compute);
  FileKvStore store(dir);
  auto group = Group(store, me, "order[0]");
  CHILD_OK(0, group.status());
  StreamCommunicator& comm = **group;
  const int64_t n = 4096;
  int32_t* d_in = me.Upload(Pattern(n, 100));
  int32_t* d_out = me.Upload(Pattern(n, -1));
  int32_t* d_check = me.Upload(Pattern(n, -2));
  CHILD_CHECK(0, d_in != nullptr && d_out != nullptr && d_check != nullptr);
  CHILD_OK(0, comm.AllGather(d_in, d_out, n * 4));  // warm-up: NCCL's first call may set up
  CHILD_CHECK(0, me.Download(d_out, n) == Pattern(n, 100));
  CHILD_CHECK(0, test_kernels::Sleep(200'000'000, me.native()) == cudaSuccess);
  CHILD_CHECK(0, test_kernels::Fill(d_in, n, 5000, me.native()) == cudaSuccess);
  {
    std::unique_ptr<StreamCommunicator::ScopedOrdering> no_wait;
    if (!wait_for_producer) {
      no_wait = std::make_unique<StreamCommunicator::ScopedOrdering>(comm, nullptr, true);
    }
    CHILD_OK(0, comm.AllGather(d_in, d_out, n * 4));
  }
  CHILD_CHECK(0, test_kernels::Copy(d_check, d_out, n, me.native()) == cudaSuccess);
  const std::vector<int32_t> got = me.Download(d_check, n);
  CHILD_CHECK(0, got == Pattern(n, wait_for_producer ? 5000 : 100));
  for (int32_t* p : {d_in, d_out, d_check}) me.dev->Free(p);
  return 0;
}

TEST(StreamCommunicatorNcclTest, TheCollectiveIsOrderedBetweenKernelsByEvents) {
  SKIP_WITHOUT_GPUS(1);
  RunChild([](const std::string& dir) { return OrderingChild(dir, true); });
  RunChild([](const std::string& dir) { return OrderingChild(dir, false); });
}

// The compute stream is held by a kernel spinning on a host flag; the all-reduce after it cannot
// complete. The watchdog (1 s) aborts both groups of the rank; later calls fail fast.
int WatchdogChild(const std::string& dir) {
  auto made = MakeGpuRank(1.0);
  CHILD_OK(0, made.status());
  GpuRank& me = **made;
  const device::StreamScope scope(*me.compute);
  FileKvStore store(dir);
  auto dp = Group(store, me, "dp[0]");
  CHILD_OK(0, dp.status());
  auto tp = Group(store, me, "tp[0]");
  CHILD_OK(0, tp.status());
  float* d = me.Upload(Floats(16, 1.0f));
  CHILD_CHECK(0, d != nullptr);
  CHILD_OK(0, (*dp)->AllReduce(d, 16));
  CHILD_CHECK(0, me.Download(d, 16).size() == 16);
  int* flag = nullptr;
  CHILD_CHECK(0, cudaHostAlloc(reinterpret_cast<void**>(&flag), sizeof(int), cudaHostAllocMapped) ==
                     cudaSuccess);
  *reinterpret_cast<volatile int*>(flag) = 0;
  int* d_flag = nullptr;
  CHILD_CHECK(0,
              cudaHostGetDevicePointer(reinterpret_cast<void**>(&d_flag), flag, 0) == cudaSuccess);
  CHILD_CHECK(0, test_kernels::SpinUntil(d_flag, 60'000'000'000LL, me.native()) == cudaSuccess);
  const SteadyClock::time_point start = SteadyClock::now();
  CHILD_OK(0, (*dp)->AllReduce(d, 16));  // enqueued behind the spinning kernel
  const auto call = ProcessInFlight().Oldest();
  CHILD_CHECK(0, call.has_value() && call->op == "all_reduce" && call->group == "dp[0]");
  CHILD_CHECK(0, !call->started);  // queued behind the spinning kernel, not waiting on peers
  CHILD_CHECK(0, Eventually([&] { return !(*dp)->AsyncError().ok(); }, 30));
  const double took = std::chrono::duration<double>(SteadyClock::now() - start).count();
  const absl::Status error = (*dp)->AsyncError();
  std::fprintf(stderr, "after %.3f s: %s\n", took, error.ToString().c_str());
  CHILD_CHECK(0, absl::IsDeadlineExceeded(error));
  CHILD_CHECK(0, absl::StrContains(error.message(),
                                   "all_reduce on dp[0] (1 rank) not started (queued behind this "
                                   "rank's own device work"));
  CHILD_CHECK(0, took >= 1.0);
  // Release the stream (ncclCommAbort may wait for the device), then the rest of the rank.
  *reinterpret_cast<volatile int*>(flag) = 1;
  CHILD_CHECK(0, Eventually([&] { return (*tp)->AsyncError() == error; }, 60));
  CHILD_CHECK(0, Eventually([&] { return !(*dp)->transport().AsyncError().ok(); }, 60));
  const SteadyClock::time_point again = SteadyClock::now();
  CHILD_CHECK(0, (*dp)->AllReduce(d, 16) == error);
  CHILD_CHECK(0, (*tp)->Barrier() == error);
  CHILD_CHECK(0, std::chrono::duration<double>(SteadyClock::now() - again).count() < 1.0);
  // What the stream still runs after the abort is NCCL's business; the rank exits after this.
  cudaStreamSynchronize(me.native());
  return 0;
}

TEST(StreamCommunicatorNcclTest, TheWatchdogAbortsACollectiveThatCannotComplete) {
  SKIP_WITHOUT_GPUS(1);
  RunChild(WatchdogChild);
}

// Rank 1 of the pair never joins: rank 0's creation fails within its timeout.
int PeerNeverJoinsChild(const std::string& dir) {
  auto made = MakeGpuRank(60);
  CHILD_OK(0, made.status());
  FileKvStore store(dir);
  const SteadyClock::time_point start = SteadyClock::now();
  auto pair = Group(store, **made, "pair[0,1]", 0, 2, /*timeout_s=*/3);
  const double took = std::chrono::duration<double>(SteadyClock::now() - start).count();
  std::fprintf(stderr, "after %.3f s: %s\n", took, pair.status().ToString().c_str());
  CHILD_CHECK(0, absl::IsDeadlineExceeded(pair.status()));
  CHILD_CHECK(0, absl::StrContains(pair.status().message(), "did not join"));
  CHILD_CHECK(0, took < 30);
  return 0;
}

TEST(StreamCommunicatorNcclTest, ACommunicatorWhosePeerNeverJoinsTimesOut) {
  SKIP_WITHOUT_GPUS(1);
  RunChild(PeerNeverJoinsChild);
}

// The fused all-to-all + all-gather on two NCCL communicators (one rank each: the self chunk and
// the all-gather, on two streams), against the closed form.
int FusedChild(const std::string& dir) {
  auto made = MakeGpuRank(60);
  CHILD_OK(0, made.status());
  GpuRank& me = **made;
  const device::StreamScope scope(*me.compute);
  FileKvStore store(dir);
  auto a2a = Group(store, me, "a2a[0]");
  CHILD_OK(0, a2a.status());
  auto ag = Group(store, me, "ag[0]");
  CHILD_OK(0, ag.status());
  FusedLayout layout;
  layout.send_bytes = {100000};
  layout.chunk_bytes = {{100000}};
  layout.chunk_offset = {{64}};
  const int64_t out_bytes = 100000 + 200;
  std::vector<uint8_t> in(100000);
  for (size_t k = 0; k < in.size(); ++k) in[k] = fused_cases::Byte(0, 0, static_cast<int64_t>(k));
  std::vector<uint8_t> want(out_bytes, fused_cases::kSentinel);
  std::memcpy(want.data() + 64, in.data(), in.size());
  uint8_t* d_in = me.Upload(in);
  uint8_t* d_out = me.Upload(std::vector<uint8_t>(out_bytes, fused_cases::kSentinel));
  CHILD_CHECK(0, d_in != nullptr && d_out != nullptr);
  for (int call = 0; call < 2; ++call) {
    CHILD_OK(0, FusedAllToAllAllGather(**a2a, **ag, d_in, d_out, out_bytes, layout));
    CHILD_CHECK(0, me.Download(d_out, out_bytes) == want);
  }
  CHILD_CHECK(0, (*ag)->counters().calls(CollectiveOp::kAllGather) == 2);
  CHILD_CHECK(0, (*ag)->counters().bytes(CollectiveOp::kAllGather) == 200000);
  CHILD_CHECK(0, (*a2a)->counters().calls(CollectiveOp::kSend) == 0);
  me.dev->Free(d_in);
  me.dev->Free(d_out);
  return 0;
}

TEST(StreamCommunicatorNcclTest, TheFusedExchangeRunsOnTwoNcclCommunicators) {
  SKIP_WITHOUT_GPUS(1);
  RunChild(FusedChild);
}

// Every group of a train rank on one GPU: eight NCCL communicators, each its own stream, created
// in BuildRankLayout's order under the prefixes it uses, each running an all-reduce.
int EveryGroupChild(const std::string& dir) {
  auto made = MakeGpuRank(60);
  CHILD_OK(0, made.status());
  GpuRank& me = **made;
  const device::StreamScope scope(*me.compute);
  FileKvStore store(dir);
  std::vector<std::unique_ptr<Communicator>> groups;
  std::set<void*> streams;
  for (const char* kind : {"world", "tp", "dp", "pp", "ep", "esp", "edp", "embedding"}) {
    auto made_group =
        CreateNcclStreamCommunicator(store, absl::StrCat(kind, "/0"), absl::StrCat(kind, "[0]"), 0,
                                     1, *me.dev, me.watchdog, {.timeout_s = 60});
    CHILD_OK(0, made_group.status());
    auto* sc = dynamic_cast<StreamCommunicator*>(made_group->get());
    CHILD_CHECK(0, sc != nullptr);
    streams.insert(sc->stream().native());
    groups.push_back(std::move(*made_group));
  }
  CHILD_CHECK(0, streams.size() == 8);
  for (size_t g = 0; g < groups.size(); ++g) {
    const std::vector<float> v = Floats(1000, static_cast<float>(g + 1));
    float* d = me.Upload(v);
    CHILD_CHECK(0, d != nullptr);
    CHILD_OK(0, groups[g]->AllReduce(d, 1000));
    CHILD_CHECK(0, me.Download(d, 1000) == v);
    me.dev->Free(d);
  }
  return 0;
}

TEST(StreamCommunicatorNcclTest, EveryGroupOfATrainRankGetsItsOwnNcclCommunicatorAndStream) {
  SKIP_WITHOUT_GPUS(1);
  RunChild(EveryGroupChild);
}

}  // namespace
}  // namespace furnace::comm
