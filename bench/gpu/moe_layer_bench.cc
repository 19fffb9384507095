// The MoE layer forward and backward through a CUDA table, op by op as the model runs it: router
// GEMM (d -> E, in fp32 under every table, as the model), softmax, top-k, the routing indices back
// to the host (a stream synchronisation: the dispatch plan is built there), the aux loss (a host
// scalar), permute, expert GEMM 1 with bias, GELU, expert GEMM 2 with bias, weighted unpermute;
// then every backward op in reverse (accumulated gradients zeroed first, as a step does). 8192
// tokens (micro-batch 4 x T 2048), d 2048, the expert layouts of gemm_bench. Routing is real
// (random router weights and inputs: near-balanced) or skewed (a +2 logit bias on expert 0 through
// add_row, which makes it the busiest by far). Achieved TFLOPS = model FLOPs (12 S d f for the
// expert GEMMs, S = tokens x k, plus 6 N d E for the router) / the median event-timed fwd+bwd time
// (10 runs after 3 warm-ups, inputs alternating between two random sets). bf16 table for every
// layout, fp32 for the first. Without a GPU: prints the header, says so, exits 0.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "bench/gpu/gpu_bench_util.h"
#include "runtime/device/backend.h"
#include "runtime/device/cuda_backend.h"
#include "runtime/device/current_stream.h"
#include "runtime/device/device.h"

namespace fd = furnace::device;
namespace fg = furnace::bench::gpu;

namespace {

constexpr int kD = 2048;
constexpr int kTokens = 8192;
constexpr int kWarmup = 3, kReps = 10;

struct Config {
  const char* name;
  int E, f, k;
};
// The first is furnace_train_step_bench's MoE layer (its figures line up with that MFU run).
constexpr Config kConfigs[] = {{"E8 f4096 k2", 8, 4096, 2},
                               {"E8 f5632 k2", 8, 5632, 2},
                               {"E16 f2816 k2", 16, 2816, 2},
                               {"E64 f1408 k4", 64, 1408, 4}};

class Pool {
 public:
  explicit Pool(fd::Device& dev) : dev_(dev) {}
  ~Pool() {
    BENCH_CUDA(cudaDeviceSynchronize());
    for (void* p : ptrs_) dev_.Free(p);
  }
  template <typename T>
  T* Get(int64_t n) {
    auto p = dev_.Allocate(static_cast<size_t>(n > 0 ? n : 1) * sizeof(T));
    if (!p.ok()) {
      std::fprintf(stderr, "allocation failed: %s\n", std::string(p.status().message()).c_str());
      std::exit(1);
    }
    ptrs_.push_back(*p);
    return static_cast<T*>(*p);
  }

