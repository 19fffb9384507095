// Test helpers: ranks on the emulated discrete device with stream-ordered communicators. Each
// EmulatedRank has its own device (memory the host cannot read), a compute stream (the thread's
// current stream while its body runs) and a watchdog; Connect makes a StreamCommunicator over the
// emulated device's transport (emulated_transport.h) around a host communicator, on a
// communication stream of its own, as rank_groups.cc does with NCCL on a GPU.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "runtime/comm/comm_watchdog.h"
#include "runtime/comm/emulated_transport.h"
#include "runtime/comm/stream_communicator.h"
#include "runtime/device/current_stream.h"
#include "runtime/device/emulated_device.h"

namespace furnace::comm::emulated_ranks {

struct EmulatedRank {
  std::unique_ptr<device::EmulatedDevice> dev;
  std::unique_ptr<device::Stream> compute;
  std::shared_ptr<CommWatchdog> watchdog;

  // Device memory for n elements (not initialised).
  template <typename T>
  T* Alloc(size_t n) {
    auto d = dev->Allocate(std::max<size_t>(n, 1) * sizeof(T));
    EXPECT_TRUE(d.ok()) << d.status();
    return d.ok() ? static_cast<T*>(*d) : nullptr;
  }
  // Enqueues host -> d on the compute stream; `host` must stay alive until the stream runs it.
  template <typename T>
  void Put(T* d, const std::vector<T>& host) {
    ASSERT_TRUE(dev->Copy(d, host.data(), host.size() * sizeof(T), device::CopyKind::kHostToDevice,
                          *compute)
                    .ok());
  }
  // Put, then waits for the compute stream (the host vector may be a temporary).
  template <typename T>
  T* Upload(const std::vector<T>& host) {
    T* d = Alloc<T>(host.size());
    Put(d, host);
    EXPECT_TRUE(dev->SynchronizeStream(*compute).ok());
    return d;
  }
  // d -> host in the compute stream's order, then waits for it.
  template <typename T>
  std::vector<T> Get(const T* d, size_t n) {
    std::vector<T> host(n);
    EXPECT_TRUE(
        dev->Copy(host.data(), d, n * sizeof(T), device::CopyKind::kDeviceToHost, *compute).ok());
    EXPECT_TRUE(dev->SynchronizeStream(*compute).ok());
    return host;
  }
};

inline std::unique_ptr<EmulatedRank> MakeRank(CommWatchdogOptions watch = {}) {
  auto rank = std::make_unique<EmulatedRank>();
  auto dev = device::CreateEmulatedDevice({.memory_bytes = 16 << 20});
  EXPECT_TRUE(dev.ok()) << dev.status();
  rank->dev = std::move(*dev);
  auto compute = rank->dev->CreateStream();
  EXPECT_TRUE(compute.ok());
  rank->compute = std::move(*compute);
  auto watchdog = CommWatchdog::Create(watch);
  EXPECT_TRUE(watchdog.ok()) << watchdog.status();
  rank->watchdog = std::move(*watchdog);
  return rank;
}

// A StreamCommunicator of `rank` over the emulated transport around `host` (e.g. a LocalGroup
// member). `watchdog`: the rank's when null.
inline std::unique_ptr<StreamCommunicator> Connect(EmulatedRank& rank,
                                                   std::unique_ptr<Communicator> host,
                                                   std::shared_ptr<CommWatchdog> watchdog = nullptr,
                                                   double transport_timeout_s = 30) {
  auto stream = rank.dev->CreateStream();
  EXPECT_TRUE(stream.ok());
  auto transport = CreateEmulatedTransport(std::move(host), *rank.dev, **stream,
                                           {.timeout_s = transport_timeout_s});
  EXPECT_TRUE(transport.ok()) << transport.status();
  auto comm = StreamCommunicator::Create(std::move(*transport), std::move(*stream), *rank.dev,
                                         watchdog != nullptr ? watchdog : rank.watchdog);
  EXPECT_TRUE(comm.ok()) << comm.status();
  return comm.ok() ? std::move(*comm) : nullptr;
}

// Runs body(r) on one thread per rank, each with its rank's compute stream current.
inline void RunRanks(std::vector<std::unique_ptr<EmulatedRank>>& ranks,
                     const std::function<void(int)>& body) {
  std::vector<std::thread> threads;
  for (size_t r = 0; r < ranks.size(); ++r) {
    threads.emplace_back([&, r] {
      const device::StreamScope scope(*ranks[r]->compute);
      body(static_cast<int>(r));
    });
  }
  for (std::thread& t : threads) t.join();
}

// Polls `done` every millisecond for at most `seconds`; whether it became true.
inline bool Eventually(const std::function<bool()>& done, double seconds = 10) {
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                            std::chrono::duration<double>(seconds));
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

}  // namespace furnace::comm::emulated_ranks
