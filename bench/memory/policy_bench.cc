// furnace_bench_memory_policies: what each static memory policy costs in one process, side by
// side. One GptMoe + Trainer per variant (same seed, same data, same steps), stepped in
// interleaved rounds (every variant runs its next `--steps-per-round` steps, then the next
// variant), so machine noise falls on all of them alike. Reported per variant: median step time
// and tokens/s as ratios to `none`, the largest activation peak, the bytes per memory action per
// step and the late reloads; the final losses must agree (the policies are bit-identical to none;
// compress is not a policy and is not run).
//
// The offload variants copy through the copy engine. `offload_h200` paces it to the host link an
// H200 would see relative to this CPU's compute: a byte over PCIe costs about 18,000 FLOPs at the
// GPU's peak, so the link is set to (measured SGEMM peak) / 18,000 bytes per second.
// The adaptive variants run under a budget: 110% and 85% of none's declared peak, and the floor
// (GptMoe::MinimumActivationBytes, the least any policy needs).
//
// Run (BENCHMARKING.md: pools pinned before the process starts):
//   OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 build/bin/furnace_bench_memory_policies --threads 1
// Options: --rounds N --steps-per-round N --spike-probability P --spike-ratio R --micro-batch B
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "bench/common/stats.h"
#include "kernels/blas.h"
#include "nlohmann/json.hpp"
#include "runtime/data/markov.h"
#include "runtime/data/sampler.h"
#include "runtime/device/device.h"
#include "runtime/memory/copy_engine.h"
#include "runtime/memory/policy.h"
#include "runtime/model/config.h"
#include "runtime/model/gpt_moe.h"
#include "runtime/tensor/arena.h"
#include "runtime/tensor/host_pool.h"
#include "runtime/train/peak_flops.h"
#include "runtime/train/trainer.h"

namespace {

using json = nlohmann::json;
namespace fm = furnace::memory;

// A byte over an H200's host link costs about this many FLOPs at the GPU's dense peak
// (issue 10, item 6; ../shared/research/memory.md).
constexpr double kH200FlopsPerLinkByte = 18000;

fm::CopyEngineOptions LinkOptions(double gbps) {
  fm::CopyEngineOptions o;
  o.host_link_gbps = gbps;
  return o;
}

struct Flags {
  int rounds = 5, steps_per_round = 2, warmup = 1, threads = 1, micro_batch = 8;
  double spike_probability = 0, spike_ratio = 2.6, offload_ratio = 0.5;
  bool recompute_attention_probs = false;  // --attention-probs recomputed
};

bool Parse(int argc, char** argv, Flags& f) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&](double& v) {
      if (i + 1 >= argc) return false;
      v = std::atof(argv[++i]);
      return true;
    };
    double v = 0;
    if (a == "--rounds" && next(v)) {
      f.rounds = static_cast<int>(v);
    } else if (a == "--steps-per-round" && next(v)) {
      f.steps_per_round = static_cast<int>(v);
    } else if (a == "--threads" && next(v)) {
      f.threads = static_cast<int>(v);
    } else if (a == "--micro-batch" && next(v)) {
      f.micro_batch = static_cast<int>(v);
    } else if (a == "--spike-probability" && next(v)) {
      f.spike_probability = v;
    } else if (a == "--spike-ratio" && next(v)) {
      f.spike_ratio = v;
    } else if (a == "--offload-ratio" && next(v)) {
      f.offload_ratio = v;
    } else if (a == "--attention-probs" && i + 1 < argc &&
               (std::string(argv[i + 1]) == "stored" || std::string(argv[i + 1]) == "recomputed")) {
      f.recompute_attention_probs = std::string(argv[++i]) == "recomputed";
    } else {
      std::cerr << "unknown or incomplete option '" << a
                << "' (allowed: --rounds N --steps-per-round N --threads N --micro-batch B "
                   "--spike-probability P --spike-ratio R --offload-ratio X "
                   "--attention-probs stored|recomputed)\n";
      return false;
    }
  }
  return f.rounds >= 1 && f.steps_per_round >= 1;
}

struct Variant {
  std::string name;
  fm::MemoryPolicy policy = fm::MemoryPolicy::kNone;
  double link_gbps = -1;    // < 0: no copy engine
  double budget_share = 0;  // of none's declared peak; 0: unlimited (adaptive only)
  bool at_floor = false;    // the budget is MinimumActivationBytes, the least any policy needs
  std::unique_ptr<furnace::tensor::DeviceArena> arena;
  std::unique_ptr<furnace::tensor::HostPool> host;
  std::unique_ptr<fm::CopyEngine> engine;
  std::unique_ptr<furnace::model::GptMoe> model;
  std::unique_ptr<furnace::data::Sampler> sampler;
  std::unique_ptr<furnace::train::Trainer> trainer;
  std::vector<double> step_s, tps;
  int64_t peak = 0;
  furnace::train::MemoryActionTotals actions;  // summed over the timed steps
  double last_loss = 0;
  int timed = 0;
};

}  // namespace

