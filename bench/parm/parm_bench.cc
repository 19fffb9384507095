// bench_parm: Parm's headline comparison (research/parm.md 1.4, 2, 4) on Furnace's MoE layer. For
// each layout (tp, ep, esp) of 8 forked ranks and each layer shape of a grid, the layer's forward
// and backward (MoeBlockForward + MoeBlockBackward) under deepspeed, s1 and s2, and what the cost
// model's `auto` would pick there.
//
// Per layout, the ranks build their groups from a topology::Topology with train::BuildRankLayout
// (Gloo), run moe::Calibrate once (every rank gets the same profile), then for every shape time
// the three schedules interleaved rep by rep (the order rotates each rep, a world barrier before
// every run) so machine noise hits them alike. A rep's time is the slowest rank's; a schedule's
// time is the median over reps. `model` is ChooseSchedule on the calibrated profile (the cost
// model alone, as auto chose before its trial); `auto` is what moe.schedule auto runs now: the
// ranks' trial (runtime/moe/trial.h) of the model's candidates, run on each config before its
// timed reps, so its pick is judged on measurements it did not see. Each one's measured time is
// that of the schedule it picks, and every schedule's prediction is compared with its measurement
// (error = predicted / measured - 1).
//
// Nodes: ranks_per_node = 4. --nodes 2 puts node k's ranks in the network namespace furnace_nk
// (two_nodes.sh up) bound to 10.77.0.(k+1), so traffic between nodes crosses the rate-limited veth;
// --nodes 1 runs everything over 127.0.0.1. Bytes are the executor's per-op counters (logical
// bytes, executor.h), summed over the ranks and split by link class: an op on a group whose
// members all sit on one node is "intra", otherwise "inter" (the same split in both modes). A
// fused op's bytes are half all-to-all, half all-gather once summed over the ranks (what the ep
// group sends it receives), which is how they are split between its two groups.
//
//   OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 GOMP_SPINCOUNT=1000 build/bin/bench_parm --nodes 1
//       --json bench/parm/results/nodes1.json       (bench/parm/run.sh runs both modes)
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/common/stats.h"
#include "bench/distributed/fork_ranks.h"
#include "bench/parm/netns.h"
#include "bench/parm/parm_layer.h"
#include "kernels/blas.h"
#include "nlohmann/json.hpp"
#include "runtime/base/status.h"
#include "runtime/comm/file_kv_store.h"
#include "runtime/comm/gloo_communicator.h"
#include "runtime/device/backend.h"
#include "runtime/moe/calibrate.h"
#include "runtime/moe/cost_model.h"
#include "runtime/moe/trial.h"
#include "runtime/topology/topology.h"
#include "runtime/train/rank_layout.h"

