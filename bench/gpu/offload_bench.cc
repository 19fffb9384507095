// Pinned offload bandwidth and how much of it hides behind compute, the way the memory planner's
// copy engine moves stashes (runtime/memory/copy_engine.h: a copy stream per direction, pinned
// host memory from Device::AllocateHost, cudaMemcpyAsync through Device::Copy):
//   D2H alone, H2D alone          1 GiB on one copy stream; GB/s
//   both at once                  D2H and H2D on two copy streams together; GB/s of the two summed
//   compute alone                 bf16 GEMMs (8192 x 2048 @ 2048 x 5632, the expert GEMM 1 of
//                                 gemm_bench) through CudaBf16Backend on a compute stream, as many
//                                 as take about as long as the two copies
//   compute + both copies         the three streams started together
//   hidden                        (t_compute + t_copies - t_together) / t_copies: 1 = the copies
//                                 cost the compute nothing, 0 = they serialise with it
//   compute slowdown              t_together / t_compute
// Medians of 7 event-timed runs after 2 warm-ups (spread printed). Without a GPU: prints the
// header, says so, exits 0.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
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

constexpr size_t kBytes = size_t{1} << 30;
constexpr int kWarmup = 2, kReps = 7;
constexpr int kN = 8192, kC = 2048, kOC = 5632;

cudaStream_t Native(fd::Stream& s) { return static_cast<cudaStream_t>(s.native()); }

