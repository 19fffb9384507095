// furnace_bench_train: trains the GPT-MoE (GptMoe + Trainer, the same code path as a worker rank)
// for --warmup untimed and --steps timed steps on Markov data and prints one JSON object shaped
// like bench/pytorch/moe_train_bench.py's, so bench/run_train_vs_pytorch.sh can put them side by
// side.
//
// Measured in this process, with the BLAS thread count set before the first GEMM:
//   - the SGEMM peak (train::MeasureSgemmPeakFlops, 2048^3) before and after the steps; MFU uses
//     the larger of the two (the machine is shared: the larger is the closer to the true peak);
//   - tokens/s and MFU per timed step (median, min, max), the forward+backward and optimizer shares
//     (StepStats);
//   - a breakdown of the forward+backward time by op class, by replaying the step's GEMM-class
//     kernels (dense linears, router, LM head, expert grouped GEMMs with the last step's routing,
//     attention core) at the model's shapes on scratch buffers; "other" is the measured
//     forward+backward median minus their sum (layernorm, GELU, softmax/top-k, permute, cross
//     entropy, embedding, arena/stash overhead). The replay runs on warm caches, so it is a lower
//     bound on the time those kernels take inside the step.
//
// Run with the pools pinned before the process starts (BENCHMARKING.md):
//   OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 GOMP_SPINCOUNT=1000 furnace_bench_train --threads 1
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "bench/common/stats.h"
#include "kernels/attention.h"
#include "kernels/blas.h"
#include "kernels/matmul.h"
#include "nlohmann/json.hpp"
#include "runtime/data/markov.h"
#include "runtime/data/sampler.h"
#include "runtime/device/current_stream.h"
#include "runtime/device/device.h"
#include "runtime/device/emulated_device.h"
#include "runtime/model/config.h"
#include "runtime/model/gpt_moe.h"
#include "runtime/tensor/arena.h"
#include "runtime/train/peak_flops.h"
#include "runtime/train/trainer.h"

namespace {

using json = nlohmann::json;
using furnace::bench::Median;
using furnace::bench::Now;
using furnace::bench::Summary;
namespace k = furnace::kernels::cpu;

struct Flags {
  int vocab = 256, seq_len = 128, d_model = 256, heads = 4, layers = 4, experts = 8, top_k = 2;
  int expert_ffn = 512, micro_batch = 8, micro_batches = 1, threads = 1, steps = 10, warmup = 3;
  int breakdown_reps = 5;  // 0 = no breakdown
  uint64_t seed = 1, data_seed = 7;
  double lr = 3e-4;
  double peak_gflops = 0;      // > 0: use this peak instead of measuring (profilers, callgrind)
  std::string device = "cpu";  // cpu | emulated (the emulated discrete device, a compute stream)
};

[[noreturn]] void Usage(const std::string& why) {
  std::cerr
      << "furnace_bench_train: " << why << "\n"
      << "flags (--name value or --name=value): --vocab --seq_len --d_model --heads --layers\n"
         "  --experts --top_k --expert_ffn --micro_batch --micro_batches --threads --steps\n"
         "  --warmup --seed --data_seed --lr --breakdown_reps (0 = skip the op breakdown)\n"
         "  --peak_gflops (> 0: take this SGEMM peak instead of measuring it; for profilers)\n"
         "  --device cpu | emulated (the emulated discrete device: what the GPU path costs here)\n"
         "defaults: the BENCHMARKING.md MoE (V=256 T=128 d=256 h=4 L=4 E=8 k=2 f=512 b=8 m=1),\n"
         "  1 thread, 3 warm-up + 10 timed steps\n";
  std::exit(2);
}

Flags Parse(int argc, char** argv) {
  Flags f;
  std::map<std::string, int*> ints = {{"vocab", &f.vocab},
                                      {"seq_len", &f.seq_len},
                                      {"d_model", &f.d_model},
                                      {"heads", &f.heads},
                                      {"layers", &f.layers},
                                      {"experts", &f.experts},
                                      {"top_k", &f.top_k},
                                      {"expert_ffn", &f.expert_ffn},
                                      {"micro_batch", &f.micro_batch},
                                      {"micro_batches", &f.micro_batches},
                                      {"threads", &f.threads},
                                      {"steps", &f.steps},
                                      {"warmup", &f.warmup},
                                      {"breakdown_reps", &f.breakdown_reps}};
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "-h" || a == "--help") Usage("help");
    if (a.rfind("--", 0) != 0) Usage("unexpected argument " + a);
    std::string name = a.substr(2), value;
    if (auto eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
    } else {
      if (i + 1 >= argc) Usage("missing value for " + a);
      value = argv[++i];
    }
    try {
      if (auto it = ints.find(name); it != ints.end()) {
        *it->second = std::stoi(value);
      } else if (name == "seed") {
        f.seed = std::stoull(value);
      } else if (name == "data_seed") {
        f.data_seed = std::stoull(value);
      } else if (name == "lr") {
        f.lr = std::stod(value);
      } else if (name == "peak_gflops") {
        f.peak_gflops = std::stod(value);
      } else if (name == "device") {
        if (value != "cpu" && value != "emulated") Usage("--device: cpu or emulated");
        f.device = value;
      } else {
        Usage("unknown flag --" + name);
      }
    } catch (const std::exception&) {
      Usage("bad value for --" + name + ": " + value);
    }
  }
  if (f.steps < 1 || f.warmup < 0 || f.threads < 1 || f.micro_batch < 1 || f.micro_batches < 1) {
    Usage("steps, threads, micro_batch, micro_batches must be >= 1 and warmup >= 0");
  }
  return f;
}