namespace {

using json = nlohmann::json;
namespace bench = furnace::bench;
namespace moe = furnace::moe;
namespace topology = furnace::topology;

constexpr int kWorld = 8;
constexpr int kRanksPerNode = 4;
// EP outermost: the EP group spans the nodes (one member per node when ep = 2), tp and esp stay
// inside a node, as in Parm's setting (MP = ESP intra-node, EP inter-node).
constexpr char kMoeOrder[] = "esp-edp-ep";
constexpr double kNoiseMargin = 0.03;  // auto "slower than deepspeed" only beyond 3%
constexpr double kNearBest = 0.05;

struct Layout {
  int tp, ep, esp;
};

struct Flags {
  int nodes = 1;
  std::string json_path;
  bool quick = false;
  int reps = 5, warmup = 1, threads = 1;
  uint64_t seed = 1;
  double timeout_s = 120;
  std::string link = "loopback";  // a label for the report (two_nodes.sh --rate)
  std::vector<int64_t> calib_sizes = {32 << 10, 256 << 10, 2 << 20};
  int calib_repeats = 3;
};

std::vector<Layout> Layouts(bool quick) {
  if (quick) return {{2, 4, 2}, {4, 2, 4}};
  return {{2, 4, 2}, {4, 2, 2}, {2, 2, 2}, {4, 2, 4}};
}

// Tokens per rank (T, B = 1) x d_model x (E, k, f / C).
std::vector<bench::LayerConfig> Shapes(bool quick, uint64_t seed) {
  struct Ek {
    int E, k, f_mult;
  };
  std::vector<int> tokens = {256, 1024}, widths = {64, 256};
  std::vector<Ek> eks = {{8, 1, 4}, {8, 2, 2}, {16, 4, 2}};
  if (quick) {
    tokens = {256};
    widths = {64};
    eks = {{8, 1, 4}, {8, 2, 2}};
  }
  std::vector<bench::LayerConfig> out;
  for (int T : tokens) {
    for (int C : widths) {
      for (const Ek& e : eks) out.push_back({1, T, C, e.f_mult * C, e.E, e.k, seed});
    }
  }
  return out;
}

topology::ParallelSizes SizesOf(const Layout& l) {
  topology::ParallelSizes s;
  s.tp = l.tp;
  s.dp = kWorld / l.tp;
  s.ep = l.ep;
  s.esp = l.esp;
  s.moe_order = kMoeOrder;
  return s;
}

// A model config the layouts accept; the layer shapes are checked by RankLayer.
furnace::model::ModelConfig LayoutModel() {
  furnace::model::ModelConfig c;
  c.vocab = 64;
  c.seq_len = 64;
  c.d_model = 256;
  c.heads = 8;
  c.layers = 1;
  c.moe_every = 1;
  c.dense_ffn = 256;
  c.experts = 16;
  c.expert_ffn = 512;
  c.top_k = 2;
  return c;
}

std::string RankFile(const std::string& dir, int rank) {
  return absl::StrCat(dir, "/rank-", rank, ".json");
}

// The GEMM and row-copy timers calibration fits (the same BLAS as the experts, on this rank).
moe::CalibrationOptions CalibrationFor(const Flags& f, const furnace::device::Backend& ops) {
  moe::CalibrationOptions o;
  o.sizes_bytes = f.calib_sizes;
  o.repeats = f.calib_repeats;
  o.gemm_flops = {int64_t{1} << 22, int64_t{1} << 25, int64_t{1} << 28};
  o.gemm_seconds = [&ops](int64_t flops) {
    const int d = std::max(1, static_cast<int>(std::cbrt(static_cast<double>(flops) / 2)));
    std::vector<float> a(int64_t{d} * d, 0.5f), b(int64_t{d} * d, 0.25f), c(int64_t{d} * d);
    const double t0 = bench::Now();
    ops.matmul_forward(c.data(), a.data(), b.data(), nullptr, d, d, d);
    return bench::Now() - t0;
  };
  o.copy_seconds = [](int64_t bytes) {
    std::vector<char> src(bytes, 1), dst(bytes);
    const double t0 = bench::Now();
    std::memcpy(dst.data(), src.data(), bytes);
    return bench::Now() - t0;
  };
  return o;
}

moe::LayerShape LayerShapeOf(const bench::LayerConfig& sh, const Layout& l, bool esp_is_tp) {
  moe::LayerShape ls;
  ls.N = int64_t{sh.B} * sh.T;
  ls.C = sh.C;
  ls.f = sh.f;
  ls.E = sh.E;
  ls.k = sh.k;
  ls.tp = l.tp;
  ls.ep = l.ep;
  ls.esp = l.esp;
  ls.esp_is_tp = esp_is_tp;
  return ls;
}

absl::Status RunRank(const Flags& f, const Layout& l, const std::vector<bench::LayerConfig>& shapes,
                     const std::string& dir, int rank) {
  furnace::kernels::cpu::SetBlasThreads(f.threads);
  std::string host = "127.0.0.1";
  if (f.nodes == 2) {
    ASSIGN_OR_RETURN(host, bench::EnterNode(rank / kRanksPerNode));
  }
  const furnace::model::ModelConfig mc = LayoutModel();
  ASSIGN_OR_RETURN(topology::Topology topo,
                   topology::Topology::Create(SizesOf(l), kWorld, furnace::train::DimsOf(mc)));
  furnace::comm::FileKvStore store(dir + "/kv");
  const furnace::train::CommFactory factory = [&](const std::string& prefix,
                                                  const std::string& name, int r, int size) {
    furnace::comm::GlooOptions o;
    o.rank = r;
    o.size = size;
    o.host = host;
    o.timeout_s = f.timeout_s;
    return furnace::comm::CreateGlooCommunicator(store, prefix, name, r, size, o);
  };
  ASSIGN_OR_RETURN(std::unique_ptr<furnace::train::RankLayout> layout,
                   furnace::train::BuildRankLayout(topo, rank, mc, factory));

  ASSIGN_OR_RETURN(const furnace::device::Backend* ops,
                   furnace::device::BackendFor(furnace::device::Kind::kCpu));
  const double t_cal = bench::Now();
  ASSIGN_OR_RETURN(moe::CostProfile profile, moe::Calibrate({layout->world.get(), layout->tp.get(),
                                                             layout->ep.get(), layout->esp.get()},
                                                            CalibrationFor(f, *ops)));
  json out;
  out["rank"] = rank;
  out["calibration_s"] = bench::Now() - t_cal;
  if (rank == 0) out["profile"] = json::parse(profile.ToJson());

  json configs = json::array();
  const int runs = f.warmup + f.reps;
  for (const bench::LayerConfig& shape : shapes) {
    ASSIGN_OR_RETURN(std::unique_ptr<bench::RankLayer> layer,
                     bench::RankLayer::Create(shape, layout->shard, layout->model_groups()));
    // auto's trial, as ChooseMoeSchedules runs it (every rank alike: the same profile).
    const moe::LayerShape ls = LayerShapeOf(shape, l, layout->esp_is_tp);
    ASSIGN_OR_RETURN(
        const moe::Choice trial,
        moe::MeasureSchedules(moe::ChooseSchedule(profile, ls), ls, layout->world.get(),
                              [&layer](moe::Schedule s) -> absl::StatusOr<double> {
                                ASSIGN_OR_RETURN(const bench::LayerTimes t,
                                                 layer->Run(s, nullptr, nullptr));
                                return t.fwd_s + t.bwd_s;
                              }));
    std::map<moe::Schedule, moe::ExchangeCounters> counters;
    std::map<moe::Schedule, std::vector<double>> fwd, bwd;
    for (int rep = 0; rep < runs; ++rep) {
      for (int j = 0; j < 3; ++j) {
        const moe::Schedule s = moe::kAllSchedules[(rep + j) % 3];
        RETURN_IF_ERROR(layout->world->Barrier());
        absl::StatusOr<bench::LayerTimes> t = layer->Run(s, &counters[s], nullptr);
        if (!t.ok()) {
          return absl::Status(t.status().code(),
                              absl::StrCat(moe::ScheduleName(s), " N=", shape.B * shape.T,
                                           " C=", shape.C, ": ", t.status().message()));
        }
        if (rep < f.warmup) continue;
        fwd[s].push_back(t->fwd_s);
        bwd[s].push_back(t->bwd_s);
      }
    }
    json per;
    for (moe::Schedule s : moe::kAllSchedules) {
      json op_bytes;
      for (const auto& [name, e] : counters[s].Snapshot()) {
        op_bytes[name] = {
            {"bytes", e.bytes / runs}, {"calls", e.calls / runs}, {"seconds", e.seconds / runs}};
      }
      per[moe::ScheduleName(s)] = {{"fwd", fwd[s]}, {"bwd", bwd[s]}, {"ops", op_bytes}};
    }
    per["trial"] = {{"schedule", moe::ScheduleName(trial.schedule)},
                    {"reason", trial.reason},
                    {"measured_s", trial.measured_s}};
    configs.push_back(std::move(per));
  }
  out["configs"] = std::move(configs);
  std::ofstream file(RankFile(dir, rank));
  file << out.dump();
  file.close();
  return file ? absl::OkStatus() : absl::InternalError("cannot write the rank's results");
}

// ---- the parent: aggregation ----

// The groups (primary, all-gather's) an op's bytes were counted on, by its counter name.
std::map<std::string, std::pair<moe::OpGroup, moe::OpGroup>> OpGroupsByName() {
  std::map<std::string, std::pair<moe::OpGroup, moe::OpGroup>> m;
  for (moe::Schedule s : moe::kAllSchedules) {
    for (bool sliced : {false, true}) {
      for (const auto& list : {moe::ForwardOps(s, sliced), moe::BackwardOps(s, sliced)}) {
        for (const moe::Op& op : list) m[op.Name()] = {op.group, op.ag_group};
      }
    }
  }
  const moe::Op gate_stats{moe::OpKind::kGate, moe::OpGroup::kTp};
  const moe::Op counts{moe::OpKind::kCounts, moe::OpGroup::kEp};
  m[gate_stats.Name()] = {gate_stats.group, moe::OpGroup::kNone};
  m[counts.Name()] = {counts.group, moe::OpGroup::kNone};
  return m;
}

topology::GroupKind KindOf(moe::OpGroup g) {
  switch (g) {
    case moe::OpGroup::kTp:
      return topology::GroupKind::kTensor;
    case moe::OpGroup::kEp:
      return topology::GroupKind::kExpert;
    default:
      return topology::GroupKind::kExpertShard;
  }
}

// Whether rank's group g lies on one node.
bool IntraNode(const topology::Topology& topo, moe::OpGroup g, int rank) {
  std::set<int> nodes;
  for (int member : topo.Group(KindOf(g), rank)) nodes.insert(member / kRanksPerNode);
  return nodes.size() <= 1;
}

struct Measured {
  std::vector<double> fwd, bwd, total;  // per rep, the slowest rank
  double fwd_med = 0, bwd_med = 0, total_med = 0;
  int64_t intra_bytes = 0, inter_bytes = 0;  // per fwd+bwd, summed over the ranks
  std::map<std::string, int64_t> group_bytes;
};

json SummaryOf(const std::vector<double>& v) { return bench::Summary(v); }

std::string Env(const char* name) {
  const char* e = std::getenv(name);
  return e == nullptr ? "" : e;
}

double Percentile50(std::vector<double> v) { return bench::Median(std::move(v)); }

}  // namespace