 private:
  fd::Device& dev_;
  std::vector<void*> ptrs_;
};

struct Result {
  fg::Spread total, fwd, bwd;
  double imbalance = 0;
  int64_t rows = 0;
};

// One layout through one table: returns the timings.
Result Run(fd::Device& dev, fd::Stream& stream, const fd::Backend& t, const Config& cfg,
           bool skewed) {
  cudaStream_t s = static_cast<cudaStream_t>(stream.native());
  const int N = kTokens, E = cfg.E, F = cfg.f, K = cfg.k;
  const int64_t S_max = int64_t{N} * K;  // dropless: every routed token
  Pool p(dev);
  float* u[2] = {p.Get<float>(int64_t{N} * kD), p.Get<float>(int64_t{N} * kD)};
  float* wg = p.Get<float>(int64_t{kD} * E);
  float* w1 = p.Get<float>(int64_t{E} * kD * F);
  float* b1 = p.Get<float>(int64_t{E} * F);
  float* w2 = p.Get<float>(int64_t{E} * F * kD);
  float* b2 = p.Get<float>(int64_t{E} * kD);
  float* dout = p.Get<float>(int64_t{N} * kD);
  float* logits = p.Get<float>(int64_t{N} * E);
  float* probs = p.Get<float>(int64_t{N} * E);
  int32_t* idx = p.Get<int32_t>(int64_t{N} * K);
  float* gates = p.Get<float>(int64_t{N} * K);
  float* xp = p.Get<float>(S_max * kD);
  float* h = p.Get<float>(S_max * F);
  float* g = p.Get<float>(S_max * F);
  float* y = p.Get<float>(S_max * kD);
  float* out = p.Get<float>(int64_t{N} * kD);
  // Gradients (accumulated): activations' zeroed per iteration, parameters' once.
  float* dy = p.Get<float>(S_max * kD);
  float* dgates = p.Get<float>(int64_t{N} * K);
  float* dg = p.Get<float>(S_max * F);
  float* dh = p.Get<float>(S_max * F);
  float* dxp = p.Get<float>(S_max * kD);
  float* du = p.Get<float>(int64_t{N} * kD);
  float* dprobs = p.Get<float>(int64_t{N} * E);
  float* dlogits = p.Get<float>(int64_t{N} * E);
  float* dwg = p.Get<float>(int64_t{kD} * E);
  float* dw1 = p.Get<float>(int64_t{E} * kD * F);
  float* db1 = p.Get<float>(int64_t{E} * F);
  float* dw2 = p.Get<float>(int64_t{E} * F * kD);
  float* db2 = p.Get<float>(int64_t{E} * kD);
  for (int i = 0; i < 2; ++i) fg::FillUniform(u[i], int64_t{N} * kD, 1 + i, 1.0f, s);
  fg::FillUniform(wg, int64_t{kD} * E, 3, 0.02f, s);
  fg::FillUniform(w1, int64_t{E} * kD * F, 4, 0.02f, s);
  fg::FillUniform(b1, int64_t{E} * F, 5, 0.02f, s);
  fg::FillUniform(w2, int64_t{E} * F * kD, 6, 0.02f, s);
  fg::FillUniform(b2, int64_t{E} * kD, 7, 0.02f, s);
  fg::FillUniform(dout, int64_t{N} * kD, 8, 1.0f, s);
  int32_t* idx_host = nullptr;
  BENCH_CUDA(cudaMallocHost(&idx_host, sizeof(int32_t) * N * K));
  std::vector<float> bias_row(E, 0.0f);
  bias_row[0] = 2.0f;

  Result result;
  fd::DispatchPlan plan;
  std::vector<double> fwd_ms, bwd_ms;
  cudaEvent_t mid = nullptr;
  BENCH_CUDA(cudaEventCreate(&mid));
  cudaEvent_t begin = nullptr;
  BENCH_CUDA(cudaEventCreate(&begin));
  // The router runs in fp32 under every table, as the model runs it (moe_block.cc RouterOps): its
  // logits decide the routing, which bf16 would change.
  const fd::Backend& router = fd::CudaBackend();
  auto iteration = [&](int r) {
    const float* x = u[r % 2];
    BENCH_CUDA(cudaEventRecord(begin, s));
    router.matmul_forward(logits, x, wg, nullptr, N, kD, E);
    if (skewed) t.add_row(logits, bias_row.data(), N, E);
    t.softmax_forward(probs, logits, N, E);
    t.topk_forward(idx, gates, probs, N, E, K, true);
    BENCH_CUDA(cudaMemcpyAsync(idx_host, idx, sizeof(int32_t) * N * K, cudaMemcpyDeviceToHost, s));
    BENCH_CUDA(cudaStreamSynchronize(s));
    plan = t.make_dispatch_plan(idx_host, N, E, K, 0.0);
    const float aux = t.aux_loss_forward(probs, idx, N, E, K, 0.01f);
    if (!(aux >= 0)) {
      std::fprintf(stderr, "aux loss %f: the device failed\n", aux);
      std::exit(1);
    }
    const int64_t S = plan.rows();
    const int64_t* offsets = plan.offsets.data();
    t.permute_forward(xp, x, plan, kD);
    t.grouped_matmul_forward(h, xp, w1, b1, offsets, E, kD, F);
    t.gelu_forward(g, h, S * F);
    t.grouped_matmul_forward(y, g, w2, b2, offsets, E, F, kD);
    t.unpermute_forward(out, y, gates, plan, kD);
    BENCH_CUDA(cudaEventRecord(mid, s));
    // Backward.
    for (auto [ptr, n] :
         {std::pair{dy, S * kD}, std::pair{dgates, int64_t{N} * K}, std::pair{dg, S * F},
          std::pair{dh, S * F}, std::pair{dxp, S * kD}, std::pair{du, int64_t{N} * kD},
          std::pair{dprobs, int64_t{N} * E}, std::pair{dlogits, int64_t{N} * E}}) {
      BENCH_CUDA(cudaMemsetAsync(ptr, 0, n * sizeof(float), s));
    }
    t.unpermute_backward(dy, dgates, dout, y, gates, plan, kD);
    t.grouped_matmul_backward(dg, dw2, db2, dy, g, w2, offsets, E, F, kD);
    t.gelu_backward(dh, h, dg, S * F);
    t.grouped_matmul_backward(dxp, dw1, db1, dh, xp, w1, offsets, E, kD, F);
    t.permute_backward(du, dxp, plan, kD);
    t.aux_loss_backward(dprobs, idx, N, E, K, 0.01f, 1.0f);
    t.topk_backward(dprobs, dgates, probs, idx, N, E, K, true);
    t.softmax_backward(dlogits, dprobs, probs, N, E);
    router.matmul_backward(du, dwg, nullptr, dlogits, x, wg, N, kD, E);
  };
  BENCH_CUDA(cudaMemsetAsync(dwg, 0, sizeof(float) * kD * E, s));
  BENCH_CUDA(cudaMemsetAsync(dw1, 0, sizeof(float) * E * kD * F, s));
  BENCH_CUDA(cudaMemsetAsync(db1, 0, sizeof(float) * E * F, s));
  BENCH_CUDA(cudaMemsetAsync(dw2, 0, sizeof(float) * E * F * kD, s));
  BENCH_CUDA(cudaMemsetAsync(db2, 0, sizeof(float) * E * kD, s));

  for (int i = 0; i < kWarmup; ++i) iteration(i);
  std::vector<double> total_ms;
  cudaEvent_t end = nullptr;
  BENCH_CUDA(cudaEventCreate(&end));
  for (int i = 0; i < kReps; ++i) {
    iteration(kWarmup + i);
    BENCH_CUDA(cudaEventRecord(end, s));
    BENCH_CUDA(cudaEventSynchronize(end));
    float a = 0, b = 0;
    BENCH_CUDA(cudaEventElapsedTime(&a, begin, mid));
    BENCH_CUDA(cudaEventElapsedTime(&b, mid, end));
    fwd_ms.push_back(a);
    bwd_ms.push_back(b);
    total_ms.push_back(a + b);
  }
  absl::Status sticky = dev.SynchronizeStream(stream);
  if (!sticky.ok()) {
    std::fprintf(stderr, "device error: %s\n", std::string(sticky.message()).c_str());
    std::exit(1);
  }
  result.total = fg::SpreadOf(total_ms);
  result.fwd = fg::SpreadOf(fwd_ms);
  result.bwd = fg::SpreadOf(bwd_ms);
  result.imbalance = fg::Imbalance(plan.offsets);
  result.rows = plan.rows();
  cudaEventDestroy(begin);
  cudaEventDestroy(mid);
  cudaEventDestroy(end);
  cudaFreeHost(idx_host);
  return result;
}

void Header() {
  std::printf("%-13s %-9s %-6s %6s | %9s %9s %9s | %8s | %s\n", "config", "routing", "table",
              "max/m", "fwd ms", "bwd ms", "total ms", "TFLOPS", "spread total ms");
}

}  // namespace

