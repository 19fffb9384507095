// furnace_bench_kernels: Google Benchmark of the GEMM-heavy CPU kernels of the GPT-MoE, forward +
// backward, at the demo shapes, the BENCHMARKING.md shapes and larger ones, and of the experts'
// GELU (elementwise: elements per second, no GFLOPs). Counters:
//   GFLOPs       achieved GFLOP/s (MODEL.md convention; attention counts the full T x T products,
//                12 B T^2 C for fwd+bwd, which is what MFU credits)
//   frac_peak    GFLOPs / the SGEMM peak (2048^3, same BLAS, same thread count) measured at start
// The peak is in the context block ("sgemm_2048_gflops").
//
//   OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 GOMP_SPINCOUNT=1000
//     furnace_bench_kernels --threads=1 --benchmark_min_time=0.05
// --threads=N (ours, default $OPENBLAS_NUM_THREADS or 1) sets the BLAS pool before anything runs;
// every other flag goes to Google Benchmark (v1.7.1 flag format).
#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/attention.h"
#include "kernels/blas.h"
#include "kernels/gelu.h"
#include "kernels/matmul.h"
#include "runtime/train/peak_flops.h"

namespace {
namespace k = furnace::kernels::cpu;

double g_peak = 0;  // FLOP/s

std::vector<float> Random(int64_t n, uint32_t seed, float scale = 0.1f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-scale, scale);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = u(rng);
  return v;
}

