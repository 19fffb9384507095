// Test helpers shared by the fused exchange's tests (fused_exchange_test.cc on host threads,
// fused_exchange_stream_test.cc on device streams): topologies of threads as ranks, payloads whose
// bytes encode (sender, receiver, index), layouts drawn from a seed, the closed form of the result
// and the unfused reference, LocalGroups per group, and a communicator with hooks on Recv and
// AllGatherV. Everything is a pure function of (topology, seed), the same on every rank.
#pragma once

#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <numeric>
#include <ostream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "runtime/base/status.h"
#include "runtime/comm/communicator.h"
#include "runtime/comm/fused_exchange.h"
#include "runtime/comm/local_communicator.h"
#include "tests/testing/forwarding_communicator.h"

namespace furnace::comm::fused_cases {

// ---- Topology: W threads (or processes), each a member of one a2a group and one ag group. ----

struct Place {
  int a2a_group = 0, a2a_rank = 0, ag_group = 0, ag_rank = 0;
};

struct Topology {
  std::string name;
  int G = 1;                  // a2a group size
  int n = 1;                  // ag group size
  std::vector<Place> places;  // (W)

  int world() const { return static_cast<int>(places.size()); }
  int a2a_groups() const { return world() / G; }
  int ag_groups() const { return world() / n; }
  int A2aThread(int group, int rank) const {
    for (int t = 0; t < world(); ++t) {
      if (places[t].a2a_group == group && places[t].a2a_rank == rank) return t;
    }
    return -1;
  }
  int AgThread(int group, int rank) const {
    for (int t = 0; t < world(); ++t) {
      if (places[t].ag_group == group && places[t].ag_rank == rank) return t;
    }
    return -1;
  }
};

inline std::ostream& operator<<(std::ostream& os, const Topology& topology) {
  return os << topology.name;
}

// G x n grid: thread t is a2a rank t % G of a2a group t / G and ag rank t / G of ag group t % G
// (the usual layout: a2a inside a node, ag across the nodes at the same position).
inline Topology Grid(int G, int n) {
  Topology topology{absl::StrCat("grid_", G, "x", n), G, n, {}};
  for (int t = 0; t < G * n; ++t) topology.places.push_back({t / G, t % G, t % G, t / G});
  return topology;
}

// Both groups over the same `size` members, the ag ranks in the same or in reversed order.
inline Topology SameMembers(int size, bool reversed) {
  Topology topology{absl::StrCat("same_", size, reversed ? "_reversed" : ""), size, size, {}};
  for (int t = 0; t < size; ++t) topology.places.push_back({0, t, 0, reversed ? size - 1 - t : t});
  return topology;
}

// ---- Sizes, payloads and layouts: pure functions of (topology, seed), the same on every rank. --

inline uint8_t Byte(int sender, int receiver, int64_t k) {
  return static_cast<uint8_t>(sender * 37 + receiver * 11 + k * 3 + (k >> 8) + 1);
}

// sizes[t][j]: bytes thread t sends to a2a rank j of its group. Uneven, with random zeros and
// ones; thread
// 0 sends nothing at all and the last thread receives nothing at all.
inline std::vector<std::vector<int64_t>> Sizes(const Topology& topology, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int64_t> size(1, 300);
  std::uniform_int_distribution<int> coin(0, 3);
  const int W = topology.world(), G = topology.G;
  std::vector<std::vector<int64_t>> sizes(W, std::vector<int64_t>(G));
  for (int t = 0; t < W; ++t) {
    for (int j = 0; j < G; ++j) {
      const int c = coin(rng);
      sizes[t][j] = c == 0 ? 0 : c == 1 ? 1 : size(rng);
    }
  }
  sizes[0].assign(G, 0);
  const Place& last = topology.places[W - 1];
  for (int r = 0; r < G; ++r) sizes[topology.A2aThread(last.a2a_group, r)][last.a2a_rank] = 0;
  return sizes;
}

// Bytes thread t receives in the all-to-all, from each a2a rank of its group.
inline std::vector<int64_t> RecvBytes(const Topology& topology,
                                      const std::vector<std::vector<int64_t>>& sizes, int t) {
  const Place& p = topology.places[t];
  std::vector<int64_t> recv(topology.G);
  for (int r = 0; r < topology.G; ++r)
    recv[r] = sizes[topology.A2aThread(p.a2a_group, r)][p.a2a_rank];
  return recv;
}

// The thread that ag member q of t's ag group received from at its step i.
inline int SourceOf(const Topology& topology, int t, int q, int i) {
  const int u = topology.AgThread(topology.places[t].ag_group, q);
  const Place& pu = topology.places[u];
  return topology.A2aThread(pu.a2a_group, (pu.a2a_rank - i + topology.G) % topology.G);
}

struct Case {
  FusedLayout layout;
  int64_t out_bytes = 0;
  std::vector<uint8_t> in;  // the payload thread t sends
};

// Thread t's layout: the ag group's chunks in an order and with gaps drawn from the group's own
// seed (so every member computes the same offsets), plus a tail the op must not touch.
inline Case MakeCase(const Topology& topology, const std::vector<std::vector<int64_t>>& sizes,
                     uint32_t seed, int t) {
  const int G = topology.G, n = topology.n;
  const Place& p = topology.places[t];
  Case c;
  c.layout.send_bytes = sizes[t];
  c.layout.chunk_bytes.assign(n, std::vector<int64_t>(G));
  c.layout.chunk_offset.assign(n, std::vector<int64_t>(G));
  for (int q = 0; q < n; ++q) {
    const int u = topology.AgThread(p.ag_group, q);
    for (int i = 0; i < G; ++i) {
      c.layout.chunk_bytes[q][i] = sizes[SourceOf(topology, t, q, i)][topology.places[u].a2a_rank];
    }
  }
  std::mt19937 rng(seed * 7919 + static_cast<uint32_t>(p.ag_group) + 1);
  std::vector<int> order(n * G);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);
  std::uniform_int_distribution<int64_t> gap(0, 3);
  int64_t end = gap(rng);
  for (int k : order) {
    c.layout.chunk_offset[k / G][k % G] = end;
    end += c.layout.chunk_bytes[k / G][k % G] + gap(rng);
  }
  c.out_bytes = end + 5;
  for (int j = 0; j < G; ++j) {
    const int receiver = topology.A2aThread(p.a2a_group, j);
    for (int64_t k = 0; k < sizes[t][j]; ++k) c.in.push_back(Byte(t, receiver, k));
  }
  return c;
}

