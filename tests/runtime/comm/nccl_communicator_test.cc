// NcclCommunicator on real GPUs, one fork()ed process per rank (rank r on device r), rendezvous
// through a FileKvStore. Skips itself where no GPU is present. The parent never touches CUDA
// (a CUDA context does not survive fork): it learns the GPU count from a probe child.
//
// One GPU allows only a group of one (NCCL refuses two ranks on one device); the multi-rank test
// needs two GPUs or more and uses up to four.
#include "runtime/comm/nccl_communicator.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "fork_world.h"
#include "gpu_children.h"
#include "gtest/gtest.h"
#include "runtime/comm/file_kv_store.h"

namespace furnace::comm {
namespace {

using forked::ChildExit;
using forked::RunForked;
using forked::TempDir;

using forked::ProbeGpuCount;

// Device buffer holding a copy of a host vector; Read() copies it back (synchronising).
template <typename T>
class DeviceVector {
 public:
  explicit DeviceVector(const std::vector<T>& host) : size_(host.size()) {
    cudaMalloc(&ptr_, std::max<size_t>(1, size_ * sizeof(T)));
    if (size_ > 0) cudaMemcpy(ptr_, host.data(), size_ * sizeof(T), cudaMemcpyHostToDevice);
  }
  ~DeviceVector() { cudaFree(ptr_); }
  T* get() { return static_cast<T*>(ptr_); }
  std::vector<T> Read(cudaStream_t stream) const {
    cudaStreamSynchronize(stream);
    std::vector<T> host(size_);
    if (size_ > 0) cudaMemcpy(host.data(), ptr_, size_ * sizeof(T), cudaMemcpyDeviceToHost);
    return host;
  }

