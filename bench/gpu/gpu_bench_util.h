// What the GPU benchmarks share (bench/gpu/REPORT.md): the no-GPU check that lets each one print
// its table header, say why nothing was measured and exit 0; timing with CUDA events on a stream
// (warm-up, then the median and the spread of repeated runs: the rules of
// /work/.library/device/METHOD.md); seeded random fills on the device (never zeros); and the
// check of every CUDA and cuBLAS status.
// Not thread-safe: one benchmark per process, one thread.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

namespace furnace::bench::gpu {

// "" when GPU 0 can be used, else why not.
std::string NoGpuReason();

// Exits the process with status 1 and the call's name when a CUDA or cuBLAS call failed.
void Check(cudaError_t err, const char* what);
void Check(cublasStatus_t status, const char* what);
#define BENCH_CUDA(call) ::furnace::bench::gpu::Check((call), #call)

// Times `run` (which enqueues work on `stream`) with timing events around each repetition:
// `warmup` untimed runs, then `reps` timed ones; milliseconds of each, in order.
std::vector<double> TimeMs(cudaStream_t stream, int warmup, int reps,
                           const std::function<void(int rep)>& run);

struct Spread {
  double median = 0, min = 0, max = 0;
};
Spread SpreadOf(std::vector<double> ms);

// `n` floats uniform in [-scale, scale] from `seed`, written on the device (a counter-based hash
// per element: fresh values per seed, no host round trip).
void FillUniform(float* d, int64_t n, uint64_t seed, float scale, cudaStream_t stream);
void FillUniformBf16(void* d, int64_t n, uint64_t seed, float scale, cudaStream_t stream);

// Expert group offsets (E + 1) for S rows: balanced (S / E each, the remainder on the last), or
// skewed as real routing is (seeded log-normal sizes, sigma 0.6, with the busiest expert at 2.6x
// the mean: the worst the BaGuaLu-2 traces report).
std::vector<int64_t> GroupOffsets(int64_t S, int E, bool skewed, uint64_t seed);
// max / mean of the group sizes.
double Imbalance(const std::vector<int64_t>& offsets);

// The device's name, SM count, clocks and memory, one line.
std::string DeviceLine();

}  // namespace furnace::bench::gpu
