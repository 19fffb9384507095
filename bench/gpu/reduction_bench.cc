// The memory-bound reductions of a training step, against the device's memory bandwidth:
//   LayerNorm backward   16,384 x 2,048 (the train-step bench's micro-batch rows, d): dinp
//                        (one warp per row) and dweight/dbias (the column kernel: strips of 8
//                        columns, C / 8 blocks); bytes = dout and inp read twice, dinp read and
//                        written, so 6 N C floats
//   sum of squares       256 Mi floats (1 GiB: the gradient norm's pass over every gradient,
//                        kSumOfSquaresPartials blocks and a tree)
// GB/s = those bytes / the median event-timed run (7 after 2 warm-ups, spread printed), and the
// share of the datasheet's HBM bandwidth where the device is one this file knows (H200 4.8 TB/s,
// H100 SXM 3.35 TB/s, H100 PCIe 2.0 TB/s). Both ops are bandwidth-bound: a share far under 1 says
// a kernel leaves the memory idle (the column kernels ran C / 32 blocks, half of an H200's SMs,
// until 2026-12-07). The outputs are checked for finiteness only (the kernel tests hold them to
// the CPU oracle). Without a GPU: prints the header, says so, exits 0.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "bench/gpu/gpu_bench_util.h"
#include "kernels/cuda/layernorm.h"
#include "kernels/cuda/optimizer.h"

namespace fg = furnace::bench::gpu;
namespace kc = furnace::kernels::cuda;

namespace {

constexpr int kWarmup = 2, kReps = 7;
constexpr int kN = 16384, kC = 2048;
constexpr int64_t kSquares = int64_t{1} << 28;

void Header() {
  std::printf("%-20s %-22s %18s %9s %12s\n", "op", "shape", "ms (min-max)", "GB/s", "of datasheet");
}

// The datasheet's HBM bandwidth in GB/s for the devices this file knows; 0 otherwise.
double DatasheetGBps() {
  cudaDeviceProp p;
  if (cudaGetDeviceProperties(&p, 0) != cudaSuccess) return 0;
  const std::string name = p.name;
  if (name.find("H200") != std::string::npos) return 4800;
  if (name.find("H100") != std::string::npos) {
    return name.find("PCIe") != std::string::npos ? 2000 : 3350;
  }
  return 0;
}

void Row(const char* op, const char* shape, const fg::Spread& s, double bytes, double peak) {
  const double gbps = bytes / (s.median * 1e-3) / 1e9;
  char share[32] = "?";
  if (peak > 0) std::snprintf(share, sizeof(share), "%.2f", gbps / peak);
  std::printf("%-20s %-22s %7.3f (%.3f-%.3f) %9.0f %12s\n", op, shape, s.median, s.min, s.max, gbps,
              share);
}

template <typename T>
T* DeviceArray(int64_t n) {
  void* p = nullptr;
  BENCH_CUDA(cudaMalloc(&p, sizeof(T) * static_cast<size_t>(n)));
  return static_cast<T*>(p);
}

}  // namespace

int main() {
  std::printf("memory-bound reductions against the memory's bandwidth\n");
  const std::string no_gpu = fg::NoGpuReason();
  if (!no_gpu.empty()) {
    Header();
    std::printf("no GPU: %s; nothing measured\n", no_gpu.c_str());
    return 0;
  }
  std::printf("device: %s\n", fg::DeviceLine().c_str());
  const double peak = DatasheetGBps();
  cudaStream_t stream;
  BENCH_CUDA(cudaStreamCreate(&stream));
  const int64_t NC = int64_t{kN} * kC;
  float* inp = DeviceArray<float>(NC);
  float* dout = DeviceArray<float>(NC);
  float* out = DeviceArray<float>(NC);
  float* dinp = DeviceArray<float>(NC);
  float* weight = DeviceArray<float>(kC);
  float* bias = DeviceArray<float>(kC);
  float* dweight = DeviceArray<float>(kC);
  float* dbias = DeviceArray<float>(kC);
  float* mean = DeviceArray<float>(kN);
  float* rstd = DeviceArray<float>(kN);
  fg::FillUniform(inp, NC, 1, 1.0f, stream);
  fg::FillUniform(dout, NC, 2, 1.0f, stream);
  fg::FillUniform(weight, kC, 3, 1.0f, stream);
  fg::FillUniform(bias, kC, 4, 1.0f, stream);
  BENCH_CUDA(cudaMemsetAsync(dinp, 0, sizeof(float) * NC, stream));
  BENCH_CUDA(cudaMemsetAsync(dweight, 0, sizeof(float) * kC, stream));
  BENCH_CUDA(cudaMemsetAsync(dbias, 0, sizeof(float) * kC, stream));
  kc::LayerNormForward(out, mean, rstd, inp, weight, bias, kN, kC, 1e-5f, stream);
  BENCH_CUDA(cudaGetLastError());

  Header();
  const fg::Spread ln = fg::SpreadOf(fg::TimeMs(stream, kWarmup, kReps, [&](int) {
    kc::LayerNormBackward(dinp, dweight, dbias, dout, inp, weight, mean, rstd, kN, kC, stream);
  }));
  BENCH_CUDA(cudaGetLastError());
  Row("layernorm backward", "16384 x 2048", ln, 6.0 * NC * sizeof(float), peak);

  float* x = DeviceArray<float>(kSquares);
  double* sum = DeviceArray<double>(1);
  double* partials = DeviceArray<double>(kc::kSumOfSquaresPartials);
  fg::FillUniform(x, kSquares, 5, 1.0f, stream);
  const fg::Spread sq = fg::SpreadOf(fg::TimeMs(stream, kWarmup, kReps, [&](int) {
    kc::SumOfSquares(sum, partials, x, kSquares, /*accumulate=*/false, stream);
  }));
  BENCH_CUDA(cudaGetLastError());
  Row("sum of squares", "268435456", sq, static_cast<double>(kSquares) * sizeof(float), peak);

  // Finite results, and no sticky error from any launch.
  BENCH_CUDA(cudaStreamSynchronize(stream));
  std::vector<float> dw(kC);
  double total = 0;
  BENCH_CUDA(cudaMemcpy(dw.data(), dweight, sizeof(float) * kC, cudaMemcpyDeviceToHost));
  BENCH_CUDA(cudaMemcpy(&total, sum, sizeof(double), cudaMemcpyDeviceToHost));
  for (float v : dw) {
    if (!std::isfinite(v)) {
      std::fprintf(stderr, "layernorm backward: dweight is not finite\n");
      return 1;
    }
  }
  if (!std::isfinite(total) || total <= 0) {
    std::fprintf(stderr, "sum of squares: %g\n", total);
    return 1;
  }
  std::printf("check: dweight finite, sum of squares %.6g (expected about %.6g)\n", total,
              static_cast<double>(kSquares) / 3.0);
  for (void* p : {static_cast<void*>(inp), static_cast<void*>(dout), static_cast<void*>(out),
                  static_cast<void*>(dinp), static_cast<void*>(weight), static_cast<void*>(bias),
                  static_cast<void*>(dweight), static_cast<void*>(dbias), static_cast<void*>(mean),
                  static_cast<void*>(rstd), static_cast<void*>(x), static_cast<void*>(sum),
                  static_cast<void*>(partials)}) {
    BENCH_CUDA(cudaFree(p));
  }
  BENCH_CUDA(cudaStreamDestroy(stream));
  return 0;
}
