// moe::ScheduleExecutor on the groups of real layouts (threads as ranks, comm::LocalGroup): for
// each schedule, the rows a rank routes reach the ranks holding their experts and come back, in
// routed order, transformed by a stand-in expert whose ESP shards each contribute a part (so the
// reduce-scatter's sum shows); every row is computed by the experts once under s1 and s2 and once
// per tp peer under deepspeed; payloads encode their source, so a misrouted row shows by value.
// The byte counters per op equal the analytical volumes of research/parm.md 1.4 exactly, s1's and
// s2's all-to-all volumes being deepspeed's divided by tp.
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "runtime/base/status.h"
#include "runtime/device/device.h"
#include "runtime/model/gpt_moe.h"
#include "runtime/moe/calibrate.h"
#include "runtime/moe/executor.h"
#include "runtime/tensor/arena.h"
#include "runtime/tensor/transfer.h"
#include "runtime/topology/topology.h"
#include "runtime/train/moe_schedules.h"
#include "runtime/train/rank_layout.h"
#include "tests/runtime/parallel/layout_run.h"
#include "tests/runtime/parallel/local_world.h"

namespace furnace::moe {
namespace {

constexpr int kC = 2;
constexpr int kE = 4;

struct Grid {
  const char* name;
  int dp, tp, ep, esp;
};

// A row's value: which data-parallel batch and tp peer routed it (the peer matters only where
// the peers route different rows: s1), its expert and index, the column.
float Value(int dp, int peer, int e, int64_t i, int col) {
  return 10000.f * dp + 1000.f * peer + 100.f * e + 10.f * static_cast<float>(i) + col;
}

// Rows per expert that the tokens of (dp, peer) route: includes experts with none.
std::vector<int64_t> CountsOf(int dp, int peer, bool balanced, int tp) {
  std::vector<int64_t> c(kE);
  for (int e = 0; e < kE; ++e) c[e] = balanced ? 2 * tp : (dp * 5 + peer * 3 + e * 7) % 5;
  return c;
}

// One rank of grid g's layout on the tiny layout model, its groups from `world`.
absl::StatusOr<std::unique_ptr<train::RankLayout>> LayoutOf(const Grid& g, int rank,
                                                            testing::LocalWorld& world,
                                                            const model::ModelConfig& model) {
  topology::ParallelSizes sizes;
  sizes.dp = g.dp;
  sizes.tp = g.tp;
  sizes.ep = g.ep;
  sizes.esp = g.esp;
  ASSIGN_OR_RETURN(topology::Topology topo,
                   topology::Topology::Create(sizes, sizes.world(), train::DimsOf(model)));
  return train::BuildRankLayout(topo, rank, model, world.Factory());
}

struct RankRun {
  std::vector<float> back;  // FromExperts' result (S_all, C)
  std::vector<float> want;  // what it must be
  int64_t expert_rows = 0;  // R: rows this rank's experts processed
  std::map<std::string, int64_t> bytes;
  DispatchHandle handle;
  bool sliced = false;  // ScheduleExecutor::sliced
};

// Runs one rank: routes its rows to the experts, applies the stand-in expert (global expert e
// multiplies by e + 1; each ESP shard adds its 1 / esp share), routes them back.
absl::Status RunRank(const Grid& g, Schedule schedule, bool balanced, int rank,
                     testing::LocalWorld& world, RankRun& out) {
  ASSIGN_OR_RETURN(std::unique_ptr<train::RankLayout> layout,
                   LayoutOf(g, rank, world, testing::TinyLayoutModel(1, 0)));
  const model::ModelShard& sh = layout->shard;
  ExchangeCounters counters;
  const ScheduleExecutor ex(
      schedule, {layout->tp.get(), {layout->ep.get(), layout->esp.get()}, layout->esp_is_tp}, kE,
      &counters);
  out.sliced = ex.sliced();
  // The routed rows: a tp peer's own (s1) or the batch's, replicated over tp.
  const bool own = schedule == Schedule::kS1 && g.tp > 1;
  const int peer = own ? sh.tp_rank : 0;
  const std::vector<int64_t> counts = CountsOf(sh.dp_rank, peer, balanced, own ? 1 : g.tp);
  std::vector<float> routed;
  for (int e = 0; e < kE; ++e) {
    for (int64_t i = 0; i < counts[e]; ++i) {
      for (int c = 0; c < kC; ++c) routed.push_back(Value(sh.dp_rank, peer, e, i, c));
    }
  }
  ASSIGN_OR_RETURN(DispatchHandle h, ex.Prepare(counts, /*routing_digest=*/0));
  const int64_t S_all = ScheduleExecutor::AllRows(h);
  if (S_all * kC != static_cast<int64_t>(routed.size())) {
    return absl::InternalError(absl::StrCat("S_all ", S_all, " for ", routed.size() / kC, " rows"));
  }
  std::vector<float> scratch(ScheduleExecutor::ScratchRows(h) * kC + 1);
  std::vector<float> expert(h.R() * kC + 1);
  if (ex.exchanges()) {
    RETURN_IF_ERROR(
        ex.ToExperts(Direction::kForward, h, routed.data(), expert.data(), kC, scratch.data()));
  } else {
    expert.assign(routed.begin(), routed.end());
  }
  // The stand-in expert, on the rows grouped by local expert.
  const int El = kE / g.ep;
  for (int le = 0; le < El; ++le) {
    const int e = sh.ep_rank * El + le;
    for (int64_t r = h.expert_offsets[le]; r < h.expert_offsets[le + 1]; ++r) {
      for (int c = 0; c < kC; ++c) expert[r * kC + c] *= static_cast<float>(e + 1) / g.esp;
    }
  }
  out.back.assign(S_all * kC, -1.f);
  if (ex.exchanges()) {
    RETURN_IF_ERROR(
        ex.FromExperts(Direction::kForward, h, expert.data(), out.back.data(), kC, scratch.data()));
  } else {
    std::copy(expert.begin(), expert.begin() + S_all * kC, out.back.begin());
  }
  out.want.clear();
  for (int e = 0; e < kE; ++e) {
    for (int64_t i = 0; i < counts[e]; ++i) {
      for (int c = 0; c < kC; ++c) {
        out.want.push_back(Value(sh.dp_rank, peer, e, i, c) * static_cast<float>(e + 1));
      }
    }
  }
  out.expert_rows = h.R();
  for (const auto& [name, entry] : counters.Snapshot()) out.bytes[name] = entry.bytes;
  out.handle = h;
  return absl::OkStatus();
}

std::vector<RankRun> RunGrid(const Grid& g, Schedule schedule, bool balanced) {
  const int world = g.dp * g.tp;
  testing::LocalWorld local;
  std::vector<RankRun> runs(world);
  const std::vector<absl::Status> status = testing::LocalWorld::Run(
      world, [&](int rank) { return RunRank(g, schedule, balanced, rank, local, runs[rank]); });
  for (int r = 0; r < world; ++r) EXPECT_TRUE(status[r].ok()) << "rank " << r << ": " << status[r];
  return runs;
}

// The lists as data: the backward list is the forward list reversed through the adjoints (and
// fused again under s2), so both directions' exchanges between order and expert, and between
// expert and inverse order, are the same ops: the executor runs one segment for both.
TEST(ScheduleOps, BackwardIsTheAdjointOfForward) {
  EXPECT_EQ(OpListString(ForwardOps(Schedule::kDeepspeed)),
            "gate . order . counts(ep) . a2a(ep) . ag(esp) . expert . rs(esp) . a2a(ep) . inverse");
  EXPECT_EQ(OpListString(BackwardOps(Schedule::kDeepspeed)),
            "inverse . a2a(ep) . ag(esp) . expert . rs(esp) . a2a(ep) . order . gate");
  EXPECT_EQ(OpListString(ForwardOps(Schedule::kS1)),
            "mp_split . gate . order . counts(ep) . a2a(ep) . ag(esp) . expert . rs(esp) . "
            "a2a(ep) . inverse . mp_all_gather(tp)");
  EXPECT_EQ(OpListString(BackwardOps(Schedule::kS1)),
            "mp_split . inverse . a2a(ep) . ag(esp) . expert . rs(esp) . a2a(ep) . order . gate . "
            "mp_all_gather(tp)");
  EXPECT_EQ(OpListString(ForwardOps(Schedule::kS2)),
            "gate . order . row_split . counts(ep) . fused(a2a ep, ag esp) . expert . rs(esp) . "
            "fused(a2a ep, ag tp) . inverse");
  EXPECT_EQ(OpListString(BackwardOps(Schedule::kS2)),
            "inverse . row_split . fused(a2a ep, ag esp) . expert . rs(esp) . "
            "fused(a2a ep, ag tp) . order . gate");
  // Sliced experts (the ESP group being the TP group): Megatron's f and g around the expert.
  EXPECT_EQ(OpListString(ForwardOps(Schedule::kDeepspeed, /*sliced=*/true)),
            "gate . order . counts(ep) . a2a(ep) . copy(esp) . expert . ar(esp) . a2a(ep) . "
            "inverse");
  EXPECT_EQ(OpListString(BackwardOps(Schedule::kDeepspeed, /*sliced=*/true)),
            "inverse . a2a(ep) . copy(esp) . expert . ar(esp) . a2a(ep) . order . gate");
  for (Schedule s : {Schedule::kS1, Schedule::kS2}) {  // their ESP peers hold other rows
    EXPECT_EQ(OpListString(ForwardOps(s, true)), OpListString(ForwardOps(s, false)))
        << ScheduleName(s);
    EXPECT_FALSE(SlicedExperts(s, /*esp_is_tp=*/true, 2));
  }
  EXPECT_TRUE(SlicedExperts(Schedule::kDeepspeed, true, 2));
  EXPECT_FALSE(SlicedExperts(Schedule::kDeepspeed, true, 1));
  EXPECT_FALSE(SlicedExperts(Schedule::kDeepspeed, false, 2));
  for (const bool sliced : {false, true}) {
    for (Schedule s : kAllSchedules) {
      // The segments around the expert, without the counts (Prepare's), match across directions.
      const auto segment = [](const std::vector<Op>& ops, OpKind from, OpKind to) {
        std::vector<std::string> out;
        bool in = false;
        for (const Op& op : ops) {
          if (op.kind == from) {
            in = true;
            continue;
          }
          if (op.kind == to) break;
          if (in && op.kind != OpKind::kCounts) out.push_back(op.Name());
        }
        return out;
      };
      EXPECT_EQ(segment(ForwardOps(s, sliced), OpKind::kOrder, OpKind::kExpert),
                segment(BackwardOps(s, sliced), OpKind::kInverseOrder, OpKind::kExpert))
          << ScheduleName(s);
      EXPECT_EQ(segment(ForwardOps(s, sliced), OpKind::kExpert, OpKind::kInverseOrder),
                segment(BackwardOps(s, sliced), OpKind::kExpert, OpKind::kOrder))
          << ScheduleName(s);
      EXPECT_EQ(ParseSchedule(ScheduleName(s)), s);
    }
  }
  EXPECT_FALSE(ParseSchedule("auto").has_value());
}

using Param = std::tuple<Grid, Schedule>;
class ScheduleExecutorTest : public ::testing::TestWithParam<Param> {};

TEST_P(ScheduleExecutorTest, RoutesRowsToTheirExpertsAndBackOnce) {
  const auto& [g, schedule] = GetParam();
  const std::vector<RankRun> runs = RunGrid(g, schedule, /*balanced=*/false);
  int64_t expert_rows = 0, distinct = 0;
  for (size_t r = 0; r < runs.size(); ++r) {
    EXPECT_EQ(runs[r].back, runs[r].want) << "rank " << r;
    expert_rows += runs[r].expert_rows;
  }
  // Distinct routed rows over the job: each data-parallel batch's once (s1: each peer's own).
  for (int d = 0; d < g.dp; ++d) {
    const bool own = schedule == Schedule::kS1 && g.tp > 1;
    for (int q = 0; q < (own ? g.tp : 1); ++q) {
      for (int64_t c : CountsOf(d, q, false, own ? 1 : g.tp)) distinct += c;
    }
  }
  // Every ESP shard of an expert sees each of its rows; deepspeed's experts see each tp times
  // (gathering their group's copies), unless sliced (each shard computes its own copy).
  const bool sliced = runs[0].sliced;
  EXPECT_EQ(sliced, schedule == Schedule::kDeepspeed && g.tp == g.esp) << "this grid's order";
  const int64_t copies = schedule == Schedule::kDeepspeed && !sliced ? g.tp : 1;
  EXPECT_EQ(expert_rows, distinct * g.esp * copies);
}

TEST_P(ScheduleExecutorTest, BytesPerOpAreTheAnalyticalVolumes) {
  const auto& [g, schedule] = GetParam();
  const std::vector<RankRun> runs = RunGrid(g, schedule, /*balanced=*/true);
  const int64_t row = kC * sizeof(float);
  const int El = kE / g.ep;
  // Balanced: every rank routes 2 tp rows per expert (deepspeed, s2 before its split); an s1 peer
  // routes 2 of its own per expert; an s2 peer keeps 2 per expert of the 2 tp.
  const int64_t S = schedule == Schedule::kDeepspeed ? 2 * g.tp * kE : 2 * kE;
  // Received over ep, gathered over esp (sliced: each shard computes the rows it received, and
  // the ESP peers' counts, the same, are not exchanged).
  const bool sliced = runs[0].sliced;
  const int64_t A = S, R = sliced ? A : g.esp * A;
  const int64_t counts =
      (g.ep > 1 ? int64_t{g.ep} * El * 8 : 0) +
      (g.esp > 1 && !sliced ? int64_t{g.ep} * El * 8 : 0) +
      (schedule == Schedule::kS2 && g.tp > 1 ? 16 : 0);  // s2: (ep rank, counts hash) over tp
  std::map<std::string, int64_t> want;
  if (counts > 0) want["counts(ep)"] = counts;
  if (schedule == Schedule::kS2) {
    // Dispatch fused with the ESP all-gather, combine fused with the tp all-gather; where one of
    // the two groups is of one, the other's plain collective.
    if (g.ep > 1 && g.esp > 1) {
      want["fused(a2a ep, ag esp)"] = (S + A) * row;
    } else if (g.ep > 1) {
      want["fused(a2a ep, ag esp)"] = S * row;
    } else if (g.esp > 1) {
      want["fused(a2a ep, ag esp)"] = A * row;
    }
    if (g.esp > 1) want["rs(esp)"] = R * row;
    want["fused(a2a ep, ag tp)"] = ((g.ep > 1 ? A : 0) + S) * row;
  } else if (sliced) {
    if (g.ep > 1) want["a2a(ep)"] = (S + A) * row;
    want["ar(esp)"] = R * row;  // copy(esp) moves nothing
  } else {
    if (g.ep > 1) want["a2a(ep)"] = (S + A) * row;
    if (g.esp > 1) want["ag(esp)"] = A * row;
    if (g.esp > 1) want["rs(esp)"] = R * row;
  }
  for (size_t r = 0; r < runs.size(); ++r) EXPECT_EQ(runs[r].bytes, want) << "rank " << r;
  // Parm's point: the all-to-all carries 1 / tp of deepspeed's rows.
  if (schedule != Schedule::kDeepspeed && g.ep > 1) {
    const std::vector<RankRun> ds = RunGrid(g, Schedule::kDeepspeed, /*balanced=*/true);
    const int64_t ds_a2a = ds[0].bytes.at("a2a(ep)");
    const int64_t mine = schedule == Schedule::kS1
                             ? runs[0].bytes.at("a2a(ep)")
                             : runs[0].bytes.at("fused(a2a ep, ag esp)") -
                                   (g.esp > 1 ? A * row : 0) +
                                   runs[0].bytes.at("fused(a2a ep, ag tp)") - S * row;
    EXPECT_EQ(mine * g.tp, ds_a2a);
  }
}

// s2 splits the rows between the tp peers, which must have routed exactly the same rows: peers
// whose per-expert counts agree but whose rows hold other tokens (two tokens swapped experts) are
// refused, on every peer, rather than mixed.
TEST(ScheduleExecutorS2Test, TpPeersThatRoutedOtherTokensWithTheSameCountsAreRefused) {
  const Grid g{"dp1_tp2_ep2", 1, 2, 2, 1};
  testing::LocalWorld local;
  const std::vector<absl::Status> status = testing::LocalWorld::Run(2, [&](int rank) {
    ASSIGN_OR_RETURN(std::unique_ptr<train::RankLayout> layout,
                     LayoutOf(g, rank, local, testing::TinyLayoutModel(1, 0)));
    const ScheduleExecutor ex(
        Schedule::kS2, {layout->tp.get(), {layout->ep.get(), layout->esp.get()}, layout->esp_is_tp},
        kE, nullptr);
    const std::vector<int64_t> counts(kE, 2);
    // The same counts; the rows' tokens in another order on peer 1.
    std::vector<int32_t> tokens = {0, 1, 2, 3, 4, 5, 6, 7};
    if (layout->shard.tp_rank == 1) std::swap(tokens[1], tokens[2]);
    return ex.Prepare(counts, RoutingDigest(tokens)).status();
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(absl::IsInternal(status[r])) << "rank " << r << ": " << status[r];
    EXPECT_NE(status[r].message().find("routed other rows"), std::string::npos) << status[r];
  }
}

// The exchanges' explicit adjoints: FromExperts is ToExperts' adjoint, checked by the dot-product
// identity over the whole job with random rows, <To(x), y> summed over the ranks' expert sides
// against <x, From(y)> summed over the ranks' routed sides. Under s2 the routed rows are
// tp-replicated and each peer returns all of them (the all-gather's adjoint is the split of a
// replicated gradient), so there the routed side counts each tp group once (a 1 / tp weight).
TEST_P(ScheduleExecutorTest, FromExpertsIsTheAdjointOfToExperts) {
  const auto& [g, schedule] = GetParam();
  const int world = g.dp * g.tp;
  testing::LocalWorld local;
  std::vector<double> lhs(world, 0), rhs(world, 0);
  const std::vector<absl::Status> status = testing::LocalWorld::Run(world, [&](int rank) {
    ASSIGN_OR_RETURN(std::unique_ptr<train::RankLayout> layout,
                     LayoutOf(g, rank, local, testing::TinyLayoutModel(1, 0)));
    const model::ModelShard& sh = layout->shard;
    const ScheduleExecutor ex(
        schedule, {layout->tp.get(), {layout->ep.get(), layout->esp.get()}, layout->esp_is_tp}, kE,
        nullptr);
    const bool own = schedule == Schedule::kS1 && g.tp > 1;
    const std::vector<int64_t> counts =
        CountsOf(sh.dp_rank, own ? sh.tp_rank : 0, /*balanced=*/false, g.tp);
    ASSIGN_OR_RETURN(DispatchHandle h, ex.Prepare(counts, /*routing_digest=*/0));
    const int64_t S_all = ScheduleExecutor::AllRows(h);
    // x: the routed rows, replicated over tp where the schedule routes the batch's rows (the
    // seed is the batch's, or the peer's own under s1); y: this rank's expert side.
    std::mt19937 gen_x(1000 + sh.dp_rank * 17 + (own ? sh.tp_rank : 0));
    std::mt19937 gen_y(7 + rank);
    std::uniform_real_distribution<float> u(-1, 1);
    std::vector<float> x(S_all * kC + 1), y(h.R() * kC + 1), tx(h.R() * kC + 1), fy(S_all * kC + 1);
    for (float& v : x) v = u(gen_x);
    for (float& v : y) v = u(gen_y);
    std::vector<float> scratch(ScheduleExecutor::ScratchRows(h) * kC + 1);
    if (ex.exchanges()) {
      RETURN_IF_ERROR(
          ex.ToExperts(Direction::kForward, h, x.data(), tx.data(), kC, scratch.data()));
      RETURN_IF_ERROR(
          ex.FromExperts(Direction::kBackward, h, y.data(), fy.data(), kC, scratch.data()));
    } else {
      tx = x;
      fy = y;
    }
    for (int64_t i = 0; i < h.R() * kC; ++i) lhs[rank] += double{tx[i]} * y[i];
    // Sliced experts: the ESP peers (the tp peers) compute on their copies of the same rows, and
    // the backward all-reduce gives each the gradient of the one replicated input.
    const double weight = schedule == Schedule::kS2 || ex.sliced() ? 1.0 / g.tp : 1.0;
    for (int64_t i = 0; i < S_all * kC; ++i) rhs[rank] += weight * x[i] * fy[i];
    return absl::OkStatus();
  });
  for (int r = 0; r < world; ++r) ASSERT_TRUE(status[r].ok()) << "rank " << r << ": " << status[r];
  double a = 0, b = 0;
  for (int r = 0; r < world; ++r) {
    a += lhs[r];
    b += rhs[r];
  }
  EXPECT_NEAR(a, b, 1e-4 * std::max(1.0, std::fabs(a)));
  EXPECT_NE(a, 0.0);
}

// auto: every rank takes the same schedule, the first call calibrates and caches the profile
// under the directory it is given, and the second (a restarted attempt) reads it back instead of
// calibrating: the same profile and choice on every rank, with no collective of the calibration.
// Calibration times the links up to the layer's largest collective (at most 64 MiB): a layer that
// moves no more than 1 MiB keeps the default sizes.
TEST(ChooseMoeSchedulesTest, CalibrationReachesTheLayersLargestCollective) {
  const std::vector<int64_t> defaults = moe::CalibrationOptions().sizes_bytes;
  moe::LayerShape small{.N = 64, .C = 16, .f = 16, .E = 4, .k = 2, .tp = 2, .ep = 2, .esp = 1};
  EXPECT_EQ(train::CalibrationSizesFor(small), defaults);
  // 1B-class: 2048 tokens of 2048, top-2: deepspeed's all-to-all sends every routed row of all
  // N tokens (32 MiB; s1 and s2 send a tp-th of it).
  moe::LayerShape big{.N = 2048, .C = 2048, .f = 8192, .E = 64, .k = 2, .tp = 2, .ep = 8, .esp = 1};
  std::vector<int64_t> sizes = train::CalibrationSizesFor(big);
  ASSERT_EQ(sizes.size(), defaults.size() + 1);
  EXPECT_EQ(sizes.back(), int64_t{2048} * 2 * 2048 * 4);
  big.N = 65536;  // capped
  EXPECT_EQ(train::CalibrationSizesFor(big).back(), int64_t{64} << 20);
}

// The GEMM fit reaches the layer's largest expert GEMM (at most 2^34 FLOP): on a GPU the default
// sizes are all launch overhead, and the slope fitted on them alone priced GEMMs thousands of
// times larger.
TEST(ChooseMoeSchedulesTest, CalibrationTimesTheLayersLargestExpertGemm) {
  const std::vector<int64_t> defaults = moe::CalibrationOptions().gemm_flops;
  moe::LayerShape small{.N = 64, .C = 16, .f = 16, .E = 4, .k = 2, .tp = 2, .ep = 2, .esp = 1};
  EXPECT_EQ(train::CalibrationGemmFlopsFor(small), defaults);
  moe::LayerShape big{.N = 512, .C = 1024, .f = 4096, .E = 64, .k = 2, .tp = 2, .ep = 8, .esp = 2};
  double want = 0;
  for (moe::Schedule s : moe::kAllSchedules) {
    want = std::max(want, 2.0 * static_cast<double>(moe::RowsOf(big, s).R) * big.C * big.f / 2);
  }
  ASSERT_GT(want, static_cast<double>(defaults.back()));
  std::vector<int64_t> flops = train::CalibrationGemmFlopsFor(big);
  ASSERT_EQ(flops.size(), defaults.size() + 1);
  EXPECT_EQ(flops.back(), static_cast<int64_t>(want));
  big.N = 1 << 20;  // capped
  EXPECT_EQ(train::CalibrationGemmFlopsFor(big).back(), int64_t{1} << 34);
}

TEST(ChooseMoeSchedulesTest, AutoCalibratesOnceAndCachesTheProfile) {
  const std::string dir = ::testing::TempDir() + "/choose-" + std::to_string(getpid());
  std::filesystem::remove_all(dir);
  const Grid g{"tp2_ep2", 1, 2, 2, 1};
  const int world = g.dp * g.tp;
  const model::ModelConfig config = testing::TinyLayoutModel(2, 0);
  // One rank's layout and model (the model's device and arena outlive it).
  struct Rank {
    std::unique_ptr<train::RankLayout> layout;
    std::unique_ptr<device::Device> cpu = device::CreateCpuDevice();
    tensor::DeviceArena arena{*cpu, 0};
    std::unique_ptr<model::GptMoe> model;
  };
  const auto make = [&](int rank,
                        testing::LocalWorld& local) -> absl::StatusOr<std::unique_ptr<Rank>> {
    auto r = std::make_unique<Rank>();
    ASSIGN_OR_RETURN(r->layout, LayoutOf(g, rank, local, config));
    ASSIGN_OR_RETURN(r->model, model::GptMoe::Create(config, 7, *r->cpu, r->arena, r->layout->shard,
                                                     r->layout->model_groups()));
    return r;
  };
  for (int attempt = 0; attempt < 2; ++attempt) {
    testing::LocalWorld local;
    std::vector<train::MoeScheduleChoice> choices(world);
    std::vector<std::string> profiles(world);
    const std::vector<absl::Status> status = testing::LocalWorld::Run(world, [&](int rank) {
      ASSIGN_OR_RETURN(std::unique_ptr<Rank> r, make(rank, local));
      ASSIGN_OR_RETURN(choices[rank], train::ChooseMoeSchedules("auto", *r->model, *r->layout,
                                                                /*micro_batch=*/2, dir));
      profiles[rank] = choices[rank].profile->ToJson();
      return r->model->SetMoeSchedules(choices[rank].per_layer);
    });
    for (int r = 0; r < world; ++r)
      ASSERT_TRUE(status[r].ok()) << "rank " << r << ": " << status[r];
    for (int r = 0; r < world; ++r) {
      EXPECT_EQ(choices[r].from_cache, attempt == 1) << "rank " << r;
      EXPECT_EQ(choices[r].per_layer, choices[0].per_layer) << "rank " << r;
      EXPECT_EQ(profiles[r], profiles[0]) << "rank " << r;
      ASSERT_TRUE(choices[r].choice.has_value());
      EXPECT_EQ(choices[r].choice->reason, choices[0].choice->reason);
    }
    EXPECT_TRUE(std::filesystem::exists(choices[0].cache_path)) << choices[0].cache_path;
    // Keyed by the sizes, the device kind and the placement, the same on every rank.
    EXPECT_NE(choices[0].cache_path.find("cost_profile.world2_pp1_tp2_ep2_esp1_cpu_fp32_host_"),
              std::string::npos)
        << choices[0].cache_path;
    for (int r = 1; r < world; ++r) EXPECT_EQ(choices[r].cache_path, choices[0].cache_path);
    EXPECT_EQ(static_cast<int>(choices[0].per_layer.size()), config.num_moe_layers());
  }
  // A schedule named in the spec needs no profile; an unknown one is refused with the allowed
  // values.
  testing::LocalWorld local;
  const std::vector<absl::Status> status = testing::LocalWorld::Run(world, [&](int rank) {
    ASSIGN_OR_RETURN(std::unique_ptr<Rank> r, make(rank, local));
    ASSIGN_OR_RETURN(const train::MoeScheduleChoice s2,
                     train::ChooseMoeSchedules("s2", *r->model, *r->layout, 2, dir));
    if (s2.profile.has_value() || s2.per_layer != std::vector<Schedule>(2, Schedule::kS2)) {
      return absl::InternalError("s2 not taken as named");
    }
    const absl::StatusOr<train::MoeScheduleChoice> bad =
        train::ChooseMoeSchedules("s3", *r->model, *r->layout, 2, dir);
    if (bad.ok() || bad.status().message().find("deepspeed, s1, s2, auto") == std::string::npos) {
      return absl::InternalError(absl::StrCat("s3: ", bad.status().ToString()));
    }
    return absl::OkStatus();
  });
  for (int r = 0; r < world; ++r) EXPECT_TRUE(status[r].ok()) << "rank " << r << ": " << status[r];
  std::filesystem::remove_all(dir);
}

// auto's trial (runtime/moe/trial.h; a wide window: every schedule tried): every rank measures
// the same times and takes the same schedule (deepspeed unless a Parm schedule gained 5%); the
// outcome is cached beside the profile and a restarted attempt reads it
// instead of measuring; the trial leaves the gradients zero and the parameters as they were.
// Under full_recompute the trial drops and rebuilds as the policy does, and caches apart. Under a
// memory.device_budget no trial runs and the reason says so.
TEST(ChooseMoeSchedulesTest, AutoTimesTheLayerUnderEachCandidateAndCachesTheOutcome) {
  const std::string dir = ::testing::TempDir() + "/trial-" + std::to_string(getpid());
  std::filesystem::remove_all(dir);
  const Grid g{"tp2_ep2", 1, 2, 2, 1};
  const int world = g.dp * g.tp;
  const model::ModelConfig config = testing::TinyLayoutModel(2, 0);
  const moe::TrialOptions wide{.window = 1e9};
  struct Setting {
    uint64_t budget;
    memory::MemoryPolicy policy;
  };
  for (const Setting& setting :
       {Setting{0, memory::MemoryPolicy::kNone}, Setting{0, memory::MemoryPolicy::kFullRecompute},
        Setting{uint64_t{1} << 30, memory::MemoryPolicy::kNone}}) {
    const uint64_t budget = setting.budget;
    const bool recompute = setting.policy == memory::MemoryPolicy::kFullRecompute;
    for (int attempt = 0; attempt < 2; ++attempt) {
      testing::LocalWorld local;
      std::vector<train::MoeScheduleChoice> choices(world);
      const std::vector<absl::Status> status = testing::LocalWorld::Run(world, [&](int rank) {
        std::unique_ptr<device::Device> cpu = device::CreateCpuDevice();
        tensor::DeviceArena arena(*cpu, budget);
        ASSIGN_OR_RETURN(std::unique_ptr<train::RankLayout> layout,
                         LayoutOf(g, rank, local, config));
        ASSIGN_OR_RETURN(
            std::unique_ptr<model::GptMoe> m,
            model::GptMoe::Create(config, 7, *cpu, arena, layout->shard, layout->model_groups()));
        RETURN_IF_ERROR(m->SetMemoryPolicy(setting.policy));
        std::vector<float> before(m->num_params()), grads(m->num_params());
        RETURN_IF_ERROR(
            tensor::CopyToHost(*cpu, before.data(), m->param_data(), before.size() * 4));
        ASSIGN_OR_RETURN(choices[rank], train::ChooseMoeSchedules("auto", *m, *layout,
                                                                  /*micro_batch=*/2, dir, wide));
        // Under full_recompute the trial's layer dropped what the policy drops and rebuilt it in
        // its backward (when it ran: not from the cache).
        const bool measured = !choices[rank].trial_from_cache && budget == 0;
        if (recompute && measured != (m->stash().rebuilt_bytes() > 0)) {
          return absl::InternalError(absl::StrCat("rebuilt ", m->stash().rebuilt_bytes(),
                                                  " bytes in the trial (measured: ", measured,
                                                  ")"));
        }
        std::vector<float> after(before.size());
        RETURN_IF_ERROR(tensor::CopyToHost(*cpu, after.data(), m->param_data(), after.size() * 4));
        RETURN_IF_ERROR(tensor::CopyToHost(*cpu, grads.data(), m->grad_data(), grads.size() * 4));
        if (std::memcmp(before.data(), after.data(), before.size() * 4) != 0) {
          return absl::InternalError("the trial changed the parameters");
        }
        for (float v : grads) {
          if (v != 0) return absl::InternalError("the trial left gradients");
        }
        if (m->ActivationPeakBytes() != 0) {
          return absl::InternalError("the trial left its activation peak");
        }
        return m->SetMoeSchedules(choices[rank].per_layer);
      });
      for (int r = 0; r < world; ++r) {
        ASSERT_TRUE(status[r].ok()) << "budget " << budget << " rank " << r << ": " << status[r];
      }
      for (int r = 0; r < world; ++r) {
        ASSERT_TRUE(choices[r].choice.has_value());
        EXPECT_EQ(choices[r].per_layer, choices[0].per_layer) << "rank " << r;
        EXPECT_EQ(choices[r].choice->reason, choices[0].choice->reason) << "rank " << r;
        EXPECT_EQ(choices[r].choice->measured_s, choices[0].choice->measured_s) << "rank " << r;
        EXPECT_EQ(choices[r].trial_from_cache, budget == 0 && attempt == 1) << "rank " << r;
      }
      const moe::Choice& c = *choices[0].choice;
      if (budget > 0) {
        EXPECT_TRUE(c.measured_s.empty());
        EXPECT_NE(c.reason.find("not measured (the trial runs only without memory.device_budget)"),
                  std::string::npos)
            << c.reason;
        EXPECT_TRUE(choices[0].trial_cache_path.empty());
        continue;
      }
      ASSERT_EQ(c.measured_s.size(), 3u);
      for (double t : c.measured_s) EXPECT_GT(t, 0);  // all three tried
      const double ds = c.measured_s[0];
      const double picked = c.measured_s[static_cast<int>(c.schedule)];
      // Nothing measured 5% faster than the pick; a Parm pick 5% faster than deepspeed.
      EXPECT_LE(picked, ds);
      for (double t : c.measured_s) EXPECT_GE(t, 0.95 * picked);
      if (c.schedule != Schedule::kDeepspeed) {
        EXPECT_LE(picked, 0.95 * ds);
      }
      EXPECT_NE(c.reason.find("slowest rank, median of "), std::string::npos) << c.reason;
      EXPECT_EQ(choices[0].per_layer,
                std::vector<Schedule>(static_cast<size_t>(config.num_moe_layers()), c.schedule));
      EXPECT_TRUE(std::filesystem::exists(choices[0].trial_cache_path))
          << choices[0].trial_cache_path;
      EXPECT_NE(choices[0].trial_cache_path.find("moe_trial.world2_pp1_tp2_ep2_esp1_cpu_fp32_"),
                std::string::npos)
          << choices[0].trial_cache_path;
      EXPECT_NE(choices[0].trial_cache_path.find(recompute ? "_full_recompute.json" : "_none.json"),
                std::string::npos)
          << choices[0].trial_cache_path;
    }
  }
  std::filesystem::remove_all(dir);
}

// tp in {2, 4}, ep in {2, 4}, esp in {1, 2}: the data-parallel width makes ep * esp divide
// dp * tp.
const Grid kGrids[] = {
    {"tp2_ep2", 1, 2, 2, 1},     {"dp2_tp2_ep2_esp2", 2, 2, 2, 2},
    {"dp2_tp2_ep4", 2, 2, 4, 1}, {"dp4_tp2_ep4_esp2", 4, 2, 4, 2},
    {"tp4_ep2", 1, 4, 2, 1},     {"tp4_ep2_esp2", 1, 4, 2, 2},
    {"tp4_ep4", 1, 4, 4, 1},     {"dp2_tp4_ep4_esp2", 2, 4, 4, 2},
    {"tp2_esp2", 1, 2, 1, 2},    {"tp2", 1, 2, 1, 1},
};

std::string Name(const ::testing::TestParamInfo<Param>& info) {
  return absl::StrCat(std::get<0>(info.param).name, "_", ScheduleName(std::get<1>(info.param)));
}

INSTANTIATE_TEST_SUITE_P(Grids, ScheduleExecutorTest,
                         ::testing::Combine(::testing::ValuesIn(kGrids),
                                            ::testing::Values(Schedule::kDeepspeed, Schedule::kS1,
                                                              Schedule::kS2)),
                         Name);

}  // namespace
}  // namespace furnace::moe
