// StagedCommunicator: ranks on emulated discrete devices (memory the host cannot read) running
// every collective over the in-process fake, with device buffers, host buffers and a mix; each
// result must equal the same collective on host buffers bit for bit, the byte counters must be the
// transport's, and a buffer produced by a kernel still queued on the rank's stream must be read
// after that kernel (the staging copy is ordered on the calling thread's current stream).
#include "runtime/comm/device_staging.h"

#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <numeric>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "runtime/comm/local_communicator.h"
#include "runtime/device/backend.h"
#include "runtime/device/current_stream.h"
#include "runtime/device/emulated_device.h"

namespace furnace::comm {
namespace {

using device::CopyKind;

// One rank: its emulated device, a compute stream set as the thread's current stream, and a
// staged member of the group.
struct Rank {
  std::unique_ptr<device::EmulatedDevice> dev;
  std::unique_ptr<device::Stream> stream;
  std::unique_ptr<Communicator> comm;

  template <typename T>
  T* Upload(const std::vector<T>& host) {
    auto d = dev->Allocate(host.size() * sizeof(T));
    EXPECT_TRUE(d.ok());
    EXPECT_TRUE(
        dev->Copy(*d, host.data(), host.size() * sizeof(T), CopyKind::kHostToDevice, *stream).ok());
    // The copy reads `host` when the stream gets there: wait, since it may be a temporary.
    EXPECT_TRUE(dev->SynchronizeStream(*stream).ok());
    return static_cast<T*>(*d);
  }
  template <typename T>
  std::vector<T> Download(const T* d, size_t n) {
    std::vector<T> host(n);
    EXPECT_TRUE(dev->Copy(host.data(), d, n * sizeof(T), CopyKind::kDeviceToHost, *stream).ok());
    EXPECT_TRUE(dev->SynchronizeStream(*stream).ok());
    return host;
  }
};

// Runs body(rank) on n threads, each with its own device and its stream current.
void RunRanks(int n, const std::function<void(Rank&)>& body) {
  LocalGroup group(n, {.name = "g[staged]"});
  std::vector<Rank> ranks(n);
  for (int r = 0; r < n; ++r) {
    auto dev = device::CreateEmulatedDevice({.memory_bytes = 8 << 20});
    ASSERT_TRUE(dev.ok());
    ranks[r].dev = std::move(*dev);
    auto s = ranks[r].dev->CreateStream();
    ASSERT_TRUE(s.ok());
    ranks[r].stream = std::move(*s);
    ranks[r].comm = ForDevice(group.Member(r), *ranks[r].dev);
    ASSERT_NE(dynamic_cast<StagedCommunicator*>(ranks[r].comm.get()), nullptr);
  }
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      device::StreamScope scope(*ranks[r].stream);
      body(ranks[r]);
    });
  }
  for (std::thread& t : threads) t.join();
}

float Value(int rank, int64_t i) {
  return static_cast<float>(rank + 1) * 0.37f + static_cast<float>(i % 101) * 1e-3f +
         (rank % 2 == 0 ? 1e4f : 0.0f);
}

std::vector<float> Values(int rank, int64_t n) {
  std::vector<float> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = Value(rank, i);
  return v;
}

TEST(StagedCommunicatorTest, TheCpuDeviceNeedsNoStaging) {
  LocalGroup group(1);
  std::unique_ptr<device::Device> cpu = device::CreateCpuDevice();
  std::unique_ptr<Communicator> c = ForDevice(group.Member(0), *cpu);
  EXPECT_EQ(dynamic_cast<StagedCommunicator*>(c.get()), nullptr);
}

TEST(StagedCommunicatorTest, AllReduceOfDeviceAndHostBuffersMatchesTheHostRun) {
  constexpr int kRanks = 3;
  constexpr int64_t kN = 1000;
  std::vector<float> want(kN);
  for (int64_t i = 0; i < kN; ++i) {
    float acc = Value(0, i);
    for (int r = 1; r < kRanks; ++r) acc += Value(r, i);
    want[i] = acc;
  }
  RunRanks(kRanks, [&](Rank& r) {
    float* d = r.Upload(Values(r.comm->rank(), kN));
    ASSERT_TRUE(r.comm->AllReduce(d, kN).ok());
    EXPECT_EQ(r.Download(d, kN), want);
    std::vector<float> host = Values(r.comm->rank(), kN);
    ASSERT_TRUE(r.comm->AllReduce(host.data(), kN).ok());  // host memory passes straight through
    EXPECT_EQ(host, want);
    EXPECT_EQ(r.comm->counters().bytes(CollectiveOp::kAllReduce), 2 * kN * 4);
    EXPECT_EQ(r.comm->counters().calls(CollectiveOp::kAllReduce), 2);
    r.dev->Free(d);
  });
}

// A staging step that fails (here the copy into staging of more bytes than the device holds)
// aborts the transport: the peer waiting in the collective fails at once (not after its timeout),
// and this rank's later calls fail fast with the sticky error instead of running a collective the
// peers are not in.
TEST(StagedCommunicatorTest, AFailedStagingAbortsTheTransport) {
  RunRanks(2, [&](Rank& r) {
    float* d = r.Upload(Values(r.comm->rank(), 100));
    const absl::Status s = r.comm->AllReduce(d, r.comm->rank() == 0 ? 1 << 22 : 100);
    EXPECT_FALSE(s.ok());
    if (r.comm->rank() == 0) {
      EXPECT_FALSE(r.comm->AsyncError().ok());
      EXPECT_NE(r.comm->AsyncError().message().find("staging on"), std::string::npos)
          << r.comm->AsyncError();
      EXPECT_FALSE(r.comm->Barrier().ok());
    }
    r.dev->Free(d);
  });
}

