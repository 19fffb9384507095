// bench_moe_layer: the expert-parallel MoE layer alone (MoeBlockForward + MoeBlockBackward, the
// code GptMoe runs for every MoE layer), one forked process per EP rank, the EP group a Gloo
// communicator over 127.0.0.1. Each rank routes its own (B, T, C) tokens; dropless; the dispatcher
// exchanges counts, then rows (all-to-all over EP), the rank's E/ep experts run, rows go back.
// bench/distributed/moe_layer_torch.py is the same layer in PyTorch (all_to_all_single over gloo).
//
// Per repetition: a barrier over the EP group, then forward and backward (d loss / d out = a fixed
// random (B, T, C) tensor, aux_scale 1), each timed on every rank; a repetition's time is the
// slowest rank's. Prints one JSON object: median / min / max of the fwd+bwd, fwd and bwd times
// over the timed repetitions, and the shapes.
//
//   OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 GOMP_SPINCOUNT=1000 build-bench/bin/bench_moe_layer
//       --ep 2 --reps 20 --warmup 3
// Defaults: BENCHMARKING.md's MoE shape d=256 E=8 k=2 f=512 T=128 b=8.
#include <stdlib.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "bench/common/stats.h"
#include "bench/distributed/fork_ranks.h"
#include "kernels/blas.h"
#include "nlohmann/json.hpp"
#include "runtime/base/status.h"
#include "runtime/comm/file_kv_store.h"
#include "runtime/comm/gloo_communicator.h"
#include "runtime/device/backend.h"
#include "runtime/device/device.h"
#include "runtime/model/moe_block.h"
#include "runtime/model/stash.h"
#include "runtime/tensor/arena.h"

namespace {

using json = nlohmann::json;
using furnace::bench::Now;
using furnace::bench::Summary;
namespace model = furnace::model;

struct Flags {
  int ep = 1, d_model = 256, experts = 8, top_k = 2, expert_ffn = 512, seq_len = 128, batch = 8;
  int reps = 20, warmup = 3, threads = 1;
  uint64_t seed = 1;
  double timeout_s = 120;
};

void Fill(std::vector<float>& v, int64_t at, int64_t n, float std, std::mt19937& rng) {
  std::normal_distribution<float> d(0.0f, std);
  for (int64_t i = 0; i < n; ++i) v[at + i] = d(rng);
}

// The layer's parameters on EP rank `rank`: LN, router (whole), this rank's E/ep experts
// (w1 [El, C, f], b1 [El, f], w2 [El, f, C], b2 [El, C], as BuildParamLayout lays them out).
// Initialised like MODEL.md (normal, std 0.02; LN weight 1, biases 0), the router and the experts
// from streams that depend only on the global expert index, so every ep sees the same layer.
std::vector<float> MakeParams(const Flags& f, int rank, model::LayerOffsets& off) {
  const int64_t C = f.d_model, E = f.experts, F = f.expert_ffn, El = E / f.ep;
  int64_t at = 0;
  auto take = [&](int64_t n) {
    const int64_t o = at;
    at += n;
    return o;
  };
  off.ln2_w = take(C);
  off.ln2_b = take(C);
  off.router = take(C * E);
  off.w1 = take(El * C * F);
  off.b1 = take(El * F);
  off.w2 = take(El * F * C);
  off.b2 = take(El * C);
  off.moe = true;
  std::vector<float> p(at, 0.0f);
  std::fill(p.begin() + off.ln2_w, p.begin() + off.ln2_w + C, 1.0f);
  std::mt19937 router_rng(static_cast<uint32_t>(f.seed));
  Fill(p, off.router, C * E, 0.02f, router_rng);
  for (int64_t le = 0; le < El; ++le) {
    std::mt19937 rng(static_cast<uint32_t>(f.seed * 1000 + rank * El + le + 1));
    Fill(p, off.w1 + le * C * F, C * F, 0.02f, rng);
    Fill(p, off.w2 + le * F * C, F * C, 0.02f, rng);
  }
  return p;
}

absl::Status RunRank(const Flags& f, const std::string& dir, int rank) {
  furnace::kernels::cpu::SetBlasThreads(f.threads);
  std::unique_ptr<furnace::comm::Communicator> ep;
  if (f.ep > 1) {
    furnace::comm::FileKvStore store(dir + "/kv");
    furnace::comm::GlooOptions o;
    o.rank = rank;
    o.size = f.ep;
    o.timeout_s = f.timeout_s;
    ASSIGN_OR_RETURN(ep, furnace::comm::CreateGlooCommunicator(store, "ep/0", "ep", rank, f.ep, o));
  }
  std::unique_ptr<furnace::device::Device> cpu = furnace::device::CreateCpuDevice();
  furnace::tensor::DeviceArena arena(*cpu, 0);
  model::Stash stash(cpu->kind());
  ASSIGN_OR_RETURN(const furnace::device::Backend* ops, furnace::device::BackendFor(*cpu));
  model::ModuleContext ctx{*ops, arena, stash, {nullptr, ep.get(), nullptr}};

  const model::Dims dims{f.batch, f.seq_len, f.d_model, 4, 1};
  model::MoeShape shape{f.experts, f.top_k, f.expert_ffn, 0.0, f.top_k > 1, 0.01};
  shape.local_E = f.experts / f.ep;
  shape.local_f = f.expert_ffn;
  shape.adds_b2 = true;
  model::LayerOffsets off;
  const std::vector<float> params = MakeParams(f, rank, off);
  std::vector<float> grads(params.size(), 0.0f);

  const int64_t NC = int64_t{dims.N()} * dims.C;
  std::mt19937 rng(static_cast<uint32_t>(f.seed * 7919 + rank));
  std::vector<float> x(NC), dout(NC), dres(NC);
  Fill(x, 0, NC, 1.0f, rng);
  Fill(dout, 0, NC, 1.0f / std::sqrt(static_cast<float>(NC)), rng);
  ASSIGN_OR_RETURN(furnace::tensor::Buffer xb, model::AllocF32(ctx, NC, "x", false));
  std::copy(x.begin(), x.end(), xb.as<float>());
  ASSIGN_OR_RETURN(model::StashHandle x_in,
                   model::SaveF32(ctx, "x", 0, std::move(xb), {f.batch, f.seq_len, f.d_model}));

  std::vector<double> fwd, bwd;
  int64_t received = 0;
  for (int r = 0; r < f.warmup + f.reps; ++r) {
    std::copy(dout.begin(), dout.end(), dres.begin());
    if (ep != nullptr) RETURN_IF_ERROR(ep->Barrier());
    const double t0 = Now();
    ASSIGN_OR_RETURN(model::MoeSaved saved,
                     model::MoeBlockForward(ctx, dims, shape, 0, off, params.data(), x_in));
    const double t1 = Now();
    RETURN_IF_ERROR(model::MoeBlockBackward(ctx, dims, shape, off, params.data(), grads.data(),
                                            saved, x_in, 1.0, dres.data()));
    const double t2 = Now();
    received = saved.distributed ? saved.dispatch.R() : saved.rows;
    if (r < f.warmup) continue;
    fwd.push_back(t1 - t0);
    bwd.push_back(t2 - t1);
  }
  json out = {{"rank", rank}, {"fwd", fwd}, {"bwd", bwd}, {"expert_rows", received}};
  std::ofstream file(absl::StrCat(dir, "/rank-", rank, ".json"));
  file << out.dump();
  return file ? absl::OkStatus() : absl::InternalError("cannot write the rank's results");
}

}  // namespace