std::vector<std::string> CheckEnv(int threads) {
  std::vector<std::string> w;
  for (const char* var : {"OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"}) {
    const char* v = std::getenv(var);
    if (v == nullptr || std::to_string(threads) != v) {
      w.push_back(std::string(var) + "=" + (v ? v : "<unset>") + " (want " +
                  std::to_string(threads) + ")");
    }
  }
  const char* spin = std::getenv("GOMP_SPINCOUNT");
  if (spin == nullptr || std::string(spin) != "1000") {
    w.push_back(std::string("GOMP_SPINCOUNT=") + (spin ? spin : "<unset>") + " (want 1000)");
  }
  return w;
}

std::vector<float> Random(int64_t n, std::mt19937& rng, float scale = 0.1f) {
  std::uniform_real_distribution<float> u(-scale, scale);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = u(rng);
  return v;
}

// One op class of the replay: the seconds one micro-batch spends in it (median over reps) and its
// FLOPs per micro-batch (MODEL.md convention: attention counts the full T x T products).
struct OpClass {
  std::string name;
  double flops = 0;
  std::function<void()> run;
  double seconds = 0;
};

// Scales summed per-expert counts (over m micro-batches) to one micro-batch of S = N * k rows.
std::vector<int64_t> Offsets(const std::vector<int64_t>& counts, int64_t S) {
  const int E = static_cast<int>(counts.size());
  int64_t total = 0;
  for (int64_t c : counts) total += c;
  std::vector<int64_t> off(E + 1, 0);
  for (int e = 0; e < E; ++e) {
    const int64_t rows = total > 0 ? counts[e] * S / total : S / E;
    off[e + 1] = off[e] + rows;
  }
  off[E] = S;  // rounding remainder goes to the last expert
  return off;
}

