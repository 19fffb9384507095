// GEMM and grouped-GEMM throughput of the CUDA bf16 table (bf16 operands, fp32 accumulation and
// fp32 results) against cuBLAS's own dense bf16 GEMM (cublasGemmEx, bf16 A/B, fp32 C,
// CUBLAS_COMPUTE_32F) on the same device, at the expert shapes of a 1B-class MoE (d 2048; 8 experts
// of f 5632, 16 of 2816, 64 of 1408; 8192 tokens routed top-k), with balanced and skewed groups.
// Columns (TFLOPS, then the ratio to dense cuBLAS of the same FLOPs):
//   dense cuBLAS     one cublasGemmEx (S, d) @ (d, f) on bf16 copies: the reference
//   table dense      CudaBf16Backend().matmul_forward on (S, d) fp32: our casts + the same GEMM
//   table grouped    CudaBf16Backend().grouped_matmul_forward: casts + one GemmEx per expert
//   grouped kernels  the same per-expert GemmEx loop on bf16 copies made beforehand (no casts)
//   grouped batched  cublasGemmGroupedBatchedEx on those copies (one call; "n/a" if refused)
//   fast16bf         the per-expert loop on the fp32 operands with CUBLAS_COMPUTE_32F_FAST_16BF
//                    (cuBLAS converts to bf16 inside the GEMM: no cast passes, but its rounding
//                    is not documented as nearest-even; the check column gives its distance to
//                    the table's result, ~1e-6 if it rounds as we do, ~1e-3 if not)
//   table grouped bw CudaBf16Backend().grouped_matmul_backward (dinp and dweight: 2x the FLOPs)
// Each number is the median of 10 event-timed runs after 3 warm-ups, inputs alternating between
// two random sets (fresh values, never zeros); the spread (min-max) is printed. The check column
// compares the table's grouped output with the kernel-only loop's and the batched call's.
// Without a GPU: prints the header, says so, exits 0.
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
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
#include "runtime/device/weight_mirror.h"

namespace fd = furnace::device;
namespace fg = furnace::bench::gpu;

namespace {

constexpr int kD = 2048;
constexpr int64_t kTokens = 8192;
constexpr int kWarmup = 3, kReps = 10;

struct Config {
  const char* name;
  int E, f, k;
};
constexpr Config kConfigs[] = {
    {"E8 f5632 k2", 8, 5632, 2}, {"E16 f2816 k2", 16, 2816, 2}, {"E64 f1408 k4", 64, 1408, 4}};

double Tflops(double flops, double ms) { return ms > 0 ? flops / (ms * 1e-3) / 1e12 : 0; }

// A device buffer freed with the device (synchronous frees at the end only).
class Buffers {
 public:
  explicit Buffers(fd::Device& dev) : dev_(dev) {}
  ~Buffers() {
    BENCH_CUDA(cudaDeviceSynchronize());
    for (void* p : ptrs_) dev_.Free(p);
  }
  template <typename T>
  T* Get(int64_t n) {
    auto p = dev_.Allocate(static_cast<size_t>(n) * sizeof(T));
    if (!p.ok()) {
      std::fprintf(stderr, "allocation of %lld bytes failed: %s\n",
                   static_cast<long long>(n * sizeof(T)),
                   std::string(p.status().message()).c_str());
      std::exit(1);
    }
    ptrs_.push_back(*p);
    return static_cast<T*>(*p);
  }

 private:
  fd::Device& dev_;
  std::vector<void*> ptrs_;
};

void GemmBf16(cublasHandle_t h, int m, int n, int k, const void* A, int lda, const void* B, int ldb,
              float* C, int ldc) {
  const float one = 1.0f, zero = 0.0f;
  BENCH_CUDA(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &one, A, CUDA_R_16BF, lda, B,
                          CUDA_R_16BF, ldb, &zero, C, CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F,
                          CUBLAS_GEMM_DEFAULT));
}

double MaxRelDiff(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a[i]) || !std::isfinite(b[i])) return INFINITY;
    num += (double{a[i]} - b[i]) * (double{a[i]} - b[i]);
    den += double{b[i]} * b[i];
  }
  return den > 0 ? std::sqrt(num / den) : 0;
}

std::vector<float> Download(const float* d, int64_t n, cudaStream_t s) {
  std::vector<float> h(n);
  BENCH_CUDA(cudaMemcpyAsync(h.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost, s));
  BENCH_CUDA(cudaStreamSynchronize(s));
  return h;
}