inline constexpr uint8_t kSentinel = 0xEE;

// What `out` must hold, from the payload formula alone.
inline std::vector<uint8_t> ClosedForm(const Topology& topology, const Case& c, int t) {
  std::vector<uint8_t> want(c.out_bytes, kSentinel);
  const int ag_group = topology.places[t].ag_group;
  for (int q = 0; q < topology.n; ++q) {
    const int receiver = topology.AgThread(ag_group, q);
    for (int i = 0; i < topology.G; ++i) {
      const int sender = SourceOf(topology, t, q, i);
      for (int64_t k = 0; k < c.layout.chunk_bytes[q][i]; ++k) {
        want[c.layout.chunk_offset[q][i] + k] = Byte(sender, receiver, k);
      }
    }
  }
  return want;
}

// The unfused reference on separate communicators: AllToAllV over a2a, AllGatherV of its result
// over ag, then each member's step-i chunk copied to where the layout puts it.
inline absl::Status Reference(const Topology& topology,
                              const std::vector<std::vector<int64_t>>& sizes, const Case& c, int t,
                              Communicator& a2a, Communicator& ag, std::vector<uint8_t>& out) {
  const int G = topology.G, n = topology.n;
  const std::vector<int64_t> recv = RecvBytes(topology, sizes, t);
  std::vector<uint8_t> exchanged(std::accumulate(recv.begin(), recv.end(), int64_t{0}));
  RETURN_IF_ERROR(a2a.AllToAllV(c.in.data(), c.layout.send_bytes, exchanged.data(), recv));
  std::vector<std::vector<int64_t>> member_recv(n);
  std::vector<int64_t> totals(n);
  for (int q = 0; q < n; ++q) {
    member_recv[q] = RecvBytes(topology, sizes, topology.AgThread(topology.places[t].ag_group, q));
    totals[q] = std::accumulate(member_recv[q].begin(), member_recv[q].end(), int64_t{0});
  }
  std::vector<uint8_t> gathered(std::accumulate(totals.begin(), totals.end(), int64_t{0}));
  RETURN_IF_ERROR(ag.AllGatherV(exchanged.data(), static_cast<int64_t>(exchanged.size()),
                                gathered.data(), totals));
  out.assign(c.out_bytes, kSentinel);
  int64_t base = 0;
  for (int q = 0; q < n; ++q) {
    const int a_q = topology.places[topology.AgThread(topology.places[t].ag_group, q)].a2a_rank;
    for (int i = 0; i < G; ++i) {
      const int s = (a_q - i + G) % G;
      const int64_t within =
          std::accumulate(member_recv[q].begin(), member_recv[q].begin() + s, int64_t{0});
      if (c.layout.chunk_bytes[q][i] == 0) continue;  // (gathered may be empty: no null memcpy)
      std::memcpy(out.data() + c.layout.chunk_offset[q][i], gathered.data() + base + within,
                  c.layout.chunk_bytes[q][i]);
    }
    base += totals[q];
  }
  return absl::OkStatus();
}

