// How much of a training step does its telemetry record cost the rank? Builds the per-step
// TelemetryRecord exactly as worker/train_rank.cc and worker/rank_progress.cc do (the step's
// numbers through worker/step_telemetry.h into a StepTelemetry, then the record), writes it
// through TelemetryWriter into a pipe, and has a second thread drain and decode the pipe as the
// agent's supervisor does. Times the rank's side only: build, and build + write. Repetitions
// alternate the two (A B A B) and report the median and the min-max spread; the overhead ratio is
// against --step-ms (the demo's ~40 ms step).
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "furnace/v1/telemetry.pb.h"
#include "runtime/train/trainer.h"
#include "worker/step_telemetry.h"
#include "worker/telemetry_pipe.h"

namespace {

constexpr int kLayers = 4;  // the demo: 4 layers, every one MoE
constexpr int kExperts = 8;

// The record of one train step, as train_rank.cc's on_step and Progress::Emit build it.
furnace::v1::TelemetryRecord BuildRecord(uint64_t step) {
  const double x = static_cast<double>(step);
  furnace::train::StepStats s;
  s.step = static_cast<int64_t>(step);
  s.loss = 2.5 - x * 1e-4;
  s.aux_loss = 0.01;
  s.tokens = 1024;
  s.tokens_per_second = 25600;
  s.step_seconds = 0.04;
  s.forward_backward_seconds = 0.035;
  s.optimizer_seconds = 0.004;
  s.mfu = 0.05;
  s.grad_norm = 1.2;
  s.lr = 3e-3;
  s.activation_peak_bytes = 14050918;
  s.model_flops = 1e9;
  for (int l = 0; l < kLayers; ++l) {
    s.imbalance.push_back(1.1 + 0.01 * l);
    std::vector<int64_t>& tokens = s.tokens_per_expert.emplace_back();
    for (int e = 0; e < kExperts; ++e) tokens.push_back(256 + 7 * e + l);
  }
  furnace::v1::TelemetryRecord record;
  record.set_job_id("j-0123456789ab");
  record.set_attempt(1);
  record.set_rank(0);
  record.set_step(step);
  record.set_total_steps(300);
  record.set_unix_time(1.7e9 + x * 0.04);
  record.set_phase("running");
  record.set_message("");
  *record.mutable_train() =
      furnace::worker::StepTelemetryOf(s, {.reporter = true, .entropy_floor = 2.08});
  return record;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

int main(int argc, char** argv) {
  int records = 20000, reps = 7;
  double step_ms = 40;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--records"))
      records = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--reps"))
      reps = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--step-ms"))
      step_ms = std::atof(argv[i + 1]);
  }
  int fds[2];
  if (pipe(fds) != 0) {
    std::perror("pipe");
    return 1;
  }
  std::atomic<uint64_t> decoded{0};
  std::thread drain([&] {
    furnace::worker::TelemetryDecoder decoder;
    furnace::v1::TelemetryRecord r;
    char buf[65536];
    for (;;) {
      const ssize_t n = read(fds[0], buf, sizeof(buf));
      if (n <= 0) break;
      decoder.Feed(std::string_view(buf, static_cast<size_t>(n)));
      while (true) {
        auto got = decoder.Next(&r);
        if (!got.ok() || !*got) break;
        decoded.fetch_add(1, std::memory_order_relaxed);
      }
    }
  });
  furnace::worker::TelemetryWriter writer(fds[1]);
  const size_t record_bytes = BuildRecord(1).ByteSizeLong();
  const size_t framed_bytes = furnace::worker::FrameRecord(BuildRecord(1)).size();

  std::vector<double> build_us, write_us;
  uint64_t step = 0, written = 0;
  size_t sink = 0;
  for (int rep = 0; rep < reps; ++rep) {
    // A: build only.
    double t0 = Now();
    for (int i = 0; i < records; ++i) sink += BuildRecord(++step).train().moe_layers_size();
    build_us.push_back((Now() - t0) / records * 1e6);
    // B: build + frame + write into the pipe.
    t0 = Now();
    for (int i = 0; i < records; ++i) {
      if (!writer.Write(BuildRecord(++step)).ok()) {
        std::fprintf(stderr, "write failed\n");
        return 1;
      }
    }
    written += static_cast<uint64_t>(records);
    write_us.push_back((Now() - t0) / records * 1e6);
  }
  close(fds[1]);
  drain.join();

  const auto [bmin, bmax] = std::minmax_element(build_us.begin(), build_us.end());
  const auto [wmin, wmax] = std::minmax_element(write_us.begin(), write_us.end());
  const double w = Median(write_us);
  std::printf("MoE layers per record    %zu (%d experts each)\n",
              sink / (static_cast<size_t>(reps) * records), kExperts);
  std::printf("serialized record        %zu bytes (%zu framed)\n", record_bytes, framed_bytes);
  std::printf("build only               median %.2f us  (min %.2f, max %.2f; %d reps x %d)\n",
              Median(build_us), *bmin, *bmax, reps, records);
  std::printf("build + write to pipe    median %.2f us  (min %.2f, max %.2f)\n", w, *wmin, *wmax);
  std::printf("overhead per step        %.5f%% of a %.0f ms step (ratio %.2e)\n",
              w / (step_ms * 1e3) * 100, step_ms, w / (step_ms * 1e3));
  std::printf("pipe bandwidth at 1/step %.1f KiB/s\n", framed_bytes / (step_ms / 1e3) / 1024);
  std::printf("decoded by the drain     %llu of %llu written\n",
              static_cast<unsigned long long>(decoded.load()),
              static_cast<unsigned long long>(written));
  return decoded.load() == written ? 0 : 1;
}
