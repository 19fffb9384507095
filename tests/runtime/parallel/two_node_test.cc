// The MoE layer's schedules over two emulated nodes (bench/parm/two_nodes.sh): 4 forked ranks as
// 2 nodes of 2, layout tp 2 x ep 2 x esp 2 with EP outermost, so tp and esp stay inside a node and
// every EP exchange crosses the rate-limited veth between the namespaces. Each rank runs the layer
// (bench::RankLayer: MoeBlockForward + MoeBlockBackward) under deepspeed, s1 and s2; its outputs,
// input gradients and parameter gradients must equal, bit for bit, those of the same layout over
// 127.0.0.1: the link changes timing, never the collectives' results.
//
// Needs root and iproute2 to make the namespaces; skips with the reason otherwise.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bench/distributed/fork_ranks.h"
#include "bench/parm/parm_layer.h"
#include "gtest/gtest.h"
#include "runtime/base/status.h"
#include "runtime/comm/file_kv_store.h"
#include "runtime/comm/gloo_communicator.h"
#include "runtime/train/rank_layout.h"
#include "tests/runtime/parallel/layout_run.h"
#include "tests/runtime/parallel/two_node_topology.h"

namespace furnace::testing {
namespace {

constexpr int kWorld = 4;
constexpr int kRanksPerNode = 2;

topology::ParallelSizes Sizes() {
  topology::ParallelSizes s;
  s.dp = 2;
  s.tp = 2;
  s.ep = 2;
  s.esp = 2;
  s.moe_order = "esp-edp-ep";
  return s;
}

std::string ResultFile(const std::string& dir, int rank, moe::Schedule s) {
  return absl::StrCat(dir, "/rank-", rank, "-", moe::ScheduleName(s), ".bin");
}

void Append(std::ofstream& out, const std::vector<float>& v) {
  out.write(reinterpret_cast<const char*>(v.data()),
            static_cast<std::streamsize>(v.size() * sizeof(float)));
}

absl::Status RunRank(bool two_nodes, const std::string& dir, int rank) {
  std::string host = "127.0.0.1";
  if (two_nodes) {
    ASSIGN_OR_RETURN(host, EnterNode(rank / kRanksPerNode));
  }
  const model::ModelConfig mc = TinyLayoutModel(2, 0);
  ASSIGN_OR_RETURN(topology::Topology topo,
                   topology::Topology::Create(Sizes(), kWorld, train::DimsOf(mc)));
  comm::FileKvStore store(dir + "/kv");
  const train::CommFactory factory = [&](const std::string& prefix, const std::string& name, int r,
                                         int size) {
    comm::GlooOptions o;
    o.rank = r;
    o.size = size;
    o.host = host;
    o.timeout_s = 60;
    return comm::CreateGlooCommunicator(store, prefix, name, r, size, o);
  };
  ASSIGN_OR_RETURN(std::unique_ptr<train::RankLayout> layout,
                   train::BuildRankLayout(topo, rank, mc, factory));
  bench::LayerConfig lc;
  lc.B = 2;
  lc.T = 8;
  lc.C = 16;
  lc.f = 32;
  lc.E = 4;
  lc.k = 2;
  ASSIGN_OR_RETURN(std::unique_ptr<bench::RankLayer> layer,
                   bench::RankLayer::Create(lc, layout->shard, layout->model_groups()));
  for (moe::Schedule s : moe::kAllSchedules) {
    bench::LayerOutputs out;
    ASSIGN_OR_RETURN(bench::LayerTimes t, layer->Run(s, nullptr, &out));
    (void)t;
    std::ofstream file(ResultFile(dir, rank, s), std::ios::binary);
    Append(file, out.out);
    Append(file, out.dx);
    Append(file, out.grads);
    if (!file) return absl::InternalError("cannot write the rank's results");
  }
  return absl::OkStatus();
}

void RunAll(bool two_nodes, const std::string& dir) {
  const std::vector<std::string> failed = bench::RunForked(
      kWorld,
      [&](int rank) {
        const absl::Status s = RunRank(two_nodes, dir, rank);
        if (!s.ok()) std::fprintf(stderr, "rank %d: %s\n", rank, s.ToString().c_str());
        return s.ok() ? 0 : 1;
      },
      180);
  for (int r = 0; r < kWorld; ++r) EXPECT_EQ(failed[r], "") << "rank " << r;
}

std::string Slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

TEST(TwoNodeTest, MoeSchedulesOverTheNamespacesEqualLoopback) {
  std::string why;
  std::unique_ptr<TwoNodes> nodes = TwoNodes::Up("100mbit", &why);
  if (nodes == nullptr) GTEST_SKIP() << "two emulated nodes unavailable: " << why;

  const std::string root =
      std::filesystem::temp_directory_path() / absl::StrCat("two_node_test.", ::getpid());
  const std::string loop = root + "/loopback", ns = root + "/nodes";
  std::filesystem::create_directories(loop);
  std::filesystem::create_directories(ns);
  RunAll(false, loop);
  RunAll(true, ns);
  for (int r = 0; r < kWorld; ++r) {
    for (moe::Schedule s : moe::kAllSchedules) {
      const std::string a = Slurp(ResultFile(loop, r, s)), b = Slurp(ResultFile(ns, r, s));
      EXPECT_FALSE(a.empty()) << "rank " << r << " " << moe::ScheduleName(s);
      EXPECT_TRUE(a == b) << "rank " << r << " " << moe::ScheduleName(s)
                          << ": outputs or gradients differ between loopback and two nodes";
    }
  }
  std::filesystem::remove_all(root);
}

}  // namespace
}  // namespace furnace::testing