TEST(StagedCommunicatorTest, AllToAllVAllGatherVAndReduceScatterVMoveDeviceBytes) {
  constexpr int kRanks = 3;
  RunRanks(kRanks, [&](Rank& r) {
    const int me = r.comm->rank();
    // Rank s sends (s + d + 1) bytes of value 16 s + d to rank d.
    std::vector<int64_t> send(kRanks), recv(kRanks);
    std::vector<uint8_t> in;
    for (int d = 0; d < kRanks; ++d) {
      send[d] = me + d + 1;
      recv[d] = d + me + 1;
      in.insert(in.end(), send[d], static_cast<uint8_t>(16 * me + d));
    }
    const int64_t total_recv = std::accumulate(recv.begin(), recv.end(), int64_t{0});
    uint8_t* din = r.Upload(in);
    uint8_t* dout = r.Upload(std::vector<uint8_t>(total_recv, 0xEE));
    ASSERT_TRUE(r.comm->AllToAllV(din, send, dout, recv).ok());
    std::vector<uint8_t> got = r.Download(dout, total_recv), expect;
    for (int s = 0; s < kRanks; ++s) expect.insert(expect.end(), recv[s], 16 * s + me);
    EXPECT_EQ(got, expect);

    // AllGatherV: rank s contributes s + 2 floats of value s; the output is a host buffer.
    std::vector<int64_t> sizes;
    for (int s = 0; s < kRanks; ++s) sizes.push_back(4 * (s + 2));
    float* mine = r.Upload(std::vector<float>(me + 2, static_cast<float>(me)));
    std::vector<float> gathered(std::accumulate(sizes.begin(), sizes.end(), int64_t{0}) / 4);
    ASSERT_TRUE(r.comm->AllGatherV(mine, sizes[me], gathered.data(), sizes).ok());
    std::vector<float> expect_g;
    for (int s = 0; s < kRanks; ++s) expect_g.insert(expect_g.end(), s + 2, static_cast<float>(s));
    EXPECT_EQ(gathered, expect_g);

    // ReduceScatterV of device memory into device memory.
    const std::vector<int64_t> counts = {2, 0, 5};
    float* rin = r.Upload(Values(me, 7));
    float* rout = r.Upload(std::vector<float>(std::max<int64_t>(counts[me], 1), -1.0f));
    ASSERT_TRUE(r.comm->ReduceScatterV(rin, rout, counts).ok());
    const int64_t first = me == 0 ? 0 : (me == 1 ? 2 : 2);
    std::vector<float> got_rs = r.Download(rout, counts[me]), expect_rs;
    for (int64_t i = 0; i < counts[me]; ++i) {
      float acc = Value(0, first + i);
      for (int s = 1; s < kRanks; ++s) acc += Value(s, first + i);
      expect_rs.push_back(acc);
    }
    EXPECT_EQ(got_rs, expect_rs);
    for (void* p : {static_cast<void*>(din), static_cast<void*>(dout), static_cast<void*>(mine),
                    static_cast<void*>(rin), static_cast<void*>(rout)}) {
      r.dev->Free(p);
    }
  });
}

TEST(StagedCommunicatorTest, SendRecvAndBroadcastOfDeviceBuffers) {
  RunRanks(2, [&](Rank& r) {
    const int me = r.comm->rank();
    std::vector<float> payload = Values(7, 64);
    if (me == 0) {
      float* d = r.Upload(payload);
      ASSERT_TRUE(r.comm->Send(d, 64 * 4, 1, 3).ok());
      ASSERT_TRUE(r.comm->WaitSends().ok());
      r.dev->Free(d);
    } else {
      float* d = r.Upload(std::vector<float>(64, 0.0f));
      ASSERT_TRUE(r.comm->Recv(d, 64 * 4, 0, 3).ok());
      EXPECT_EQ(r.Download(d, 64), payload);
      r.dev->Free(d);
    }
    float* b = r.Upload(me == 1 ? payload : std::vector<float>(64, 0.0f));
    ASSERT_TRUE(r.comm->Broadcast(b, 64 * 4, 1).ok());
    EXPECT_EQ(r.Download(b, 64), payload);
    r.dev->Free(b);
  });
}

// The staging copy runs on the calling thread's current stream, behind the kernel that produces
// the buffer: with the stream held, the kernel has not run when the collective is called, and the
// reduced value must still be the kernel's output, not the bytes that were there before.
TEST(StagedCommunicatorTest, ReadsADeviceBufferAfterTheKernelQueuedBeforeIt) {
  RunRanks(2, [&](Rank& r) {
    float* d = r.Upload(std::vector<float>(16, 1.0f));
    ASSERT_TRUE(r.dev->SynchronizeStream(*r.stream).ok());
    ASSERT_TRUE(r.dev->PauseStream(*r.stream).ok());
    device::EmulatedBackend().scale(d, 3.0f, 16);  // enqueued on the held stream
    std::thread resume([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      ASSERT_TRUE(r.dev->ResumeStream(*r.stream).ok());
    });
    ASSERT_TRUE(r.comm->AllReduce(d, 16).ok());
    resume.join();
    EXPECT_EQ(r.Download(d, 16), std::vector<float>(16, 6.0f));
    r.dev->Free(d);
  });
}

}  // namespace
}  // namespace furnace::comm