int main(int argc, char** argv) {
  Flags f;
  CLI::App app{"bench_moe_layer: the expert-parallel MoE layer, forward + backward per EP rank"};
  app.option_defaults()->always_capture_default();
  app.add_option("--ep", f.ep, "expert-parallel ranks (processes)")->check(CLI::PositiveNumber);
  app.add_option("--d_model", f.d_model);
  app.add_option("--experts", f.experts);
  app.add_option("--top_k", f.top_k);
  app.add_option("--expert_ffn", f.expert_ffn);
  app.add_option("--seq_len", f.seq_len);
  app.add_option("--batch", f.batch, "B per rank");
  app.add_option("--reps", f.reps, "timed repetitions")->check(CLI::PositiveNumber);
  app.add_option("--warmup", f.warmup, "untimed repetitions first");
  app.add_option("--threads", f.threads, "BLAS threads per rank")->check(CLI::PositiveNumber);
  app.add_option("--seed", f.seed);
  app.add_option("--timeout_s", f.timeout_s);
  CLI11_PARSE(app, argc, argv);
  if (f.experts % f.ep != 0 || f.top_k < 1 || f.top_k > f.experts) {
    std::fprintf(stderr, "bench_moe_layer: need ep | experts and 1 <= top_k <= experts\n");
    return 2;
  }
  char tmpl[] = "/tmp/bench_moe_layer.XXXXXX";
  if (mkdtemp(tmpl) == nullptr) {
    std::perror("mkdtemp");
    return 1;
  }
  const std::string dir = tmpl;
  const std::vector<std::string> failed = furnace::bench::RunForked(
      f.ep,
      [&](int rank) {
        const absl::Status s = RunRank(f, dir, rank);
        if (!s.ok()) std::fprintf(stderr, "rank %d: %s\n", rank, s.ToString().c_str());
        return s.ok() ? 0 : 1;
      },
      60 + 2 * f.timeout_s + 5.0 * (f.reps + f.warmup));
  for (int r = 0; r < f.ep; ++r) {
    if (!failed[r].empty()) {
      std::fprintf(stderr, "bench_moe_layer: rank %d %s\n", r, failed[r].c_str());
      std::filesystem::remove_all(dir);
      return 1;
    }
  }
  std::vector<double> fwd(f.reps, 0), bwd(f.reps, 0), total(f.reps, 0);
  std::vector<int64_t> rows;
  for (int r = 0; r < f.ep; ++r) {
    std::ifstream in(absl::StrCat(dir, "/rank-", r, ".json"));
    const json j = json::parse(in);
    for (int i = 0; i < f.reps; ++i) {
      const double a = j["fwd"][i].get<double>(), b = j["bwd"][i].get<double>();
      fwd[i] = std::max(fwd[i], a);
      bwd[i] = std::max(bwd[i], b);
      total[i] = std::max(total[i], a + b);
    }
    rows.push_back(j["expert_rows"].get<int64_t>());
  }
  std::filesystem::remove_all(dir);
  json out;
  out["impl"] = "furnace";
  out["ep"] = f.ep;
  out["shape"] = {{"d_model", f.d_model},       {"experts", f.experts}, {"top_k", f.top_k},
                  {"expert_ffn", f.expert_ffn}, {"seq_len", f.seq_len}, {"batch", f.batch}};
  out["reps"] = f.reps;
  out["warmup"] = f.warmup;
  out["threads"] = f.threads;
  out["fwd_bwd_s"] = Summary(total);
  out["fwd_s"] = Summary(fwd);
  out["bwd_s"] = Summary(bwd);
  out["expert_rows_last_rep"] = rows;  // per rank: rows its experts processed
  json env;
  for (const char* v : {"OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "GOMP_SPINCOUNT"}) {
    const char* e = std::getenv(v);
    env[v] = e ? json(e) : json(nullptr);
  }
  out["env"] = env;
  std::printf("%s\n", out.dump().c_str());
  return 0;
}