json Breakdown(const Flags& f, const std::vector<std::vector<int64_t>>& tokens_per_expert,
               double fwd_bwd_median, double peak) {
  const int B = f.micro_batch, T = f.seq_len, C = f.d_model, NH = f.heads, E = f.experts;
  const int K = f.top_k, F = f.expert_ffn, V = f.vocab, L = f.layers;
  const int N = B * T;
  const int64_t S = int64_t{N} * K;
  std::mt19937 rng(123);
  // Scratch tensors (shared by the classes; contents do not matter for timing).
  auto x = Random(int64_t{N} * C, rng), dx = Random(int64_t{N} * C, rng);
  auto qkv = Random(int64_t{N} * 3 * C, rng), dqkv = Random(int64_t{N} * 3 * C, rng);
  auto wqkv = Random(int64_t{C} * 3 * C, rng), dwqkv = Random(int64_t{C} * 3 * C, rng);
  auto bqkv = Random(3 * C, rng), dbqkv = Random(3 * C, rng);
  auto wo = Random(int64_t{C} * C, rng), dwo = Random(int64_t{C} * C, rng);
  auto bo = Random(C, rng), dbo = Random(C, rng);
  auto y = Random(int64_t{N} * C, rng), dy = Random(int64_t{N} * C, rng);
  auto att = Random(int64_t{B} * NH * T * T, rng);
  auto wr = Random(int64_t{C} * E, rng), dwr = Random(int64_t{C} * E, rng);
  auto logits_r = Random(int64_t{N} * E, rng);
  auto wt = Random(int64_t{C} * V, rng), wte = Random(int64_t{V} * C, rng);
  auto dwte = Random(int64_t{V} * C, rng), logits = Random(int64_t{N} * V, rng);
  auto xin = Random(S * C, rng), dxin = Random(S * C, rng);
  auto hid = Random(S * F, rng), dhid = Random(S * F, rng);
  auto eo = Random(S * C, rng), deo = Random(S * C, rng);
  auto w1 = Random(int64_t{E} * C * F, rng), dw1 = Random(int64_t{E} * C * F, rng);
  auto b1 = Random(int64_t{E} * F, rng), db1 = Random(int64_t{E} * F, rng);
  auto w2 = Random(int64_t{E} * F * C, rng), dw2 = Random(int64_t{E} * F * C, rng);
  auto b2 = Random(int64_t{E} * C, rng), db2 = Random(int64_t{E} * C, rng);
  // Per-MoE-layer routing of the last step (uniform when unknown).
  std::vector<std::vector<int64_t>> offsets;
  for (int l = 0; l < L; ++l) {
    offsets.push_back(Offsets(l < static_cast<int>(tokens_per_expert.size())
                                  ? tokens_per_expert[l]
                                  : std::vector<int64_t>(E, 1),
                              S));
  }
  const double nc = double(N) * C;
  std::vector<OpClass> classes;
  classes.push_back({"attn_linear (qkv+proj fwd+bwd)", L * 6.0 * nc * (3 * C + C), [&] {
                       for (int l = 0; l < L; ++l) {
                         k::MatmulForward<float>(qkv.data(), x.data(), wqkv.data(), bqkv.data(), N,
                                                 C, 3 * C);
                         k::MatmulForward<float>(y.data(), x.data(), wo.data(), bo.data(), N, C, C);
                         k::MatmulBackward<float>(dx.data(), dwo.data(), dbo.data(), dy.data(),
                                                  x.data(), wo.data(), N, C, C);
                         k::MatmulBackward<float>(dx.data(), dwqkv.data(), dbqkv.data(),
                                                  dqkv.data(), x.data(), wqkv.data(), N, C, 3 * C);
                       }
                     }});
  classes.push_back(
      {"attention_core (QK^T, softmax, AV fwd+bwd)", L * 12.0 * B * double(T) * T * C, [&] {
         for (int l = 0; l < L; ++l) {
           k::AttentionForward<float>(y.data(), att.data(), qkv.data(), B, T, C, NH);
           k::AttentionBackward<float>(dqkv.data(), dy.data(), qkv.data(), att.data(), B, T, C, NH);
         }
       }});
  classes.push_back(
      {"expert_gemm (grouped w1+w2 fwd+bwd)", L * 6.0 * double(S) * C * F * 2, [&] {
         for (int l = 0; l < L; ++l) {
           const int64_t* o = offsets[l].data();
           k::GroupedMatmulForward<float>(hid.data(), xin.data(), w1.data(), b1.data(), o, E, C, F);
           k::GroupedMatmulForward<float>(eo.data(), hid.data(), w2.data(), b2.data(), o, E, F, C);
           k::GroupedMatmulBackward<float>(dhid.data(), dw2.data(), db2.data(), deo.data(),
                                           hid.data(), w2.data(), o, E, F, C);
           k::GroupedMatmulBackward<float>(dxin.data(), dw1.data(), db1.data(), dhid.data(),
                                           xin.data(), w1.data(), o, E, C, F);
         }
       }});
  classes.push_back({"router (linear fwd+bwd)", L * 6.0 * nc * E, [&] {
                       for (int l = 0; l < L; ++l) {
                         k::MatmulForward<float>(logits_r.data(), x.data(), wr.data(), nullptr, N,
                                                 C, E);
                         k::MatmulBackward<float>(dx.data(), dwr.data(), nullptr, logits_r.data(),
                                                  x.data(), wr.data(), N, C, E);
                       }
                     }});
  classes.push_back(
      {"lm_head (tied wte fwd+bwd)", 6.0 * nc * V, [&] {
         k::MatmulForward<float>(logits.data(), y.data(), wt.data(), nullptr, N, C, V);
         k::MatmulForward<float>(dy.data(), logits.data(), wte.data(), nullptr, N, V, C);
         k::MatmulBackward<float>(nullptr, dwte.data(), nullptr, y.data(), logits.data(),
                                  wte.data(), N, V, C);
       }});
  json out = json::array();
  double sum = 0;
  for (OpClass& c : classes) {
    c.run();  // warm
    std::vector<double> t;
    for (int r = 0; r < f.breakdown_reps; ++r) {
      const double t0 = Now();
      c.run();
      t.push_back(Now() - t0);
    }
    c.seconds = Median(t) * f.micro_batches;  // per step
    const double flops = c.flops * f.micro_batches;
    sum += c.seconds;
    out.push_back({{"class", c.name},
                   {"seconds_per_step", c.seconds},
                   {"share_of_fwd_bwd", c.seconds / fwd_bwd_median},
                   {"gflops", flops / c.seconds / 1e9},
                   {"fraction_of_sgemm_peak", flops / c.seconds / peak}});
  }
  out.push_back({{"class",
                  "other (layernorm, gelu, softmax/top-k/aux, permute, CE, embedding, "
                  "transpose, arena/stash)"},
                 {"seconds_per_step", fwd_bwd_median - sum},
                 {"share_of_fwd_bwd", (fwd_bwd_median - sum) / fwd_bwd_median}});
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  const Flags f = Parse(argc, argv);
  const std::vector<std::string> env_warnings = CheckEnv(f.threads);
  for (const std::string& w : env_warnings)
    std::cerr << "WARNING: thread pools not pinned: " << w << "\n";
  k::SetBlasThreads(f.threads);

  const double peak_start =
      f.peak_gflops > 0 ? f.peak_gflops * 1e9 : furnace::train::MeasureSgemmPeakFlops();

  furnace::model::ModelConfig mc;
  mc.vocab = f.vocab;
  mc.seq_len = f.seq_len;
  mc.d_model = f.d_model;
  mc.heads = f.heads;
  mc.layers = f.layers;
  mc.experts = f.experts;
  mc.top_k = f.top_k;
  mc.expert_ffn = f.expert_ffn;
  if (absl::Status s = mc.Validate(); !s.ok()) {
    std::cerr << "config: " << s << "\n";
    return 2;
  }
  std::unique_ptr<furnace::device::Device> device;
  if (f.device == "emulated") {
    auto emulated = furnace::device::CreateEmulatedDevice({.memory_bytes = size_t{8} << 30});
    if (!emulated.ok()) {
      std::cerr << "device: " << emulated.status() << "\n";
      return 1;
    }
    device = std::move(*emulated);
  } else {
    device = furnace::device::CreateCpuDevice();
  }
  auto compute = device->CreateStream();
  if (!compute.ok()) {
    std::cerr << "stream: " << compute.status() << "\n";
    return 1;
  }
  const furnace::device::StreamScope on_compute(**compute);
  furnace::tensor::DeviceArena arena(*device, 0);
  auto model = furnace::model::GptMoe::Create(mc, f.seed, *device, arena);
  if (!model.ok()) {
    std::cerr << "model: " << model.status() << "\n";
    return 1;
  }
  auto chain = furnace::data::MarkovChain::Create({.vocab = f.vocab, .seed = f.data_seed});
  if (!chain.ok()) {
    std::cerr << "markov: " << chain.status() << "\n";
    return 1;
  }
  auto sampler = furnace::data::MakeMarkovSampler(
      *std::move(chain), {.batch = f.micro_batch, .seq_len = f.seq_len, .seed = f.seed});
  if (!sampler.ok()) {
    std::cerr << "sampler: " << sampler.status() << "\n";
    return 1;
  }
  furnace::train::TrainConfig tc;
  tc.steps = f.warmup + f.steps;
  tc.micro_batches = f.micro_batches;
  tc.seed = f.seed;
  tc.schedule.lr = f.lr;
  tc.schedule.warmup_steps = std::min(2, f.warmup + f.steps);
  tc.schedule.max_steps = f.warmup + f.steps;
  tc.peak_flops = peak_start;
  auto trainer = furnace::train::Trainer::Create(model->get(), sampler->get(), tc);
  if (!trainer.ok()) {
    std::cerr << "trainer: " << trainer.status() << "\n";
    return 1;
  }

  std::vector<double> tps, step_s, fb_s, opt_s;
  double loss_first = 0, loss_last = 0;
  int64_t act_peak = 0;
  std::vector<std::vector<int64_t>> last_tpe;
  std::vector<double> imbalance;
  for (int s = 0; s < f.warmup + f.steps; ++s) {
    auto st = (*trainer)->Step();
    if (!st.ok()) {
      std::cerr << "step " << s << ": " << st.status() << "\n";
      return 1;
    }
    if (s == 0) loss_first = st->loss;
    loss_last = st->loss;
    if (s < f.warmup) continue;
    tps.push_back(st->tokens_per_second);
    step_s.push_back(st->step_seconds);
    fb_s.push_back(st->forward_backward_seconds);
    opt_s.push_back(st->optimizer_seconds);
    act_peak = std::max(act_peak, st->activation_peak_bytes);
    last_tpe = st->tokens_per_expert;
    imbalance = st->imbalance;
  }
  const double peak_end =
      f.peak_gflops > 0 ? f.peak_gflops * 1e9 : furnace::train::MeasureSgemmPeakFlops();
  const double peak = std::max(peak_start, peak_end);
  const double fpt = (*model)->FlopsPerToken();

  json r;
  r["impl"] = "furnace";
  r["device"] = f.device;
  r["tokens_per_s_median"] = Median(tps);
  r["tokens_per_s_min"] = *std::min_element(tps.begin(), tps.end());
  r["tokens_per_s_max"] = *std::max_element(tps.begin(), tps.end());
  r["step_s_median"] = Median(step_s);
  r["step_s_min"] = *std::min_element(step_s.begin(), step_s.end());
  r["step_s_max"] = *std::max_element(step_s.begin(), step_s.end());
  r["forward_backward_s"] = Summary(fb_s);
  r["optimizer_s"] = Summary(opt_s);
  r["threads"] = f.threads;
  r["warmup_steps"] = f.warmup;
  r["timed_steps"] = f.steps;
  r["config"] = {{"vocab", f.vocab},       {"seq_len", f.seq_len},
                 {"d_model", f.d_model},   {"heads", f.heads},
                 {"layers", f.layers},     {"experts", f.experts},
                 {"top_k", f.top_k},       {"expert_ffn", f.expert_ffn},
                 {"batch", f.micro_batch}, {"micro_batches", f.micro_batches},
                 {"capacity_factor", 0}};
  json env;
  for (const char* v : {"OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "GOMP_SPINCOUNT"}) {
    const char* e = std::getenv(v);
    env[v] = e ? json(e) : json(nullptr);
  }
  r["env"] = env;
  r["env_warnings"] = env_warnings;
  r["loss_first"] = loss_first;
  r["loss_last"] = loss_last;
  r["model_flops_per_token"] = fpt;
  r["num_params"] = (*model)->num_params();
  r["activation_peak_bytes"] = act_peak;
  r["routing_imbalance_last_step"] = imbalance;
  r["sgemm_2048_gflops"] = peak / 1e9;
  r["sgemm_2048_gflops_start"] = peak_start / 1e9;
  r["sgemm_2048_gflops_end"] = peak_end / 1e9;
  std::vector<double> mfu;
  for (double t : tps) mfu.push_back(fpt * t / peak);
  r["mfu_median"] = Median(mfu);
  r["mfu_min"] = *std::min_element(mfu.begin(), mfu.end());
  r["mfu_max"] = *std::max_element(mfu.begin(), mfu.end());
  if (f.breakdown_reps > 0) {
    r["breakdown"] = Breakdown(f, last_tpe, Median(fb_s), peak);
    r["breakdown_note"] =
        "per step; kernels replayed at the model's shapes (last step's routing) on warm scratch "
        "buffers; 'other' = measured forward+backward median minus the replayed classes; the "
        "optimizer (clip + AdamW) is optimizer_s, outside forward+backward";
  }
  std::cout << r.dump(1) << std::endl;
  return 0;
}
