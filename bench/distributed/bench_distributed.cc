// bench_distributed: trains the GPT-MoE on one parallel layout with one forked process per rank
// (Gloo over 127.0.0.1, rendezvous through a FileKvStore in a scratch directory), the same code
// path as a worker rank (BuildRankLayout + GptMoe shard + Trainer with a ParallelRuntime), and
// prints:
//   * step time (per step the slowest rank's StepStats::step_seconds; median, min-max over the
//     timed steps) and global tokens/s (B * T * m * dp per step over that time);
//   * the bytes each rank handed to each collective per step (StepStats::comm, over the groups);
//   * those bytes against the analytical count (layout_bytes.h), checked EXACTLY on every step,
//     warm-up included: per rank where the count does not depend on routing, else summed over the
//     ranks of one stage that hold the same experts (so also over all ranks). Any difference is
//     printed with the step, rank or group, and both numbers, and the exit code is 3.
// Defaults: the model dims of configs/demo.yaml (V=64 T=64 d=64 h=4 L=4 E=8 k=2 f=128, every
// layer MoE, dropless), B=8, m=2 (the single-rank demo's batch), one rank (pass --dp / --ep / ...).
//
//   OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 GOMP_SPINCOUNT=1000 build-bench/bin/bench_distributed
//       --dp 4 --ep 4 --steps 10 --warmup 3 [--json out.json]
//
// Exit codes: 0 ok, 1 a rank failed, 2 bad flags, 3 measured and analytical bytes differ.
#include <stdlib.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/common/stats.h"
#include "bench/distributed/fork_ranks.h"
#include "bench/distributed/layout_bytes.h"
#include "bench/distributed/rank_worker.h"
#include "nlohmann/json.hpp"
#include "runtime/train/rank_layout.h"

namespace {

using json = nlohmann::json;
using furnace::bench::Median;
using furnace::bench::OpBytes;
using furnace::bench::RankBytes;
using furnace::bench::RunConfig;
using furnace::bench::Summary;
namespace comm = furnace::comm;
namespace topology = furnace::topology;

constexpr int kOps = comm::kNumCollectiveOps;

// One exact comparison that failed.
struct Mismatch {
  int step;
  std::string op, scope;
  int64_t measured, analytical;
};

struct OpCheck {
  std::string scope;     // "per rank" or "per (stage, ep) group"
  int64_t measured = 0;  // summed over ranks and checked steps
  int64_t analytical = 0;
  int checks = 0, failed = 0;
};

}  // namespace