void PrintHeader() {
  std::printf("%-13s %-9s %5s | %13s %13s %13s %13s %13s %13s %13s %13s | %s\n", "config", "groups",
              "max/m", "dense cuBLAS", "table dense", "table grouped", "grp mirror", "grouped kern",
              "grouped batch", "fast16bf", "table grp bw", "check");
}

}  // namespace

int main() {
  std::printf(
      "bf16 GEMM TFLOPS (ratio to dense cuBLAS bf16 of the same FLOPs); d %d, %lld tokens\n", kD,
      static_cast<long long>(kTokens));
  const std::string no_gpu = fg::NoGpuReason();
  if (!no_gpu.empty()) {
    PrintHeader();
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
  fd::Stream& stream = **stream_or;
  cudaStream_t s = static_cast<cudaStream_t>(stream.native());
  fd::StreamScope scope(stream);
  const fd::Backend& table = fd::CudaBf16Backend();
  cublasHandle_t handle = nullptr;
  BENCH_CUDA(cublasCreate(&handle));
  BENCH_CUDA(cublasSetStream(handle, s));
  PrintHeader();

  for (const Config& cfg : kConfigs) {
    const int E = cfg.E, F = cfg.f;
    const int64_t S = kTokens * cfg.k;
    const double flops = 2.0 * S * kD * F;
    Buffers buf(*dev);
    float* x[2] = {buf.Get<float>(S * kD), buf.Get<float>(S * kD)};
    float* w = buf.Get<float>(int64_t{E} * kD * F);
    float* out = buf.Get<float>(S * F);
    float* out_ref = buf.Get<float>(S * F);
    float* dout = buf.Get<float>(S * F);
    float* dx = buf.Get<float>(S * kD);
    float* dw = buf.Get<float>(int64_t{E} * kD * F);
    uint16_t* x16[2] = {buf.Get<uint16_t>(S * kD), buf.Get<uint16_t>(S * kD)};
    uint16_t* w16 = buf.Get<uint16_t>(int64_t{E} * kD * F);
    for (int i = 0; i < 2; ++i) fg::FillUniform(x[i], S * kD, 10 + i, 1.0f, s);
    fg::FillUniform(w, int64_t{E} * kD * F, 20, 0.02f, s);
    fg::FillUniform(dout, S * F, 30, 1.0f, s);
    for (int i = 0; i < 2; ++i) table.cast_f32_to_bf16(x16[i], x[i], S * kD);
    table.cast_f32_to_bf16(w16, w, int64_t{E} * kD * F);
    BENCH_CUDA(cudaStreamSynchronize(s));

    // Dense references (independent of the grouping): the whole (S, d) @ (d, f) as one GEMM.
    const fg::Spread dense = fg::SpreadOf(fg::TimeMs(s, kWarmup, kReps, [&](int r) {
      GemmBf16(handle, F, static_cast<int>(S), kD, w16, F, x16[r % 2], kD, out_ref, F);
    }));
    const fg::Spread table_dense = fg::SpreadOf(fg::TimeMs(s, kWarmup, kReps, [&](int r) {
      table.matmul_forward(out, x[r % 2], w, nullptr, static_cast<int>(S), kD, F);
    }));

    for (bool skewed : {false, true}) {
      const std::vector<int64_t> offsets = fg::GroupOffsets(S, E, skewed, 7);
      const fg::Spread grouped = fg::SpreadOf(fg::TimeMs(s, kWarmup, kReps, [&](int r) {
        table.grouped_matmul_forward(out, x[r % 2], w, nullptr, offsets.data(), E, kD, F);
      }));
      // The same with the weight's bf16 mirror registered (runtime/device/weight_mirror.h, as the
      // model runs at precision bf16): only the activation operand is cast per call.
      fg::Spread grouped_mirror;
      {
        const fd::WeightMirror mirror(w, w16, int64_t{E} * kD * F);
        grouped_mirror = fg::SpreadOf(fg::TimeMs(s, kWarmup, kReps, [&](int r) {
          table.grouped_matmul_forward(out, x[r % 2], w, nullptr, offsets.data(), E, kD, F);
        }));
      }
      auto kernel_loop = [&](int r, float* o) {
        const auto* xb = reinterpret_cast<const __nv_bfloat16*>(x16[r % 2]);
        const auto* wb = reinterpret_cast<const __nv_bfloat16*>(w16);
        for (int e = 0; e < E; ++e) {
          const int64_t rows = offsets[e + 1] - offsets[e];
          if (rows == 0) continue;
          GemmBf16(handle, F, static_cast<int>(rows), kD, wb + int64_t{e} * kD * F, F,
                   xb + offsets[e] * kD, kD, o + offsets[e] * F, F);
        }
      };
      const fg::Spread kernels =
          fg::SpreadOf(fg::TimeMs(s, kWarmup, kReps, [&](int r) { kernel_loop(r, out_ref); }));

      // cublasGemmGroupedBatchedEx: E groups of one GEMM each; pointer arrays on the device.
      std::vector<cublasOperation_t> ops(E, CUBLAS_OP_N);
      std::vector<int> m(E, F), n(E), kk(E, kD), lda(E, F), ldb(E, kD), ldc(E, F), size(E, 1);
      std::vector<float> alpha(E, 1.0f), beta(E, 0.0f);
      std::vector<const void*> a_host(E), b_host[2];
      std::vector<void*> c_host(E);
      b_host[0].resize(E);
      b_host[1].resize(E);
      int groups = 0;
      for (int e = 0; e < E; ++e) {
        const int64_t rows = offsets[e + 1] - offsets[e];
        if (rows == 0) continue;
        n[groups] = static_cast<int>(rows);
        a_host[groups] = w16 + int64_t{e} * kD * F;
        for (int i = 0; i < 2; ++i) b_host[i][groups] = x16[i] + offsets[e] * kD;
        c_host[groups] = out + offsets[e] * F;
        ++groups;
      }
      const void** a_dev = buf.Get<const void*>(E);
      const void** b_dev[2] = {buf.Get<const void*>(E), buf.Get<const void*>(E)};
      void** c_dev = buf.Get<void*>(E);
      BENCH_CUDA(cudaMemcpy(a_dev, a_host.data(), E * sizeof(void*), cudaMemcpyHostToDevice));
      for (int i = 0; i < 2; ++i) {
        BENCH_CUDA(
            cudaMemcpy(b_dev[i], b_host[i].data(), E * sizeof(void*), cudaMemcpyHostToDevice));
      }
      BENCH_CUDA(cudaMemcpy(c_dev, c_host.data(), E * sizeof(void*), cudaMemcpyHostToDevice));
      auto batched = [&](int r) {
        return cublasGemmGroupedBatchedEx(
            handle, ops.data(), ops.data(), m.data(), n.data(), kk.data(), alpha.data(), a_dev,
            CUDA_R_16BF, lda.data(), b_dev[r % 2], CUDA_R_16BF, ldb.data(), beta.data(), c_dev,
            CUDA_R_32F, ldc.data(), groups, size.data(), CUBLAS_COMPUTE_32F);
      };
      const cublasStatus_t probe = batched(0);
      fg::Spread grouped_batched;
      double batched_diff = -1;
      if (probe == CUBLAS_STATUS_SUCCESS) {
        grouped_batched =
            fg::SpreadOf(fg::TimeMs(s, kWarmup, kReps, [&](int r) { BENCH_CUDA(batched(r)); }));
      }
      // fp32 operands, bf16 conversion inside cuBLAS (CUBLAS_COMPUTE_32F_FAST_16BF).
      auto fast_loop = [&](int r, float* o) {
        const float one = 1.0f, zero = 0.0f;
        for (int e = 0; e < E; ++e) {
          const int64_t rows = offsets[e + 1] - offsets[e];
          if (rows == 0) continue;
          BENCH_CUDA(cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, F, static_cast<int>(rows), kD,
                                  &one, w + int64_t{e} * kD * F, CUDA_R_32F, F,
                                  x[r % 2] + offsets[e] * kD, CUDA_R_32F, kD, &zero,
                                  o + offsets[e] * F, CUDA_R_32F, F, CUBLAS_COMPUTE_32F_FAST_16BF,
                                  CUBLAS_GEMM_DEFAULT));
        }
      };
      const fg::Spread fast =
          fg::SpreadOf(fg::TimeMs(s, kWarmup, kReps, [&](int r) { fast_loop(r, out_ref); }));
      const fg::Spread backward = fg::SpreadOf(fg::TimeMs(s, kWarmup, kReps, [&](int r) {
        table.grouped_matmul_backward(dx, dw, nullptr, dout, x[r % 2], w, offsets.data(), E, kD, F);
      }));

      // Checks on input set 0: table grouped vs the kernel loop (same roundings and GEMMs) and
      // the batched call vs the loop.
      table.grouped_matmul_forward(out, x[0], w, nullptr, offsets.data(), E, kD, F);
      const std::vector<float> got = Download(out, S * F, s);
      kernel_loop(0, out_ref);
      const std::vector<float> want = Download(out_ref, S * F, s);
      const double table_diff = MaxRelDiff(got, want);
      double mirror_diff = 0;
      {
        const fd::WeightMirror mirror(w, w16, int64_t{E} * kD * F);
        table.grouped_matmul_forward(out, x[0], w, nullptr, offsets.data(), E, kD, F);
        mirror_diff = MaxRelDiff(Download(out, S * F, s), got);
      }
      if (probe == CUBLAS_STATUS_SUCCESS) {
        BENCH_CUDA(batched(0));
        batched_diff = MaxRelDiff(Download(out, S * F, s), want);
      }
      fast_loop(0, out_ref);
      const double fast_diff = MaxRelDiff(Download(out_ref, S * F, s), want);
      absl::Status sticky = dev->SynchronizeStream(stream);
      if (!sticky.ok()) {
        // (This row's times ran into the error: none is printed for it.)
        std::fprintf(stderr, "device error in %s %s: %s\n", cfg.name,
                     skewed ? "skewed" : "balanced", std::string(sticky.message()).c_str());
        return 1;
      }

      char batched_cell[32];
      if (probe == CUBLAS_STATUS_SUCCESS) {
        std::snprintf(batched_cell, sizeof(batched_cell), "%6.1f (%.2f)",
                      Tflops(flops, grouped_batched.median), dense.median / grouped_batched.median);
      } else {
        std::snprintf(batched_cell, sizeof(batched_cell), "n/a (%d)", static_cast<int>(probe));
      }
      std::printf(
          "%-13s %-9s %5.2f | %6.1f (1.00) %6.1f (%.2f) %6.1f (%.2f) %6.1f (%.2f) %6.1f (%.2f) "
          "%13s %6.1f (%.2f) %6.1f (%.2f) | table %.1e, mirror vs table %.1e, batched %.1e, "
          "fast16bf %.1e\n",
          cfg.name, skewed ? "skewed" : "balanced", fg::Imbalance(offsets),
          Tflops(flops, dense.median), Tflops(flops, table_dense.median),
          dense.median / table_dense.median, Tflops(flops, grouped.median),
          dense.median / grouped.median, Tflops(flops, grouped_mirror.median),
          dense.median / grouped_mirror.median, Tflops(flops, kernels.median),
          dense.median / kernels.median, batched_cell, Tflops(flops, fast.median),
          dense.median / fast.median, Tflops(2 * flops, backward.median),
          2 * dense.median / backward.median, table_diff, mirror_diff, batched_diff, fast_diff);
      std::printf(
          "%-13s %-9s %5s   spread ms: dense %.3f-%.3f, grouped %.3f-%.3f, kernels "
          "%.3f-%.3f, backward %.3f-%.3f\n",
          "", "", "", dense.min, dense.max, grouped.min, grouped.max, kernels.min, kernels.max,
          backward.min, backward.max);
      // The line tests/gpu/run.sh collects into the report's goals (issue 13: >= 0.70), judged on
      // the path the model runs: at precision bf16 every expert weight has its bf16 mirror, so
      // only the activations are cast per call. Without the mirror each call also re-rounds all
      // E * d * f weights, shown beside it.
      const double goal_ratio = dense.median / grouped_mirror.median;
      std::printf(
          "GOAL grouped GEMM %s %s: grp mirror (the model's path) %.2f of dense cuBLAS "
          "(target >= 0.70): %s; table grouped without the mirror %.2f\n",
          cfg.name, skewed ? "skewed" : "balanced", goal_ratio,
          goal_ratio >= 0.70 ? "PASS" : "MISS", dense.median / grouped.median);
    }
  }
  cublasDestroy(handle);
  std::printf(
      "goal: grouped GEMM with the weights' bf16 mirror >= 0.70 of dense cuBLAS (issue 13)\n");
  return 0;
}