void SetCounters(benchmark::State& state, double flops_per_iter) {
  state.counters["GFLOPs"] =
      benchmark::Counter(flops_per_iter / 1e9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["frac_peak"] =
      benchmark::Counter(flops_per_iter / g_peak, benchmark::Counter::kIsIterationInvariantRate);
}

// The MoE expert MLP's two grouped GEMMs, forward and backward, as moe_block.cc calls them:
// h = x @ W1[e] + b1[e] (S, C) -> (S, F); y = gelu(h) @ W2[e] + b2[e] (S, F) -> (S, C); then the
// backward of both (dinp and dweight/dbias). Routing is uniform: S / E rows per expert.
// Args: S (= tokens * k), C (d_model), F (expert_ffn), E (experts).
void BM_ExpertGroupedGemmFwdBwd(benchmark::State& state) {
  const int64_t S = state.range(0);
  const int C = static_cast<int>(state.range(1)), F = static_cast<int>(state.range(2));
  const int E = static_cast<int>(state.range(3));
  std::vector<int64_t> off(E + 1);
  for (int e = 0; e <= E; ++e) off[e] = S * e / E;
  auto x = Random(S * C, 1), dx = Random(S * C, 2), h = Random(S * F, 3), dh = Random(S * F, 4);
  auto y = Random(S * C, 5), dy = Random(S * C, 6);
  auto w1 = Random(int64_t{E} * C * F, 7), dw1 = Random(int64_t{E} * C * F, 8);
  auto w2 = Random(int64_t{E} * F * C, 9), dw2 = Random(int64_t{E} * F * C, 10);
  auto b1 = Random(int64_t{E} * F, 11), db1 = Random(int64_t{E} * F, 12);
  auto b2 = Random(int64_t{E} * C, 13), db2 = Random(int64_t{E} * C, 14);
  for (auto _ : state) {
    k::GroupedMatmulForward<float>(h.data(), x.data(), w1.data(), b1.data(), off.data(), E, C, F);
    k::GroupedMatmulForward<float>(y.data(), h.data(), w2.data(), b2.data(), off.data(), E, F, C);
    k::GroupedMatmulBackward<float>(dh.data(), dw2.data(), db2.data(), dy.data(), h.data(),
                                    w2.data(), off.data(), E, F, C);
    k::GroupedMatmulBackward<float>(dx.data(), dw1.data(), db1.data(), dh.data(), x.data(),
                                    w1.data(), off.data(), E, C, F);
    benchmark::ClobberMemory();
  }
  SetCounters(state, 2.0 * 6.0 * double(S) * C * F);  // 2 GEMMs x (fwd 2 + bwd 4) S C F
}

// Forward only, to split the above.
void BM_ExpertGroupedGemmFwd(benchmark::State& state) {
  const int64_t S = state.range(0);
  const int C = static_cast<int>(state.range(1)), F = static_cast<int>(state.range(2));
  const int E = static_cast<int>(state.range(3));
  std::vector<int64_t> off(E + 1);
  for (int e = 0; e <= E; ++e) off[e] = S * e / E;
  auto x = Random(S * C, 1), h = Random(S * F, 3), y = Random(S * C, 5);
  auto w1 = Random(int64_t{E} * C * F, 7), w2 = Random(int64_t{E} * F * C, 9);
  auto b1 = Random(int64_t{E} * F, 11), b2 = Random(int64_t{E} * C, 13);
  for (auto _ : state) {
    k::GroupedMatmulForward<float>(h.data(), x.data(), w1.data(), b1.data(), off.data(), E, C, F);
    k::GroupedMatmulForward<float>(y.data(), h.data(), w2.data(), b2.data(), off.data(), E, F, C);
    benchmark::ClobberMemory();
  }
  SetCounters(state, 2.0 * 2.0 * double(S) * C * F);
}

// Causal attention core (QK^T, softmax, AV) forward + backward on a fused qkv, the probabilities
// stored (B, NH, T, T) or, with row_stats (model.attention_probs recomputed, kernels/attention.h
// RowStats), (B, NH, T, 2) row statistics saved instead and P rebuilt in backward (one more Q K^T
// product). Counter "saved_MiB": what the variant keeps between forward and backward.
// Args: B, T, C, NH.
void AttentionFwdBwd(benchmark::State& state, bool row_stats) {
  const int B = static_cast<int>(state.range(0)), T = static_cast<int>(state.range(1));
  const int C = static_cast<int>(state.range(2)), NH = static_cast<int>(state.range(3));
  auto qkv = Random(int64_t{B} * T * 3 * C, 1, 1.0f), dqkv = Random(int64_t{B} * T * 3 * C, 2);
  auto out = Random(int64_t{B} * T * C, 3), dout = Random(int64_t{B} * T * C, 4);
  std::vector<float> saved(static_cast<size_t>(B) * NH * T * (row_stats ? 2 : T));
  for (auto _ : state) {
    if (row_stats) {
      k::AttentionForwardRowStats<float>(out.data(), saved.data(), qkv.data(), B, T, C, NH);
      k::AttentionBackwardRowStats<float>(dqkv.data(), dout.data(), qkv.data(), saved.data(), B, T,
                                          C, NH);
    } else {
      k::AttentionForward<float>(out.data(), saved.data(), qkv.data(), B, T, C, NH);
      k::AttentionBackward<float>(dqkv.data(), dout.data(), qkv.data(), saved.data(), B, T, C, NH);
    }
    benchmark::ClobberMemory();
  }
  SetCounters(state, 12.0 * B * double(T) * T * C);
  state.counters["saved_MiB"] = 4.0 * saved.size() / (1 << 20);
}
void BM_AttentionFwdBwd(benchmark::State& state) { AttentionFwdBwd(state, false); }
void BM_AttentionRowStatsFwdBwd(benchmark::State& state) { AttentionFwdBwd(state, true); }

void BM_AttentionFwd(benchmark::State& state) {
  const int B = static_cast<int>(state.range(0)), T = static_cast<int>(state.range(1));
  const int C = static_cast<int>(state.range(2)), NH = static_cast<int>(state.range(3));
  auto qkv = Random(int64_t{B} * T * 3 * C, 1, 1.0f);
  auto out = Random(int64_t{B} * T * C, 3);
  std::vector<float> att(static_cast<size_t>(B) * NH * T * T);
  for (auto _ : state) {
    k::AttentionForward<float>(out.data(), att.data(), qkv.data(), B, T, C, NH);
    benchmark::ClobberMemory();
  }
  SetCounters(state, 4.0 * B * double(T) * T * C);
}

// A dense linear fwd+bwd (the attention qkv projection) for comparison: same BLAS, one GEMM per
// pass. Args: N, C, OC.
void BM_DenseLinearFwdBwd(benchmark::State& state) {
  const int N = static_cast<int>(state.range(0)), C = static_cast<int>(state.range(1));
  const int OC = static_cast<int>(state.range(2));
  auto x = Random(int64_t{N} * C, 1), dx = Random(int64_t{N} * C, 2);
  auto y = Random(int64_t{N} * OC, 3), dy = Random(int64_t{N} * OC, 4);
  auto w = Random(int64_t{C} * OC, 5), dw = Random(int64_t{C} * OC, 6);
  auto b = Random(OC, 7), db = Random(OC, 8);
  for (auto _ : state) {
    k::MatmulForward<float>(y.data(), x.data(), w.data(), b.data(), N, C, OC);
    k::MatmulBackward<float>(dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(), N, C,
                             OC);
    benchmark::ClobberMemory();
  }
  SetCounters(state, 6.0 * double(N) * C * OC);
}

// Shapes. demo: configs/demo.yaml (B=8 T=64 d=64 h=4 E=8 k=2 f=128: S = 8*64*2 = 1024);
// bench: BENCHMARKING.md (B=8 T=128 d=256 h=4 E=8 k=2 f=512: S = 2048); large: GPT-2-small-like.
BENCHMARK(BM_ExpertGroupedGemmFwdBwd)
    ->ArgNames({"S", "C", "F", "E"})
    ->Args({1024, 64, 128, 8})    // demo
    ->Args({2048, 256, 512, 8})   // bench
    ->Args({4096, 512, 2048, 8})  // large
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(BM_ExpertGroupedGemmFwd)
    ->ArgNames({"S", "C", "F", "E"})
    ->Args({1024, 64, 128, 8})
    ->Args({2048, 256, 512, 8})
    ->Args({4096, 512, 2048, 8})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
// The attention shapes: demo, bench, large, GPT-2 small (T = 1024).
void AttentionShapes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"B", "T", "C", "NH"})
      ->Args({8, 64, 64, 4})
      ->Args({8, 128, 256, 4})
      ->Args({8, 512, 512, 8})
      ->Args({4, 1024, 768, 12})
      ->Unit(benchmark::kMillisecond)
      ->UseRealTime();
}
BENCHMARK(BM_AttentionFwdBwd)->Apply(AttentionShapes);
BENCHMARK(BM_AttentionRowStatsFwdBwd)->Apply(AttentionShapes);
BENCHMARK(BM_AttentionFwd)->Apply(AttentionShapes);
// The experts' GELU forward and backward over n elements (the demo's expert hidden: S rows of f).
void BM_GeluFwdBwd(benchmark::State& state) {
  const int64_t n = state.range(0);
  const std::vector<float> x = Random(n, 1, 3.0f), dy = Random(n, 2);
  std::vector<float> y(static_cast<size_t>(n)), dx(static_cast<size_t>(n), 0.0f);
  for (auto _ : state) {
    k::GeluForward(y.data(), x.data(), n);
    k::GeluBackward(dx.data(), x.data(), dy.data(), n);
    benchmark::DoNotOptimize(y.data());
    benchmark::DoNotOptimize(dx.data());
  }
  // Elements (forward and backward) per second.
  state.counters["elements_per_s"] =
      benchmark::Counter(static_cast<double>(n), benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_GeluFwdBwd)
    ->ArgNames({"n"})
    ->Arg(512 * 2 * 128)  // demo: N k rows of expert_ffn
    ->Arg(2048 * 512)     // bench: S = 2048 rows of f = 512
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();
BENCHMARK(BM_DenseLinearFwdBwd)
    ->ArgNames({"N", "C", "OC"})
    ->Args({512, 64, 192})     // demo qkv
    ->Args({1024, 256, 768})   // bench qkv
    ->Args({4096, 512, 1536})  // large qkv
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace

int main(int argc, char** argv) {
  int threads = 1;
  if (const char* e = std::getenv("OPENBLAS_NUM_THREADS")) threads = std::atoi(e);
  std::vector<char*> rest;
  for (int i = 0; i < argc; ++i) {
    if (std::strncmp(argv[i], "--threads=", 10) == 0) {
      threads = std::atoi(argv[i] + 10);
    } else {
      rest.push_back(argv[i]);
    }
  }
  if (threads < 1) threads = 1;
  k::SetBlasThreads(threads);
  g_peak = furnace::train::MeasureSgemmPeakFlops();
  benchmark::AddCustomContext("blas_threads", std::to_string(threads));
  benchmark::AddCustomContext("sgemm_2048_gflops", std::to_string(g_peak / 1e9));
  for (const char* v : {"OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "GOMP_SPINCOUNT"}) {
    const char* e = std::getenv(v);
    benchmark::AddCustomContext(v, e ? e : "<unset>");
  }
  int n = static_cast<int>(rest.size());
  benchmark::Initialize(&n, rest.data());
  if (benchmark::ReportUnrecognizedArguments(n, rest.data())) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