// Runs `enqueue` (work on any of `streams`, all made to start after one event on streams[0]) and
// returns the milliseconds from that start to the last stream's end, median of kReps.
fg::Spread TimeTogether(const std::vector<cudaStream_t>& streams,
                        const std::function<void(int rep)>& enqueue) {
  cudaEvent_t start, fork, stop;
  std::vector<cudaEvent_t> done(streams.size());
  BENCH_CUDA(cudaEventCreate(&start));
  BENCH_CUDA(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
  BENCH_CUDA(cudaEventCreate(&stop));
  for (cudaEvent_t& e : done) BENCH_CUDA(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  std::vector<double> ms;
  for (int r = 0; r < kWarmup + kReps; ++r) {
    BENCH_CUDA(cudaEventRecord(start, streams[0]));
    BENCH_CUDA(cudaEventRecord(fork, streams[0]));
    for (size_t i = 1; i < streams.size(); ++i) {
      BENCH_CUDA(cudaStreamWaitEvent(streams[i], fork, 0));
    }
    enqueue(r);
    for (size_t i = 1; i < streams.size(); ++i) {
      BENCH_CUDA(cudaEventRecord(done[i], streams[i]));
      BENCH_CUDA(cudaStreamWaitEvent(streams[0], done[i], 0));
    }
    BENCH_CUDA(cudaEventRecord(stop, streams[0]));
    BENCH_CUDA(cudaEventSynchronize(stop));
    float t = 0;
    BENCH_CUDA(cudaEventElapsedTime(&t, start, stop));
    if (r >= kWarmup) ms.push_back(t);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(fork);
  cudaEventDestroy(stop);
  for (cudaEvent_t e : done) cudaEventDestroy(e);
  return fg::SpreadOf(ms);
}

double GBps(double bytes, double ms) { return ms > 0 ? bytes / (ms * 1e-3) / 1e9 : 0; }

void* MustAllocate(absl::StatusOr<void*> p, const char* what) {
  if (!p.ok()) {
    std::fprintf(stderr, "%s: %s\n", what, std::string(p.status().message()).c_str());
    std::exit(1);
  }
  return *p;
}

void Header() {
  std::printf("%-34s %10s %12s %s\n", "measurement", "ms", "GB/s", "spread ms / note");
}

}  // namespace

int main() {
  std::printf("pinned offload bandwidth (1 GiB each way) and overlap with bf16 GEMMs\n");
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
  auto compute = dev->CreateStream();
  auto d2h = dev->CreateStream();
  auto h2d = dev->CreateStream();
  if (!compute.ok() || !d2h.ok() || !h2d.ok()) return 1;
  void* host_out = MustAllocate(dev->AllocateHost(kBytes), "pinned (D2H destination)");
  void* host_in = MustAllocate(dev->AllocateHost(kBytes), "pinned (H2D source)");
  void* dev_src = MustAllocate(dev->Allocate(kBytes), "device (D2H source)");
  void* dev_dst = MustAllocate(dev->Allocate(kBytes), "device (H2D destination)");
  std::memset(host_in, 0x5a, kBytes);  // touched, so the pages exist (pinned memory is resident)
  fg::FillUniform(static_cast<float*>(dev_src), kBytes / 4, 1, 1.0f, Native(**compute));

  // GEMM operands on the compute stream.
  float* x = static_cast<float*>(MustAllocate(dev->Allocate(4ull * kN * kC), "x"));
  float* w = static_cast<float*>(MustAllocate(dev->Allocate(4ull * kC * kOC), "w"));
  float* y = static_cast<float*>(MustAllocate(dev->Allocate(4ull * kN * kOC), "y"));
  fg::FillUniform(x, int64_t{kN} * kC, 2, 1.0f, Native(**compute));
  fg::FillUniform(w, int64_t{kC} * kOC, 3, 0.02f, Native(**compute));
  BENCH_CUDA(cudaStreamSynchronize(Native(**compute)));
  const fd::Backend& table = fd::CudaBf16Backend();

  auto copy_d2h = [&] {
    if (!dev->Copy(host_out, dev_src, kBytes, fd::CopyKind::kDeviceToHost, **d2h).ok())
      std::exit(1);
  };
  auto copy_h2d = [&] {
    if (!dev->Copy(dev_dst, host_in, kBytes, fd::CopyKind::kHostToDevice, **h2d).ok()) std::exit(1);
  };
  const fg::Spread d2h_alone = TimeTogether({Native(**d2h)}, [&](int) { copy_d2h(); });
  const fg::Spread h2d_alone = TimeTogether({Native(**h2d)}, [&](int) { copy_h2d(); });
  const fg::Spread both = TimeTogether({Native(**d2h), Native(**h2d)}, [&](int) {
    copy_d2h();
    copy_h2d();
  });
  const fg::Spread one_gemm = TimeTogether({Native(**compute)}, [&](int) {
    fd::StreamScope scope(**compute);
    table.matmul_forward(y, x, w, nullptr, kN, kC, kOC);
  });
  const int gemms = std::max(1, static_cast<int>(std::ceil(both.median / one_gemm.median)));
  auto run_compute = [&] {
    fd::StreamScope scope(**compute);
    for (int i = 0; i < gemms; ++i) table.matmul_forward(y, x, w, nullptr, kN, kC, kOC);
  };
  const fg::Spread compute_alone = TimeTogether({Native(**compute)}, [&](int) { run_compute(); });
  const fg::Spread together =
      TimeTogether({Native(**compute), Native(**d2h), Native(**h2d)}, [&](int) {
        run_compute();
        copy_d2h();
        copy_h2d();
      });
  absl::Status sticky = dev->SynchronizeStream(**compute);
  if (!sticky.ok()) {
    std::fprintf(stderr, "device error: %s\n", std::string(sticky.message()).c_str());
    return 1;
  }
  // The copies landed: the H2D destination holds the host pattern.
  uint8_t probe[16];
  BENCH_CUDA(
      cudaMemcpy(probe, static_cast<char*>(dev_dst) + kBytes - 16, 16, cudaMemcpyDeviceToHost));
  const bool landed = std::all_of(probe, probe + 16, [](uint8_t b) { return b == 0x5a; });

  Header();
  const double gemm_flops = 2.0 * kN * kC * kOC;
  std::printf("%-34s %10.3f %12.1f %.3f-%.3f\n", "D2H alone", d2h_alone.median,
              GBps(kBytes, d2h_alone.median), d2h_alone.min, d2h_alone.max);
  std::printf("%-34s %10.3f %12.1f %.3f-%.3f\n", "H2D alone", h2d_alone.median,
              GBps(kBytes, h2d_alone.median), h2d_alone.min, h2d_alone.max);
  std::printf("%-34s %10.3f %12.1f %.3f-%.3f (sum of both directions)\n", "D2H + H2D at once",
              both.median, GBps(2.0 * kBytes, both.median), both.min, both.max);
  std::printf("%-34s %10.3f %12s %.3f-%.3f (%.1f TFLOPS per GEMM)\n",
              "one bf16 GEMM 8192x2048x5632", one_gemm.median, "", one_gemm.min, one_gemm.max,
              gemm_flops / (one_gemm.median * 1e-3) / 1e12);
  std::printf("%-34s %10.3f %12s %.3f-%.3f (%d GEMMs)\n", "compute alone", compute_alone.median, "",
              compute_alone.min, compute_alone.max, gemms);
  std::printf("%-34s %10.3f %12s %.3f-%.3f\n", "compute + D2H + H2D together", together.median, "",
              together.min, together.max);
  const double hidden = (compute_alone.median + both.median - together.median) / both.median;
  std::printf("%-34s %10.2f %12s (1 = copies fully hidden behind compute)\n", "hidden", hidden, "");
  std::printf("%-34s %10.2f %12s (t_together / t_compute)\n", "compute slowdown",
              together.median / compute_alone.median, "");
  std::printf("%-34s %10s %12s %s\n", "check", landed ? "ok" : "FAILED", "",
              "the H2D destination holds the host bytes");
  // The line tests/gpu/run.sh collects into the report's goals (measured; no target).
  std::printf(
      "GOAL pinned offload: D2H %.1f GB/s, H2D %.1f GB/s, both at once %.1f GB/s; copies %.0f%% "
      "hidden behind bf16 GEMMs, compute slowdown %.2f (check %s)\n",
      GBps(kBytes, d2h_alone.median), GBps(kBytes, h2d_alone.median),
      GBps(2.0 * kBytes, both.median), 100 * hidden, together.median / compute_alone.median,
      landed ? "ok" : "FAILED");
  dev->Free(x);
  dev->Free(w);
  dev->Free(y);
  dev->Free(dev_src);
  dev->Free(dev_dst);
  BENCH_CUDA(cudaDeviceSynchronize());
  dev->FreeHost(host_out);
  dev->FreeHost(host_in);
  return landed ? 0 : 1;
}