int main(int argc, char** argv) {
  RunConfig cfg;
  furnace::model::ModelConfig& mc = cfg.shape.model;
  // configs/demo.yaml
  mc.vocab = 64;
  mc.seq_len = 64;
  mc.d_model = 64;
  mc.heads = 4;
  mc.layers = 4;
  mc.experts = 8;
  mc.top_k = 2;
  mc.expert_ffn = 128;
  mc.moe_every = 1;
  cfg.shape.micro_batch = 8;
  cfg.shape.micro_batches = 2;
  std::string json_path, work_dir;
  bool keep_dir = false;
  int64_t perturb = 0;

  CLI::App app{"bench_distributed: one parallel layout, one process per rank (Gloo, loopback)"};
  app.option_defaults()->always_capture_default();
  app.add_option("--pp", cfg.sizes.pp, "pipeline stages")->check(CLI::PositiveNumber);
  app.add_option("--dp", cfg.sizes.dp, "data-parallel ranks")->check(CLI::PositiveNumber);
  app.add_option("--tp", cfg.sizes.tp, "tensor-parallel ranks")->check(CLI::PositiveNumber);
  app.add_option("--ep", cfg.sizes.ep, "expert-parallel ranks")->check(CLI::PositiveNumber);
  app.add_option("--esp", cfg.sizes.esp, "expert-sharding ranks")->check(CLI::PositiveNumber);
  app.add_option("--vocab", mc.vocab);
  app.add_option("--seq_len", mc.seq_len);
  app.add_option("--d_model", mc.d_model);
  app.add_option("--heads", mc.heads);
  app.add_option("--layers", mc.layers);
  app.add_option("--moe_every", mc.moe_every, "1: every layer MoE; 2: every second");
  app.add_option("--dense_ffn", mc.dense_ffn, "dense MLP width (0: 4 * d_model)");
  app.add_option("--experts", mc.experts);
  app.add_option("--top_k", mc.top_k);
  app.add_option("--expert_ffn", mc.expert_ffn);
  app.add_option("--micro_batch", cfg.shape.micro_batch, "B per rank")->check(CLI::PositiveNumber);
  app.add_option("--micro_batches", cfg.shape.micro_batches, "m per data-parallel rank")
      ->check(CLI::PositiveNumber);
  app.add_option("--steps", cfg.steps, "timed steps")->check(CLI::PositiveNumber);
  app.add_option("--warmup", cfg.warmup, "untimed steps first")->check(CLI::NonNegativeNumber);
  app.add_option("--threads", cfg.blas_threads, "BLAS threads per rank")
      ->check(CLI::PositiveNumber);
  app.add_option("--seed", cfg.seed);
  app.add_option("--data_seed", cfg.data_seed);
  app.add_option("--lr", cfg.lr);
  app.add_option("--timeout_s", cfg.timeout_s, "rendezvous / collective timeout per rank");
  app.add_option("--json", json_path, "also write the results as JSON here");
  app.add_option("--work_dir", work_dir, "scratch dir (rendezvous, rank files); default: mkdtemp");
  app.add_flag("--keep_work_dir", keep_dir, "leave the scratch dir (rank JSON files) behind");
  app.add_option("--perturb_analytical", perturb,
                 "self-test of the checker: add this many bytes to rank 0's analytical all_reduce "
                 "and all_to_all (the run must then exit 3)");
  CLI11_PARSE(app, argc, argv);
  if (absl::Status s = mc.Validate(); !s.ok()) {
    std::fprintf(stderr, "bench_distributed: model: %s\n", s.ToString().c_str());
    return 2;
  }
  if (mc.capacity_factor != 0) {
    std::fprintf(stderr, "bench_distributed: only dropless routing is modelled\n");
    return 2;
  }
  const int world = cfg.sizes.world();
  absl::StatusOr<topology::Topology> topo =
      topology::Topology::Create(cfg.sizes, world, furnace::train::DimsOf(mc));
  if (!topo.ok()) {
    std::fprintf(stderr, "bench_distributed: layout: %s\n", topo.status().ToString().c_str());
    return 2;
  }
  if (work_dir.empty()) {
    char tmpl[] = "/tmp/bench_distributed.XXXXXX";
    if (mkdtemp(tmpl) == nullptr) {
      std::perror("mkdtemp");
      return 1;
    }
    work_dir = tmpl;
  } else {
    std::filesystem::remove_all(work_dir);
    std::filesystem::create_directories(work_dir);
  }

  const double deadline = 60 + cfg.timeout_s * 2 + 30.0 * (cfg.steps + cfg.warmup);
  const std::vector<std::string> failed = furnace::bench::RunForked(
      world,
      [&](int rank) {
        const absl::Status s = furnace::bench::RunRank(cfg, work_dir, rank);
        if (!s.ok()) std::fprintf(stderr, "rank %d: %s\n", rank, s.ToString().c_str());
        return s.ok() ? 0 : 1;
      },
      deadline);
  bool any_failed = false;
  for (int r = 0; r < world; ++r) {
    if (!failed[r].empty()) {
      std::fprintf(stderr, "bench_distributed: rank %d %s\n", r, failed[r].c_str());
      any_failed = true;
    }
  }
  if (any_failed) return 1;

  std::vector<json> ranks(world);
  for (int r = 0; r < world; ++r) {
    std::ifstream in(furnace::bench::RankFile(work_dir, r));
    try {
      ranks[r] = json::parse(in);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "bench_distributed: rank %d's results: %s\n", r, e.what());
      return 1;
    }
  }
  if (!keep_dir) std::filesystem::remove_all(work_dir);

  const topology::ParallelSizes& z = cfg.sizes;
  const int total_steps = cfg.warmup + cfg.steps;
  const int64_t N = int64_t{cfg.shape.micro_batch} * mc.seq_len;
  const double global_tokens = static_cast<double>(N) * cfg.shape.micro_batches * z.dp;

  // Times: per step, the slowest rank.
  std::vector<double> step_s, fb_s, sync_s, opt_s, tps;
  for (int s = cfg.warmup; s < total_steps; ++s) {
    double st = 0, fb = 0, sy = 0, op = 0;
    for (int r = 0; r < world; ++r) {
      const json& j = ranks[r]["steps"][s];
      st = std::max(st, j["step_s"].get<double>());
      fb = std::max(fb, j["forward_backward_s"].get<double>());
      sy = std::max(sy, j["sync_s"].get<double>());
      op = std::max(op, j["optimizer_s"].get<double>());
    }
    step_s.push_back(st);
    fb_s.push_back(fb);
    sync_s.push_back(sy);
    opt_s.push_back(op);
    tps.push_back(global_tokens / st);
  }

  // Analytical bytes per rank.
  std::vector<RankBytes> expect(world);
  for (int r = 0; r < world; ++r)
    expect[r] = furnace::bench::AnalyticalRankBytes(*topo, r, cfg.shape);
  expect[0].fixed[static_cast<int>(comm::CollectiveOp::kAllReduce)] += perturb;
  expect[0].fixed[static_cast<int>(comm::CollectiveOp::kAllToAll)] += perturb;

  std::vector<OpCheck> checks(kOps);
  std::vector<Mismatch> mismatches;
  std::vector<std::string> routing_errors;
  int row_checks = 0;  // per-rank consistency checks of the routed rows (ep > 1)
  auto measured = [&](int r, int s, int op) {
    return ranks[r]["steps"][s]["comm_bytes"][op].get<int64_t>();
  };
  for (int s = 0; s < total_steps; ++s) {
    const auto tpe =
        ranks[0]["steps"][s]["tokens_per_expert"].get<std::vector<std::vector<int64_t>>>();
    // Dropless: every MoE layer routes exactly N * k assignments per micro-batch and dp rank.
    for (size_t l = 0; l < tpe.size(); ++l) {
      int64_t sum = 0;
      for (int64_t c : tpe[l]) sum += c;
      const int64_t want = N * mc.top_k * cfg.shape.micro_batches * z.dp;
      if (sum != want) {
        routing_errors.push_back(absl::StrCat("step ", s, " MoE layer ", l, ": ", sum,
                                              " assignments, want N*k*m*dp = ", want));
      }
    }
    // Per rank, where routing decides: the routed part of each count must be whole rows, and the
    // rows it implies must agree between collectives: A from the all-to-all = A from the ESP
    // all-gather, and R (reduce-scatter) = the sum of A over the rank's ESP group.
    if (z.ep > 1) {
      const int a2a = static_cast<int>(comm::CollectiveOp::kAllToAll);
      const int ag = static_cast<int>(comm::CollectiveOp::kAllGather);
      const int rs = static_cast<int>(comm::CollectiveOp::kReduceScatter);
      std::vector<int64_t> rows(world);
      for (int r = 0; r < world; ++r) {
        const int64_t routed = measured(r, s, a2a) - expect[r].fixed[a2a];
        const int64_t per_row = expect[r].per_ep_row[a2a];
        rows[r] = routed / per_row;
        ++row_checks;
        if (routed < 0 || routed % per_row != 0) {
          mismatches.push_back({s, "all_to_all (whole rows)", absl::StrCat("rank ", r),
                                measured(r, s, a2a), expect[r].fixed[a2a] + rows[r] * per_row});
        }
      }
      // (Sliced experts gather nothing: their all-reduce is checked with the other ops below.)
      for (int r = 0; z.esp > 1 && expect[r].gather > 1 && r < world; ++r) {
        const int64_t per_row = expect[r].per_ep_row[ag];
        const int64_t want_ag = expect[r].fixed[ag] + rows[r] * per_row;
        int64_t group_rows = 0;
        for (int q : topo->Group(topology::GroupKind::kExpertShard, r)) group_rows += rows[q];
        const int64_t want_rs = group_rows * expect[r].per_expert_row[rs];
        row_checks += 2;
        if (measured(r, s, ag) != want_ag) {
          mismatches.push_back({s, "all_gather (rows of the all_to_all)", absl::StrCat("rank ", r),
                                measured(r, s, ag), want_ag});
        }
        if (measured(r, s, rs) != want_rs) {
          mismatches.push_back({s, "reduce_scatter (ESP group's rows)", absl::StrCat("rank ", r),
                                measured(r, s, rs), want_rs});
        }
      }
    }
    for (int op = 0; op < kOps; ++op) {
      const char* name = comm::CollectiveOpName(static_cast<comm::CollectiveOp>(op));
      bool routed = false;
      for (int r = 0; r < world; ++r) {
        routed |= !expect[r].exact_per_rank &&
                  (expect[r].per_ep_row[op] != 0 || expect[r].per_expert_row[op] != 0);
      }
      OpCheck& c = checks[op];
      if (!routed) {
        c.scope = "per rank";
        for (int r = 0; r < world; ++r) {
          const int64_t m = measured(r, s, op), a = expect[r].ExactTotal(op);
          c.measured += m;
          c.analytical += a;
          ++c.checks;
          if (m != a) {
            ++c.failed;
            mismatches.push_back({s, name, absl::StrCat("rank ", r), m, a});
          }
        }
        continue;
      }
      c.scope = "per (stage, ep) group";
      std::map<std::pair<int, int>, std::pair<int64_t, int64_t>> groups;  // -> measured, fixed
      for (int r = 0; r < world; ++r) {
        auto& g = groups[{expect[r].stage, expect[r].ep_coord}];
        g.first += measured(r, s, op);
        g.second += expect[r].fixed[op];
      }
      for (const auto& [key, g] : groups) {
        const auto [stage, ep] = key;
        // Any rank of the group: same stage, so the same coefficients.
        const RankBytes* e = nullptr;
        for (const RankBytes& x : expect) {
          if (x.stage == stage && x.ep_coord == ep) e = &x;
        }
        const int64_t a_rows =
            z.tp * furnace::bench::AssignmentsToExperts(*topo, mc, tpe, stage, ep);
        const int64_t a =
            g.second + e->per_ep_row[op] * a_rows + e->per_expert_row[op] * e->gather * a_rows;
        c.measured += g.first;
        c.analytical += a;
        ++c.checks;
        if (g.first != a) {
          ++c.failed;
          mismatches.push_back({s, name, absl::StrCat("stage ", stage, " ep ", ep), g.first, a});
        }
      }
    }
  }

  // Report.
  std::printf(
      "bench_distributed: layout pp=%d dp=%d tp=%d ep=%d esp=%d (world %d, edp %d); "
      "model V=%d T=%d d=%d h=%d L=%d E=%d k=%d f=%d moe_every=%d; B=%d m=%d; "
      "%d warm-up + %d timed steps; %d BLAS thread(s) per rank\n",
      z.pp, z.dp, z.tp, z.ep, z.esp, world, topo->edp(), mc.vocab, mc.seq_len, mc.d_model, mc.heads,
      mc.layers, mc.experts, mc.top_k, mc.expert_ffn, mc.moe_every, cfg.shape.micro_batch,
      cfg.shape.micro_batches, cfg.warmup, cfg.steps, cfg.blas_threads);
  auto ms = [](const std::vector<double>& v) {
    return absl::StrFormat("%.2f ms (%.2f-%.2f)", Median(v) * 1e3,
                           *std::min_element(v.begin(), v.end()) * 1e3,
                           *std::max_element(v.begin(), v.end()) * 1e3);
  };
  std::printf("  step time (slowest rank), median (min-max): %s\n", ms(step_s).c_str());
  std::printf("    forward+backward %s | sync %s | optimizer %s\n", ms(fb_s).c_str(),
              ms(sync_s).c_str(), ms(opt_s).c_str());
  std::printf("  tokens/s (global, %.0f tokens/step): %.0f (%.0f-%.0f)\n", global_tokens,
              Median(tps), *std::min_element(tps.begin(), tps.end()),
              *std::max_element(tps.begin(), tps.end()));
  double setup = 0;
  for (const json& j : ranks) setup = std::max(setup, j["setup_s"].get<double>());
  std::printf("  group rendezvous (slowest rank): %.2f s\n", setup);

  std::printf("  bytes per step per rank (mean over the timed steps; calls in brackets):\n");
  std::printf("    %-5s %-22s", "rank", "coords pp/dp/tp/ep/esp");
  for (int op = 0; op < kOps; ++op) {
    std::printf(" %18s", comm::CollectiveOpName(static_cast<comm::CollectiveOp>(op)));
  }
  std::printf(" %8s\n", "inflight");
  json per_rank = json::array();
  for (int r = 0; r < world; ++r) {
    const json& co = ranks[r]["coords"];
    std::printf("    %-5d %-22s", r,
                absl::StrFormat("%d/%d/%d/%d/%d", co["pp"].get<int>(), co["dp"].get<int>(),
                                co["tp"].get<int>(), co["ep"].get<int>(), co["esp"].get<int>())
                    .c_str());
    std::vector<double> mean_bytes(kOps, 0), mean_calls(kOps, 0);
    int inflight = 0;
    for (int s = cfg.warmup; s < total_steps; ++s) {
      for (int op = 0; op < kOps; ++op) {
        mean_bytes[op] += measured(r, s, op) / static_cast<double>(cfg.steps);
        mean_calls[op] +=
            ranks[r]["steps"][s]["comm_calls"][op].get<int64_t>() / static_cast<double>(cfg.steps);
      }
      inflight = std::max(inflight, ranks[r]["steps"][s]["in_flight_peak"].get<int>());
    }
    for (int op = 0; op < kOps; ++op) {
      std::printf(" %18s", absl::StrFormat("%.0f [%.0f]", mean_bytes[op], mean_calls[op]).c_str());
    }
    std::printf(" %8d\n", inflight);
    per_rank.push_back({{"rank", r},
                        {"coords", co},
                        {"bytes_per_step", mean_bytes},
                        {"calls_per_step", mean_calls},
                        {"in_flight_peak", inflight},
                        {"analytical_fixed", expect[r].fixed},
                        {"exact_per_rank", expect[r].exact_per_rank}});
  }

  std::printf("  measured vs analytical bytes (every step, warm-up included; exact):\n");
  std::printf("    %-14s %-22s %16s %16s %12s %s\n", "collective", "checked", "measured",
              "analytical", "diff", "match");
  json check_json = json::object();
  for (int op = 0; op < kOps; ++op) {
    const OpCheck& c = checks[op];
    const char* name = comm::CollectiveOpName(static_cast<comm::CollectiveOp>(op));
    std::printf("    %-14s %-22s %16lld %16lld %12lld %s\n", name, c.scope.c_str(),
                static_cast<long long>(c.measured), static_cast<long long>(c.analytical),
                static_cast<long long>(c.measured - c.analytical),
                c.failed == 0 ? "yes" : absl::StrCat("NO (", c.failed, "/", c.checks, ")").c_str());
    check_json[name] = {{"scope", c.scope},
                        {"measured", c.measured},
                        {"analytical", c.analytical},
                        {"checks", c.checks},
                        {"failed", c.failed}};
  }
  if (row_checks > 0) {
    std::printf(
        "    per rank, routed part: whole rows, and all_to_all / all_gather / "
        "reduce_scatter imply the same rows: %d checks\n",
        row_checks);
  }
  for (const std::string& e : routing_errors) std::printf("  ROUTING: %s\n", e.c_str());
  const bool match = mismatches.empty() && routing_errors.empty();
  if (!match) {
    std::printf("  *** MISMATCH: %zu exact comparisons failed ***\n", mismatches.size());
    std::fprintf(stderr,
                 "bench_distributed: MISMATCH between measured and analytical bytes (%zu "
                 "comparisons, %zu routing errors); see stdout\n",
                 mismatches.size(), routing_errors.size());
    for (size_t i = 0; i < mismatches.size() && i < 20; ++i) {
      const Mismatch& m = mismatches[i];
      std::printf("    step %d %s %s: measured %lld, analytical %lld (diff %+lld)\n", m.step,
                  m.op.c_str(), m.scope.c_str(), static_cast<long long>(m.measured),
                  static_cast<long long>(m.analytical),
                  static_cast<long long>(m.measured - m.analytical));
    }
  } else {
    std::printf("  all byte counts match the analytical model exactly\n");
  }

  if (!json_path.empty()) {
    json out;
    out["layout"] = {{"pp", z.pp},   {"dp", z.dp},     {"tp", z.tp},        {"ep", z.ep},
                     {"esp", z.esp}, {"world", world}, {"edp", topo->edp()}};
    out["model"] = {
        {"vocab", mc.vocab},     {"seq_len", mc.seq_len}, {"d_model", mc.d_model},
        {"heads", mc.heads},     {"layers", mc.layers},   {"moe_every", mc.moe_every},
        {"experts", mc.experts}, {"top_k", mc.top_k},     {"expert_ffn", mc.expert_ffn}};
    out["micro_batch"] = cfg.shape.micro_batch;
    out["micro_batches"] = cfg.shape.micro_batches;
    out["steps"] = cfg.steps;
    out["warmup"] = cfg.warmup;
    out["blas_threads"] = cfg.blas_threads;
    out["global_tokens_per_step"] = global_tokens;
    out["step_s"] = Summary(step_s);
    out["forward_backward_s"] = Summary(fb_s);
    out["sync_s"] = Summary(sync_s);
    out["optimizer_s"] = Summary(opt_s);
    out["tokens_per_s"] = Summary(tps);
    out["setup_s"] = setup;
    out["loss_last"] = ranks[0]["steps"][total_steps - 1]["loss"];
    out["ranks"] = per_rank;
    out["bytes_check"] = check_json;
    out["row_checks"] = row_checks;
    out["match"] = match;
    out["perturb_analytical"] = perturb;
    json env;
    for (const char* v : {"OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "GOMP_SPINCOUNT"}) {
      const char* e = std::getenv(v);
      env[v] = e ? json(e) : json(nullptr);
    }
    out["env"] = env;
    std::ofstream f(json_path);
    f << out.dump(1) << "\n";
  }
  return match ? 0 : 3;
}
