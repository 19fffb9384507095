#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <random>

#include "gpu_bench_util.h"

namespace furnace::bench::gpu {
namespace {

__device__ float HashUniform(uint64_t seed, int64_t i) {
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(i) + 1;
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return static_cast<float>(x >> 40) * (2.0f / 16777216.0f) - 1.0f;  // [-1, 1)
}

__global__ void FillKernel(float* d, int64_t n, uint64_t seed, float scale) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    d[i] = scale * HashUniform(seed, i);
  }
}

__global__ void FillBf16Kernel(__nv_bfloat16* d, int64_t n, uint64_t seed, float scale) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    d[i] = __float2bfloat16_rn(scale * HashUniform(seed, i));
  }
}

unsigned Grid(int64_t n) {
  return static_cast<unsigned>(std::min<int64_t>((n + 255) / 256, 65535LL * 8));
}

}  // namespace

std::string NoGpuReason() {
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return std::string("cudaGetDeviceCount: ") + cudaGetErrorString(err);
  }
  if (count == 0) return "cudaGetDeviceCount returned 0";
  return "";
}

void Check(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return;
  std::fprintf(stderr, "CUDA error in %s: %s\n", what, cudaGetErrorString(err));
  std::exit(1);
}

void Check(cublasStatus_t status, const char* what) {
  if (status == CUBLAS_STATUS_SUCCESS) return;
  std::fprintf(stderr, "cuBLAS error in %s: %s\n", what, cublasGetStatusString(status));
  std::exit(1);
}

std::vector<double> TimeMs(cudaStream_t stream, int warmup, int reps,
                           const std::function<void(int rep)>& run) {
  for (int i = 0; i < warmup; ++i) run(i);
  BENCH_CUDA(cudaStreamSynchronize(stream));
  std::vector<cudaEvent_t> events(2 * reps);
  for (cudaEvent_t& e : events) BENCH_CUDA(cudaEventCreate(&e));
  for (int i = 0; i < reps; ++i) {
    BENCH_CUDA(cudaEventRecord(events[2 * i], stream));
    run(warmup + i);
    BENCH_CUDA(cudaEventRecord(events[2 * i + 1], stream));
  }
  BENCH_CUDA(cudaStreamSynchronize(stream));
  BENCH_CUDA(cudaGetLastError());
  std::vector<double> ms(reps);
  for (int i = 0; i < reps; ++i) {
    float t = 0;
    BENCH_CUDA(cudaEventElapsedTime(&t, events[2 * i], events[2 * i + 1]));
    ms[i] = t;
  }
  for (cudaEvent_t e : events) cudaEventDestroy(e);
  return ms;
}

Spread SpreadOf(std::vector<double> ms) {
  Spread s;
  if (ms.empty()) return s;
  std::sort(ms.begin(), ms.end());
  const size_t n = ms.size();
  s.median = n % 2 ? ms[n / 2] : 0.5 * (ms[n / 2 - 1] + ms[n / 2]);
  s.min = ms.front();
  s.max = ms.back();
  return s;
}

void FillUniform(float* d, int64_t n, uint64_t seed, float scale, cudaStream_t stream) {
  if (n <= 0) return;
  FillKernel<<<Grid(n), 256, 0, stream>>>(d, n, seed, scale);
  BENCH_CUDA(cudaGetLastError());
}

void FillUniformBf16(void* d, int64_t n, uint64_t seed, float scale, cudaStream_t stream) {
  if (n <= 0) return;
  FillBf16Kernel<<<Grid(n), 256, 0, stream>>>(static_cast<__nv_bfloat16*>(d), n, seed, scale);
  BENCH_CUDA(cudaGetLastError());
}

std::vector<int64_t> GroupOffsets(int64_t S, int E, bool skewed, uint64_t seed) {
  std::vector<double> w(E, 1.0);
  if (skewed && E > 1) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<double> z(0.0, 0.6);
    for (double& x : w) x = std::exp(z(rng));
    // Expert 0 takes 2.6x the mean; the others share the rest in their drawn proportions.
    double rest = 0;
    for (int e = 1; e < E; ++e) rest += w[e];
    const double share0 = std::min(2.6 / E, 0.9);
    for (int e = 1; e < E; ++e) w[e] = w[e] / rest * (1.0 - share0);
    w[0] = share0;
  }
  double total = 0;
  for (double x : w) total += x;
  std::vector<int64_t> offsets(E + 1, 0);
  for (int e = 0; e < E; ++e) {
    const int64_t rows =
        e + 1 == E ? S - offsets[e]
                   : std::min<int64_t>(S - offsets[e], static_cast<int64_t>(S * w[e] / total));
    offsets[e + 1] = offsets[e] + rows;
  }
  return offsets;
}

double Imbalance(const std::vector<int64_t>& offsets) {
  const int E = static_cast<int>(offsets.size()) - 1;
  int64_t mx = 0;
  for (int e = 0; e < E; ++e) mx = std::max(mx, offsets[e + 1] - offsets[e]);
  return E > 0 && offsets.back() > 0 ? static_cast<double>(mx) * E / offsets.back() : 0.0;
}

std::string DeviceLine() {
  cudaDeviceProp p{};
  BENCH_CUDA(cudaGetDeviceProperties(&p, 0));
  int clock_khz = 0, mem_clock_khz = 0;
  cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0);
  cudaDeviceGetAttribute(&mem_clock_khz, cudaDevAttrMemoryClockRate, 0);
  // The runtime linked in (statically) and the most the driver supports: a driver older than the
  // runtime is the first thing to rule out when a first run fails.
  int runtime = 0, driver = 0;
  cudaRuntimeGetVersion(&runtime);
  cudaDriverGetVersion(&driver);
  char buf[320];
  std::snprintf(buf, sizeof(buf),
                "%s, %d SMs, %.0f MHz, %.1f GiB, memory %.0f MHz x %d bit; CUDA runtime %d.%d, "
                "driver supports %d.%d",
                p.name, p.multiProcessorCount, clock_khz / 1e3, p.totalGlobalMem / 1073741824.0,
                mem_clock_khz / 1e3, p.memoryBusWidth, runtime / 1000, (runtime % 1000) / 10,
                driver / 1000, (driver % 1000) / 10);
  return buf;
}

}  // namespace furnace::bench::gpu