 private:
  void* ptr_ = nullptr;
  size_t size_;
};

float ExactValue(int sender, int dest, int64_t i) {
  return static_cast<float>(sender * 1000 + dest * 100 + i % 97);
}
int32_t WordValue(int sender, int dest, int64_t j) {
  return (sender << 24) | (dest << 16) | static_cast<int32_t>(j & 0xffff);
}

int NcclChild(const std::string& dir, int world, int rank) {
  CHILD_CHECK(rank, cudaSetDevice(rank) == cudaSuccess);
  cudaStream_t stream = nullptr;
  CHILD_CHECK(rank, cudaStreamCreate(&stream) == cudaSuccess);
  FileKvStore store(dir);
  NcclOptions options;
  options.device = rank;
  options.stream = stream;
  options.timeout_s = 60;
  absl::StatusOr<std::unique_ptr<Communicator>> made = CreateNcclCommunicator(
      store, "nccl", absl::StrCat("nccl[", world, "]"), rank, world, options);
  CHILD_OK(rank, made.status());
  Communicator& comm = **made;
  std::array<int64_t, kNumCollectiveOps> bytes{};
  auto expect = [&](CollectiveOp op, int64_t b) { bytes[static_cast<int>(op)] += b; };

  // all_reduce
  const int64_t count = 10007;
  std::vector<float> data(count), want(count, 0.0f);
  for (int64_t i = 0; i < count; ++i) data[i] = ExactValue(rank, 0, i);
  for (int r = 0; r < world; ++r) {
    for (int64_t i = 0; i < count; ++i) want[i] += ExactValue(r, 0, i);
  }
  DeviceVector<float> d_data(data);
  CHILD_OK(rank, comm.AllReduce(d_data.get(), count));
  expect(CollectiveOp::kAllReduce, count * 4);
  CHILD_CHECK(rank, d_data.Read(stream) == want);

  // reduce_scatter_v with uneven counts, some zero
  std::vector<int64_t> counts(world);
  for (int r = 0; r < world; ++r) counts[r] = r % 2 == 1 ? 0 : 3 * r + 2;
  std::vector<float> in;
  for (int dst = 0; dst < world; ++dst) {
    for (int64_t i = 0; i < counts[dst]; ++i) in.push_back(ExactValue(rank, dst, i));
  }
  std::vector<float> rs_want(counts[rank], 0.0f);
  for (int s = 0; s < world; ++s) {
    for (int64_t i = 0; i < counts[rank]; ++i) rs_want[i] += ExactValue(s, rank, i);
  }
  DeviceVector<float> d_in(in), d_out(std::vector<float>(counts[rank], -1.0f));
  CHILD_OK(rank, comm.ReduceScatterV(d_in.get(), d_out.get(), counts));
  expect(CollectiveOp::kReduceScatter, static_cast<int64_t>(in.size()) * 4);
  CHILD_CHECK(rank, d_out.Read(stream) == rs_want);

  // all_to_all_v with uneven counts, some zero
  std::vector<int64_t> send_bytes(world), recv_bytes(world);
  std::vector<int32_t> a2a_in, a2a_want;
  for (int peer = 0; peer < world; ++peer) {
    const int64_t out_words = (rank + 2 * peer) % 3 * 50 + (rank == peer);
    const int64_t in_words = (peer + 2 * rank) % 3 * 50 + (rank == peer);
    send_bytes[peer] = out_words * 4;
    recv_bytes[peer] = in_words * 4;
    for (int64_t j = 0; j < out_words; ++j) a2a_in.push_back(WordValue(rank, peer, j));
    for (int64_t j = 0; j < in_words; ++j) a2a_want.push_back(WordValue(peer, rank, j));
  }
  DeviceVector<int32_t> d_a2a_in(a2a_in), d_a2a_out(std::vector<int32_t>(a2a_want.size(), -1));
  CHILD_OK(rank, comm.AllToAllV(d_a2a_in.get(), send_bytes, d_a2a_out.get(), recv_bytes));
  expect(CollectiveOp::kAllToAll, static_cast<int64_t>(a2a_in.size()) * 4);
  CHILD_CHECK(rank, d_a2a_out.Read(stream) == a2a_want);

  // all_gather_v and broadcast from the last rank
  std::vector<int64_t> gather_bytes(world);
  std::vector<int32_t> mine, gathered;
  for (int r = 0; r < world; ++r) {
    gather_bytes[r] = (r % 2) * 12 + 4;
    for (int64_t j = 0; j < gather_bytes[r] / 4; ++j) gathered.push_back(WordValue(r, r, j));
  }
  for (int64_t j = 0; j < gather_bytes[rank] / 4; ++j) mine.push_back(WordValue(rank, rank, j));
  DeviceVector<int32_t> d_mine(mine), d_gathered(std::vector<int32_t>(gathered.size(), -1));
  CHILD_OK(rank, comm.AllGatherV(d_mine.get(), gather_bytes[rank], d_gathered.get(), gather_bytes));
  expect(CollectiveOp::kAllGather, gather_bytes[rank]);
  CHILD_CHECK(rank, d_gathered.Read(stream) == gathered);
  const int root = world - 1;
  std::vector<int32_t> message(333), root_message(333);
  for (int64_t j = 0; j < 333; ++j) {
    root_message[j] = WordValue(root, 0, j);
    message[j] = rank == root ? root_message[j] : -1;
  }
  DeviceVector<int32_t> d_message(message);
  CHILD_OK(rank, comm.Broadcast(d_message.get(), 333 * 4, root));
  expect(CollectiveOp::kBroadcast, 333 * 4);
  CHILD_CHECK(rank, d_message.Read(stream) == root_message);

  // A ring of sends posted before the receives (to itself in a group of one).
  const int next = (rank + 1) % world, prev = (rank + world - 1) % world;
  std::vector<int32_t> ring_out(1000), ring_want(1000);
  for (int64_t j = 0; j < 1000; ++j) {
    ring_out[j] = WordValue(rank, next, j);
    ring_want[j] = WordValue(prev, rank, j);
  }
  DeviceVector<int32_t> d_ring_out(ring_out), d_ring_in(std::vector<int32_t>(1000, -1));
  CHILD_OK(rank, comm.Send(d_ring_out.get(), 4000, next, 1));
  CHILD_OK(rank, comm.Recv(d_ring_in.get(), 4000, prev, 1));
  CHILD_OK(rank, comm.WaitSends());
  expect(CollectiveOp::kSend, 4000);
  expect(CollectiveOp::kRecv, 4000);
  CHILD_CHECK(rank, d_ring_in.Read(stream) == ring_want);

  CHILD_OK(rank, comm.Barrier());
  for (int i = 0; i < kNumCollectiveOps; ++i) {
    CHILD_CHECK(rank, comm.counters().bytes(static_cast<CollectiveOp>(i)) == bytes[i]);
  }
  comm.Abort("test over");
  CHILD_CHECK(rank, absl::IsCancelled(comm.Barrier()));
  CHILD_CHECK(rank, absl::StrContains(comm.AsyncError().message(), "aborted: test over"));
  made->reset();
  cudaStreamDestroy(stream);
  return 0;
}

TEST(NcclCommunicatorTest, GroupOfOneRunsEveryOp) {
  SKIP_WITHOUT_GPUS(1);
  TempDir dir("furnace_nccl_comm_");
  for (const ChildExit& exit :
       RunForked(1, [&](int rank) { return NcclChild(dir.path(), 1, rank); })) {
    EXPECT_TRUE(exit.ok()) << exit.Describe();
  }
}

TEST(NcclCommunicatorTest, EveryOpMatchesTheSerialResultAcrossGpus) {
  SKIP_WITHOUT_GPUS(2);
  const int world = std::min(ProbeGpuCount(), 4);
  TempDir dir("furnace_nccl_comm_");
  for (const ChildExit& exit :
       RunForked(world, [&](int rank) { return NcclChild(dir.path(), world, rank); })) {
    EXPECT_TRUE(exit.ok()) << exit.Describe();
  }
}

}  // namespace
}  // namespace furnace::comm