int main(int argc, char** argv) {
  Flags f;
  if (!Parse(argc, argv, f)) return 2;
  furnace::kernels::cpu::SetBlasThreads(f.threads);
  const double peak_flops = furnace::train::MeasureSgemmPeakFlops();
  const double h200_gbps = peak_flops / kH200FlopsPerLinkByte / 1e9;

  furnace::model::ModelConfig mc;
  mc.vocab = 256;
  mc.seq_len = 128;
  mc.d_model = 256;
  mc.heads = 4;
  mc.layers = 4;
  mc.experts = 8;
  mc.top_k = 2;
  mc.expert_ffn = 512;
  mc.spikes = {.probability = f.spike_probability, .max_ratio = f.spike_ratio, .seed = 3};
  mc.recompute_attention_probs = f.recompute_attention_probs;
  if (absl::Status s = mc.Validate(); !s.ok()) {
    std::cerr << "config: " << s << "\n";
    return 2;
  }
  auto device = furnace::device::CreateCpuDevice();
  const int total_steps = f.warmup + f.rounds * f.steps_per_round;

  std::vector<Variant> variants;
  auto add = [&](std::string name, fm::MemoryPolicy policy, double link_gbps,
                 double budget_share = 0) {
    Variant v;
    v.name = std::move(name);
    v.policy = policy;
    v.link_gbps = link_gbps;
    v.budget_share = budget_share;
    variants.push_back(std::move(v));
  };
  add("none", fm::MemoryPolicy::kNone, -1);
  add("selective", fm::MemoryPolicy::kSelective, -1);
  add("full_recompute", fm::MemoryPolicy::kFullRecompute, -1);
  add("offload_unpaced", fm::MemoryPolicy::kOffload, 0);
  add("offload_h200", fm::MemoryPolicy::kOffload, h200_gbps);
  // adaptive with a budget 10% above none's peak: it projects at every MoE layer and never acts
  // (the cost of the projection alone); and under 85% of it, where none cannot run, at the H200
  // link ratio (it must act on every micro-batch).
  add("adaptive_fits", fm::MemoryPolicy::kAdaptive, h200_gbps, 1.10);
  add("adaptive_85%_h200", fm::MemoryPolicy::kAdaptive, h200_gbps, 0.85);
  // And at the floor the worker enforces (below it a job is refused before its first step).
  add("adaptive_floor_h200", fm::MemoryPolicy::kAdaptive, h200_gbps);
  variants.back().at_floor = true;
  for (Variant& v : variants) {
    v.arena = std::make_unique<furnace::tensor::DeviceArena>(*device, 0);
    auto model = furnace::model::GptMoe::Create(mc, /*seed=*/1, *device, *v.arena);
    if (!model.ok()) {
      std::cerr << v.name << ": model: " << model.status() << "\n";
      return 1;
    }
    v.model = *std::move(model);
    if (absl::Status s = v.model->SetMemoryPolicy(v.policy); !s.ok()) {
      std::cerr << v.name << ": " << s << "\n";
      return 1;
    }
    if (v.at_floor) {
      v.arena->set_budget(static_cast<uint64_t>(v.model->MinimumActivationBytes(f.micro_batch)));
    } else if (v.budget_share > 0) {
      // Dropless on one rank every micro-batch's peak is none's declared one (adaptive keeps
      // everything up front, so its model declares none's bytes).
      v.arena->set_budget(
          static_cast<uint64_t>(v.budget_share * v.model->ActivationBytes(f.micro_batch)));
    }
    if (v.link_gbps >= 0) {
      auto engine = fm::CopyEngine::Create(*device, LinkOptions(v.link_gbps));
      if (!engine.ok()) {
        std::cerr << v.name << ": copy engine: " << engine.status() << "\n";
        return 1;
      }
      v.engine = *std::move(engine);
      v.host = std::make_unique<furnace::tensor::HostPool>(*device, 0);
      if (v.policy == fm::MemoryPolicy::kAdaptive &&
          std::getenv("FURNACE_PLANNER_LOG") != nullptr) {
        v.model->SetPlannerLog([](const std::string& line) { std::cerr << line << "\n"; });
      }
      const absl::Status s =
          v.policy == fm::MemoryPolicy::kAdaptive
              ? v.model->SetAdaptive(v.engine.get(), v.host.get(), {})
              : v.model->SetOffload(f.offload_ratio, v.engine.get(), v.host.get());
      if (!s.ok()) {
        std::cerr << v.name << ": " << s << "\n";
        return 1;
      }
    }
    auto chain = furnace::data::MarkovChain::Create({.vocab = mc.vocab, .seed = 7});
    if (!chain.ok()) return 1;
    auto sampler = furnace::data::MakeMarkovSampler(
        *std::move(chain), {.batch = f.micro_batch, .seq_len = mc.seq_len, .seed = 1});
    if (!sampler.ok()) return 1;
    v.sampler = *std::move(sampler);
    furnace::train::TrainConfig tc;
    tc.steps = total_steps;
    tc.micro_batches = 1;
    tc.seed = 1;
    tc.schedule.lr = 3e-4;
    tc.schedule.warmup_steps = 1;
    tc.schedule.max_steps = total_steps;
    tc.peak_flops = peak_flops;
    auto trainer = furnace::train::Trainer::Create(v.model.get(), v.sampler.get(), tc);
    if (!trainer.ok()) {
      std::cerr << v.name << ": trainer: " << trainer.status() << "\n";
      return 1;
    }
    v.trainer = *std::move(trainer);
  }

  auto step = [&](Variant& v, bool timed) {
    auto st = v.trainer->Step();
    if (!st.ok()) {
      std::cerr << v.name << ": " << st.status() << "\n";
      std::exit(1);
    }
    v.last_loss = st->loss;
    if (!timed) return;
    v.step_s.push_back(st->step_seconds);
    v.tps.push_back(st->tokens_per_second);
    v.peak = std::max(v.peak, st->activation_peak_bytes);
    v.actions.recomputed_bytes += st->memory_actions.recomputed_bytes;
    v.actions.offloaded_bytes += st->memory_actions.offloaded_bytes;
    v.actions.late_reloads += st->memory_actions.late_reloads;
    v.actions.planner_seconds += st->memory_actions.planner_seconds;
    v.actions.planner_decisions += st->memory_actions.planner_decisions;
    v.actions.emergency_offloads += st->memory_actions.emergency_offloads;
    ++v.timed;
  };
  for (Variant& v : variants) {
    for (int s = 0; s < f.warmup; ++s) step(v, false);
  }
  for (int r = 0; r < f.rounds; ++r) {
    for (Variant& v : variants) {
      for (int s = 0; s < f.steps_per_round; ++s) step(v, true);
    }
    std::fprintf(stderr, "[bench] round %d/%d done\n", r + 1, f.rounds);
  }

  const double none_step = furnace::bench::Median(variants[0].step_s);
  json out = {{"peak_gflops", peak_flops / 1e9},
              {"h200_link_gbps", h200_gbps},
              {"flops_per_link_byte", kH200FlopsPerLinkByte},
              {"rounds", f.rounds},
              {"steps_per_round", f.steps_per_round},
              {"micro_batch", f.micro_batch},
              {"spike_probability", f.spike_probability},
              {"spike_ratio", f.spike_ratio},
              {"offload_ratio", f.offload_ratio},
              {"attention_probs", f.recompute_attention_probs ? "recomputed" : "stored"},
              {"variants", json::array()}};
  std::printf("%-18s %10s %8s %10s %12s %12s %6s %10s %9s %10s\n", "variant", "step_ms", "vs_none",
              "tokens/s", "act_peak_B", "bytes/step", "late", "planner_ms", "decisions", "loss");
  for (Variant& v : variants) {
    const double med = furnace::bench::Median(v.step_s);
    const double moved =
        static_cast<double>(v.actions.recomputed_bytes + v.actions.offloaded_bytes) /
        std::max(1, v.timed);
    std::printf("%-18s %10.1f %8.3f %10.0f %12lld %12.0f %6lld %10.4f %9lld %10.6f\n",
                v.name.c_str(), med * 1e3, med / none_step, furnace::bench::Median(v.tps),
                static_cast<long long>(v.peak), moved,
                static_cast<long long>(v.actions.late_reloads),
                v.actions.planner_seconds / std::max(1, v.timed) * 1e3,
                static_cast<long long>(v.actions.planner_decisions), v.last_loss);
    out["variants"].push_back(
        {{"name", v.name},
         {"step_seconds", furnace::bench::Summary(v.step_s)},
         {"step_time_vs_none", med / none_step},
         {"tokens_per_second", furnace::bench::Summary(v.tps)},
         {"activation_peak_bytes", v.peak},
         {"budget_bytes", v.arena->budget()},
         {"recomputed_bytes_per_step", static_cast<double>(v.actions.recomputed_bytes) / v.timed},
         {"offloaded_bytes_per_step", static_cast<double>(v.actions.offloaded_bytes) / v.timed},
         {"late_reloads", v.actions.late_reloads},
         {"planner_seconds_per_step", v.actions.planner_seconds / v.timed},
         {"planner_decisions", v.actions.planner_decisions},
         {"emergency_offloads", v.actions.emergency_offloads},
         {"final_loss", v.last_loss}});
  }
  bool same = true;
  for (const Variant& v : variants) same = same && v.last_loss == variants[0].last_loss;
  out["final_losses_identical"] = same;
  std::printf("final losses identical across variants: %s\n", same ? "yes" : "NO");
  std::cout << out.dump() << "\n";
  return same ? 0 : 1;
}