int main(int argc, char** argv) {
  Flags f;
  CLI::App app{"bench_parm: the MoE layer under deepspeed / s1 / s2 / auto on 8 forked ranks"};
  app.option_defaults()->always_capture_default();
  app.add_option("--nodes", f.nodes, "1: loopback; 2: two emulated nodes (two_nodes.sh up)")
      ->check(CLI::Range(1, 2));
  app.add_option("--json", f.json_path, "write the results here");
  app.add_flag("--quick", f.quick, "a small grid (smoke test)");
  app.add_option("--reps", f.reps, "timed repetitions per schedule")->check(CLI::PositiveNumber);
  app.add_option("--warmup", f.warmup, "untimed repetitions first");
  app.add_option("--threads", f.threads, "BLAS threads per rank")->check(CLI::PositiveNumber);
  app.add_option("--seed", f.seed);
  app.add_option("--timeout_s", f.timeout_s, "rendezvous and every collective");
  app.add_option("--calib_sizes", f.calib_sizes, "calibration message sizes, bytes");
  app.add_option("--calib_repeats", f.calib_repeats, "calibration repeats per size")
      ->check(CLI::PositiveNumber);
  app.add_option("--link", f.link, "label of the inter-node link, for the report");
  CLI11_PARSE(app, argc, argv);
  if (f.nodes == 2) {
    std::string why;
    if (!bench::NodesExist(&why)) {
      std::fprintf(stderr, "bench_parm: --nodes 2 needs bench/parm/two_nodes.sh up: %s\n",
                   why.c_str());
      return 1;
    }
  } else {
    f.link = "loopback";
  }

  const std::vector<Layout> layouts = Layouts(f.quick);
  const std::vector<bench::LayerConfig> shapes = Shapes(f.quick, f.seed);
  const auto op_groups = OpGroupsByName();
  json result_layouts = json::array();
  // Per config: the measured totals, for the summary.
  struct Row {
    std::string name, layout;
    double ds, s1, s2, autot, modelt, best;
    std::string pick, model_pick, best_name;
    std::vector<double> pred_err_total, pred_err_fwd, pred_err_bwd;
  };
  std::vector<Row> rows;

  std::printf(
      "| layout | N | C | f | E | k | deepspeed ms | s1/ds | s2/ds | model | model/ds | auto | "
      "auto/ds | auto/best | inter MB ds/s1/s2 |\n"
      "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (const Layout& l : layouts) {
    char tmpl[] = "/tmp/bench_parm.XXXXXX";
    if (mkdtemp(tmpl) == nullptr) {
      std::perror("mkdtemp");
      return 1;
    }
    const std::string dir = tmpl;
    const double t0 = bench::Now();
    const std::vector<std::string> failed = bench::RunForked(
        kWorld,
        [&](int rank) {
          const absl::Status s = RunRank(f, l, shapes, dir, rank);
          if (!s.ok()) std::fprintf(stderr, "rank %d: %s\n", rank, s.ToString().c_str());
          return s.ok() ? 0 : 1;
        },
        120 + 4 * f.timeout_s + 60.0 * static_cast<double>(shapes.size()));
    const double wall = bench::Now() - t0;
    for (int r = 0; r < kWorld; ++r) {
      if (!failed[r].empty()) {
        std::fprintf(stderr, "bench_parm: tp %d ep %d esp %d: rank %d %s\n", l.tp, l.ep, l.esp, r,
                     failed[r].c_str());
        std::filesystem::remove_all(dir);
        return 1;
      }
    }
    std::vector<json> ranks(kWorld);
    for (int r = 0; r < kWorld; ++r) {
      std::ifstream in(RankFile(dir, r));
      ranks[r] = json::parse(in);
    }
    std::filesystem::remove_all(dir);
    absl::StatusOr<moe::CostProfile> profile =
        moe::CostProfile::FromJson(ranks[0]["profile"].dump());
    absl::StatusOr<topology::Topology> topo =
        topology::Topology::Create(SizesOf(l), kWorld, furnace::train::DimsOf(LayoutModel()));
    if (!profile.ok() || !topo.ok()) {
      std::fprintf(stderr, "bench_parm: %s %s\n", profile.status().ToString().c_str(),
                   topo.status().ToString().c_str());
      return 1;
    }
    json groups;
    for (moe::OpGroup g : moe::kCommGroups) {
      groups[moe::OpGroupName(g)] = {{"members", topo->Group(KindOf(g), 0)},
                                     {"intra_node", IntraNode(*topo, g, 0)}};
    }
    json jl = {{"tp", l.tp},
               {"ep", l.ep},
               {"esp", l.esp},
               {"dp", kWorld / l.tp},
               {"moe_order", kMoeOrder},
               {"esp_is_tp", topo->EspGroupIsTpGroup()},
               {"groups_of_rank0", groups},
               {"calibration_s", ranks[0]["calibration_s"]},
               {"wall_s", wall},
               {"profile", ranks[0]["profile"]}};
    json jconfigs = json::array();
    for (size_t c = 0; c < shapes.size(); ++c) {
      const bench::LayerConfig& sh = shapes[c];
      const moe::LayerShape ls = LayerShapeOf(sh, l, topo->EspGroupIsTpGroup());
      const moe::Choice choice = moe::ChooseSchedule(*profile, ls);
      const json& trial = ranks[0]["configs"][c]["trial"];
      const std::optional<moe::Schedule> trial_pick =
          moe::ParseSchedule(trial["schedule"].get<std::string>());
      if (!trial_pick.has_value()) {
        std::fprintf(stderr, "bench_parm: bad trial schedule %s\n", trial.dump().c_str());
        return 1;
      }
      std::map<moe::Schedule, Measured> m;
      json js;
      Row row;
      row.layout = absl::StrFormat("tp %d ep %d esp %d", l.tp, l.ep, l.esp);
      row.name = absl::StrFormat("tp%d ep%d esp%d N%d C%d f%d E%d k%d", l.tp, l.ep, l.esp,
                                 sh.B * sh.T, sh.C, sh.f, sh.E, sh.k);
      for (moe::Schedule s : moe::kAllSchedules) {
        const std::string name = moe::ScheduleName(s);
        Measured& me = m[s];
        me.fwd.assign(f.reps, 0);
        me.bwd.assign(f.reps, 0);
        me.total.assign(f.reps, 0);
        for (int r = 0; r < kWorld; ++r) {
          const json& jr = ranks[r]["configs"][c][name];
          for (int i = 0; i < f.reps; ++i) {
            const double a = jr["fwd"][i].get<double>(), b = jr["bwd"][i].get<double>();
            me.fwd[i] = std::max(me.fwd[i], a);
            me.bwd[i] = std::max(me.bwd[i], b);
            me.total[i] = std::max(me.total[i], a + b);
          }
          for (const auto& [op, e] : jr["ops"].items()) {
            const int64_t bytes = e["bytes"].get<int64_t>();
            auto it = op_groups.find(op);
            if (it == op_groups.end()) {
              me.group_bytes["unknown"] += bytes;
              continue;
            }
            const auto [g, ag] = it->second;
            const bool fused = ag != moe::OpGroup::kNone;
            const int64_t first = fused ? bytes / 2 : bytes;
            for (const auto& [grp, b] : {std::pair{g, first}, std::pair{ag, bytes - first}}) {
              if (grp == moe::OpGroup::kNone || b == 0) continue;
              me.group_bytes[moe::OpGroupName(grp)] += b;
              (IntraNode(*topo, grp, r) ? me.intra_bytes : me.inter_bytes) += b;
            }
          }
        }
        me.fwd_med = bench::Median(me.fwd);
        me.bwd_med = bench::Median(me.bwd);
        me.total_med = bench::Median(me.total);
        const moe::Prediction& p = choice.all[static_cast<int>(s)];
        const double err_fwd = p.forward_s / me.fwd_med - 1;
        const double err_bwd = p.backward_s / me.bwd_med - 1;
        const double err_total = p.total_s() / me.total_med - 1;
        row.pred_err_fwd.push_back(err_fwd);
        row.pred_err_bwd.push_back(err_bwd);
        row.pred_err_total.push_back(err_total);
        js[name] = {{"fwd_s", SummaryOf(me.fwd)},       {"bwd_s", SummaryOf(me.bwd)},
                    {"fwd_bwd_s", SummaryOf(me.total)}, {"bytes_intra", me.intra_bytes},
                    {"bytes_inter", me.inter_bytes},    {"bytes_by_group", me.group_bytes},
                    {"predicted_fwd_s", p.forward_s},   {"predicted_bwd_s", p.backward_s},
                    {"prediction_error_fwd", err_fwd},  {"prediction_error_bwd", err_bwd},
                    {"prediction_error", err_total}};
      }
      row.ds = m[moe::Schedule::kDeepspeed].total_med;
      row.s1 = m[moe::Schedule::kS1].total_med;
      row.s2 = m[moe::Schedule::kS2].total_med;
      row.model_pick = moe::ScheduleName(choice.schedule);
      row.modelt = m[choice.schedule].total_med;
      row.pick = moe::ScheduleName(*trial_pick);
      row.autot = m[*trial_pick].total_med;
      row.best = std::min({row.ds, row.s1, row.s2});
      row.best_name = row.best == row.ds ? "deepspeed" : (row.best == row.s1 ? "s1" : "s2");
      jconfigs.push_back({{"N", ls.N},
                          {"C", sh.C},
                          {"f", sh.f},
                          {"E", sh.E},
                          {"k", sh.k},
                          {"schedules", js},
                          {"auto", row.pick},
                          {"auto_reason", trial["reason"]},
                          {"auto_trial_measured_s", trial["measured_s"]},
                          {"model", row.model_pick},
                          {"model_reason", choice.reason},
                          {"best_measured", row.best_name},
                          {"ratio_s1_ds", row.s1 / row.ds},
                          {"ratio_s2_ds", row.s2 / row.ds},
                          {"ratio_auto_ds", row.autot / row.ds},
                          {"ratio_auto_best", row.autot / row.best},
                          {"ratio_model_ds", row.modelt / row.ds},
                          {"ratio_model_best", row.modelt / row.best}});
      std::printf(
          "| %d,%d,%d | %lld | %d | %d | %d | %d | %.1f | %.2f | %.2f | %s | %.2f | %s | %.2f | "
          "%.2f | %.1f/%.1f/%.1f |\n",
          l.tp, l.ep, l.esp, static_cast<long long>(ls.N), sh.C, sh.f, sh.E, sh.k, row.ds * 1e3,
          row.s1 / row.ds, row.s2 / row.ds, row.model_pick.c_str(), row.modelt / row.ds,
          row.pick.c_str(), row.autot / row.ds, row.autot / row.best,
          m[moe::Schedule::kDeepspeed].inter_bytes / 1e6, m[moe::Schedule::kS1].inter_bytes / 1e6,
          m[moe::Schedule::kS2].inter_bytes / 1e6);
      std::fflush(stdout);
      rows.push_back(std::move(row));
    }
    jl["configs"] = std::move(jconfigs);
    result_layouts.push_back(std::move(jl));
  }

  // Summary.
  int violations = 0, near_best = 0, auto_is_best = 0;
  int model_violations = 0, model_near_best = 0, model_is_best = 0;
  std::vector<double> speedups, abs_err, abs_err_fwd, abs_err_bwd;
  for (const Row& r : rows) {
    if (r.autot > r.ds * (1 + kNoiseMargin)) ++violations;
    if (r.autot <= r.best * (1 + kNearBest)) ++near_best;
    if (r.pick == r.best_name) ++auto_is_best;
    if (r.modelt > r.ds * (1 + kNoiseMargin)) ++model_violations;
    if (r.modelt <= r.best * (1 + kNearBest)) ++model_near_best;
    if (r.model_pick == r.best_name) ++model_is_best;
    speedups.push_back(r.ds / std::min(r.s1, r.s2));
    for (double e : r.pred_err_total) abs_err.push_back(std::fabs(e));
    for (double e : r.pred_err_fwd) abs_err_fwd.push_back(std::fabs(e));
    for (double e : r.pred_err_bwd) abs_err_bwd.push_back(std::fabs(e));
  }
  std::map<std::string, std::vector<double>> layout_speedups;
  for (const Row& r : rows) layout_speedups[r.layout].push_back(r.ds / std::min(r.s1, r.s2));
  json per_layout;
  for (const auto& [name, v] : layout_speedups) {
    per_layout[name] = {{"min", *std::min_element(v.begin(), v.end())},
                        {"median", Percentile50(v)},
                        {"max", *std::max_element(v.begin(), v.end())}};
  }
  const int n = static_cast<int>(rows.size());
  const double sp_min = *std::min_element(speedups.begin(), speedups.end());
  const double sp_max = *std::max_element(speedups.begin(), speedups.end());
  json summary = {{"configs", n},
                  {"noise_margin", kNoiseMargin},
                  {"auto_slower_than_deepspeed", violations},
                  {"auto_within_5pct_of_best", near_best},
                  {"auto_within_5pct_of_best_fraction", static_cast<double>(near_best) / n},
                  {"auto_is_measured_best", auto_is_best},
                  {"model_slower_than_deepspeed", model_violations},
                  {"model_within_5pct_of_best", model_near_best},
                  {"model_is_measured_best", model_is_best},
                  {"speedup_best_parm_over_deepspeed",
                   {{"min", sp_min}, {"median", Percentile50(speedups)}, {"max", sp_max}}},
                  {"speedup_by_layout", per_layout},
                  {"median_abs_prediction_error", Percentile50(abs_err)},
                  {"median_abs_prediction_error_fwd", Percentile50(abs_err_fwd)},
                  {"median_abs_prediction_error_bwd", Percentile50(abs_err_bwd)}};
  std::printf("\nbench_parm --nodes %d (%s), %d configs, %d reps (median; a rep = slowest rank)\n",
              f.nodes, f.link.c_str(), n, f.reps);
  std::printf("  auto slower than deepspeed by > %.0f%%: %d of %d configs\n", kNoiseMargin * 100,
              violations, n);
  std::printf("  auto within %.0f%% of the measured best: %d of %d (%.0f%%); auto = best: %d\n",
              kNearBest * 100, near_best, n, 100.0 * near_best / n, auto_is_best);
  std::printf(
      "  the cost model alone (auto before its trial): slower than deepspeed in %d, within "
      "%.0f%% of the best in %d (%.0f%%), = best in %d\n",
      model_violations, kNearBest * 100, model_near_best, 100.0 * model_near_best / n,
      model_is_best);
  std::printf(
      "  best Parm schedule (min of s1, s2) over deepspeed: %.2fx .. %.2fx (median %.2fx)\n",
      sp_min, sp_max, Percentile50(speedups));
  for (const auto& [name, v] : per_layout.items()) {
    std::printf("    %s: %.2fx .. %.2fx (median %.2fx)\n", name.c_str(), v["min"].get<double>(),
                v["max"].get<double>(), v["median"].get<double>());
  }
  std::printf("  median |prediction error|: %.0f%% fwd+bwd (fwd %.0f%%, bwd %.0f%%)\n",
              100 * Percentile50(abs_err), 100 * Percentile50(abs_err_fwd),
              100 * Percentile50(abs_err_bwd));

  if (!f.json_path.empty()) {
    json env;
    for (const char* v : {"OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "GOMP_SPINCOUNT"}) {
      env[v] = Env(v);
    }
    char date[64];
    const std::time_t now = std::time(nullptr);
    std::strftime(date, sizeof(date), "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
    json out = {{"bench", "bench_parm"},
                {"nodes", f.nodes},
                {"ranks_per_node", kRanksPerNode},
                {"world", kWorld},
                {"link", f.link},
                {"reps", f.reps},
                {"warmup", f.warmup},
                {"threads", f.threads},
                {"quick", f.quick},
                {"calib_sizes", f.calib_sizes},
                {"calib_repeats", f.calib_repeats},
                {"nproc", std::thread::hardware_concurrency()},
                {"date", date},
                {"env", env},
                {"layouts", result_layouts},
                {"summary", summary}};
    std::ofstream file(f.json_path);
    file << out.dump(1) << "\n";
    if (!file) {
      std::fprintf(stderr, "bench_parm: cannot write %s\n", f.json_path.c_str());
      return 1;
    }
  }
  return 0;
}