int main() {
  std::printf("MoE layer forward+backward through the CUDA table: %d tokens, d %d\n", kTokens, kD);
  const std::string no_gpu = fg::NoGpuReason();
  if (!no_gpu.empty()) {
    Header();
    std::printf("no GPU: %s; nothing measured\n", no_gpu.c_str());
    return 0;
  }
  auto dev_or = fd::CreateCudaDevice(0);
  if (!dev_or.ok()) {
    std::fprintf(stderr, "%s\n", std::string(dev_or.status().message()).c_str());
    return 1;
  }
  std::unique_ptr<fd::Device> dev = std::move(*dev_or);
  std::printf("device: %s\n", fg::DeviceLine().c_str());
  auto stream_or = dev->CreateStream();
  if (!stream_or.ok()) return 1;
  fd::StreamScope scope(**stream_or);
  Header();
  bool first = true;
  for (const Config& cfg : kConfigs) {
    for (bool skewed : {false, true}) {
      for (const fd::Backend* table : {&fd::CudaBf16Backend(), &fd::CudaBackend()}) {
        if (table == &fd::CudaBackend() && !first) continue;  // fp32: the first layout only
        const Result r = Run(*dev, **stream_or, *table, cfg, skewed);
        const double flops = 12.0 * r.rows * kD * cfg.f + 6.0 * kTokens * kD * cfg.E;
        std::printf("%-13s %-9s %-6s %6.2f | %9.3f %9.3f %9.3f | %8.1f | %.3f-%.3f\n", cfg.name,
                    skewed ? "skewed" : "real",
                    table->precision == fd::Precision::kBf16 ? "bf16" : "fp32", r.imbalance,
                    r.fwd.median, r.bwd.median, r.total.median,
                    flops / (r.total.median * 1e-3) / 1e12, r.total.min, r.total.max);
        if (table->precision == fd::Precision::kBf16) {  // the report's goals (measured)
          std::printf("GOAL MoE layer fwd+bwd %s %s routing: %.3f ms, %.1f TFLOP/s (bf16)\n",
                      cfg.name, skewed ? "skewed" : "real", r.total.median,
                      flops / (r.total.median * 1e-3) / 1e12);
        }
      }
      first = false;
    }
  }
  return 0;
}