// Empty when equal, else where and how they first differ.
inline std::string FirstDifference(const std::vector<uint8_t>& got,
                                   const std::vector<uint8_t>& want) {
  if (got.size() != want.size()) return absl::StrCat(got.size(), " bytes, want ", want.size());
  for (size_t k = 0; k < got.size(); ++k) {
    if (got[k] != want[k]) {
      return absl::StrCat("byte ", k, " is ", static_cast<int>(got[k]), ", want ",
                          static_cast<int>(want[k]));
    }
  }
  return "";
}

// ---- Threads as ranks: one LocalGroup per group, fused and reference on separate groups. ----

struct Comms {
  std::vector<std::unique_ptr<Communicator>> a2a, ag;  // (W) the member of thread t
};

inline Comms MakeComms(const Topology& topology, const std::string& prefix, double timeout_s = 30) {
  std::vector<std::unique_ptr<LocalGroup>> a2a_groups, ag_groups;
  for (int g = 0; g < topology.a2a_groups(); ++g) {
    a2a_groups.push_back(std::make_unique<LocalGroup>(
        topology.G, LocalGroupOptions{absl::StrCat(prefix, "a2a/", g), timeout_s}));
  }
  for (int g = 0; g < topology.ag_groups(); ++g) {
    ag_groups.push_back(std::make_unique<LocalGroup>(
        topology.n, LocalGroupOptions{absl::StrCat(prefix, "ag/", g), timeout_s}));
  }
  Comms comms;
  for (const Place& p : topology.places) {
    comms.a2a.push_back(a2a_groups[p.a2a_group]->Member(p.a2a_rank));
    comms.ag.push_back(ag_groups[p.ag_group]->Member(p.ag_rank));
  }
  return comms;
}

inline void RunThreads(int world, const std::function<void(int)>& body) {
  std::vector<std::thread> threads;
  for (int t = 0; t < world; ++t) threads.emplace_back(body, t);
  for (std::thread& thread : threads) thread.join();
}

// Forwards everything to `inner`; Recv and AllGatherV call the hooks first (with the call's
// index, from 0).
class HookedCommunicator : public testing::ForwardingCommunicator {
 public:
  HookedCommunicator(std::unique_ptr<Communicator> inner, std::function<void(int)> on_recv,
                     std::function<void(int)> on_all_gather)
      : ForwardingCommunicator(std::move(inner)),
        on_recv_(std::move(on_recv)),
        on_all_gather_(std::move(on_all_gather)) {}
  absl::Status AllGatherV(const void* in, int64_t in_bytes, void* out,
                          const std::vector<int64_t>& recv_bytes) override {
    if (on_all_gather_) on_all_gather_(all_gathers_++);
    return ForwardingCommunicator::AllGatherV(in, in_bytes, out, recv_bytes);
  }
  absl::Status Recv(void* data, int64_t bytes, int peer, uint32_t tag) override {
    if (on_recv_) on_recv_(recvs_++);
    return ForwardingCommunicator::Recv(data, bytes, peer, tag);
  }

 private:
  std::function<void(int)> on_recv_, on_all_gather_;
  int recvs_ = 0, all_gathers_ = 0;
};

}  // namespace furnace::comm::fused_cases
