// furnace_bench_controlplane: N simulated worker agents against a running furnace-controller
// (fleet.h), in phases: register every agent and open its command stream; submit a training job
// over all but --silent agents and wait for every rank's health-check rendezvous; run the steady
// state (heartbeats at 1 Hz, one telemetry record per rank per step) for --window-s and measure
// the controller's process (proc_sample.h: CPU, resident memory, writes) and the RPC latencies
// (latency_book.h); stop --silent idle agents dead and time until `furnace workers` shows them
// lost; cancel the job. Prints one JSON object; exit 0 when every correctness property held
// (every agent registered, no RPC failed, every rank started and arrived, steps aggregated,
// every silent agent and no other declared lost, every rank stopped on cancel), 1 otherwise with
// the reasons under "problems". Times and CPU are reported, never judged.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <map>
#include <thread>
#include <tuple>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "bench/common/stats.h"
#include "bench/controlplane/fleet.h"
#include "bench/controlplane/latency_book.h"
#include "bench/controlplane/proc_sample.h"
#include "transport/token_file.h"

namespace {

using furnace::bench::Now;
using nlohmann::json;

void Sleep(double s) { std::this_thread::sleep_for(std::chrono::duration<double>(s)); }

// Waits until pred() or `timeout_s`; whether pred() held.
template <typename Pred>
bool WaitFor(Pred pred, double timeout_s) {
  const double end = Now() + timeout_s;
  while (!pred()) {
    if (Now() > end) return false;
    Sleep(0.05);
  }
  return true;
}

std::string JobYaml(uint32_t world) {
  // The job's content only matters to the controller's checks: its ranks are simulated.
  return absl::StrCat(
      "name: loadtest\nkind: train\n"
      "model: {vocab: 64, seq_len: 64, d_model: 64, heads: 4, layers: 2, expert_ffn: 128}\n"
      "moe: {experts: 8, top_k: 2}\n"
      "parallel: {dp: ",
      world,
      ", micro_batch: 1, micro_batches: 1}\n"
      "train: {steps: 1000000}\n"
      "data: {source: markov}\n"
      "recovery: {max_restarts: 0}\n");
}

json Window(const furnace::bench::ProcSample& a, const furnace::bench::ProcSample& b) {
  const double dt = b.mono_s - a.mono_s;
  return {{"seconds", dt},
          {"cpu_cores", (b.cpu_s - a.cpu_s) / dt},
          {"rss_mib", b.rss_bytes / 1048576.0},
          {"rss_peak_mib", b.rss_peak_bytes / 1048576.0},
          {"threads", b.threads},
          {"write_calls_per_s", (b.syscw - a.syscw) / dt},
          {"written_kib_per_s", (b.wchar - a.wchar) / dt / 1024.0},
          {"disk_kib_per_s", (b.write_bytes - a.write_bytes) / dt / 1024.0}};
}

}  // namespace

int main(int argc, char** argv) {
  furnace::bench::FleetOptions fo;
  int pid = 0;
  uint32_t silent = 8;
  double window_s = 20, warmup_steps = 2, worker_timeout_s = 10, start_timeout_s = 300;
  CLI::App app{"furnace_bench_controlplane: simulated worker agents against a controller"};
  app.add_option("--controller", fo.address, "controller gRPC address")->required();
  app.add_option("--controller-pid", pid, "the controller's pid (its /proc is measured)")
      ->required();
  app.add_option("--agents", fo.agents, "simulated agents")->capture_default_str();
  app.add_option("--silent", silent, "idle agents stopped dead to time their loss")
      ->capture_default_str();
  app.add_option("--channels", fo.channels, "gRPC channels the agents share")
      ->capture_default_str();
  app.add_option("--queues", fo.queues, "completion queues (a thread each) the agents share")
      ->capture_default_str();
  app.add_option("--step-s", fo.step_s, "seconds per training step")->capture_default_str();
  app.add_option("--window-s", window_s, "steady-state measurement window")->capture_default_str();
  app.add_option("--warmup-steps", warmup_steps, "steps run before the window opens")
      ->capture_default_str();
  app.add_option("--worker-timeout", worker_timeout_s,
                 "the controller's --worker-timeout (the loss goal is this + 1 s)")
      ->capture_default_str();
  app.add_option("--start-timeout", start_timeout_s,
                 "seconds allowed for every rank to start and pass its rendezvous")
      ->capture_default_str();
  std::string join_token_file, token_file;
  app.add_option("--tls-ca", fo.tls.ca, "TLS: the CA that signed the controller's certificate");
  app.add_option("--tls-cert", fo.tls.cert, "the agents' client certificate (mutual TLS)");
  app.add_option("--tls-key", fo.tls.key, "its key");
  app.add_option("--join-token-file", join_token_file, "the join token the agents send");
  app.add_option("--token-file", token_file, "an admin token, for Submit and Cancel");
  std::string end = "cancel";
  app.add_option("--end", end,
                 "how the job ends: cancel (every rank told to stop, reports it) or finish "
                 "(every rank exits successfully at once, as at the end of a run)")
      ->check(CLI::IsMember({"cancel", "finish"}))
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  // Debian's Abseil checks every Mutex acquisition for lock-order cycles (gRPC's locks): ~6 % of
  // this generator's CPU at 4,096 agents (perf), turned off as the controller does.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  for (auto [file, flag, token] :
       {std::tuple{&join_token_file, "--join-token-file", &fo.join_token},
        std::tuple{&token_file, "--token-file", &fo.admin_token}}) {
    if (file->empty()) continue;
    auto read = furnace::transport::ReadClientToken(*file, flag);
    if (!read.ok()) {
      std::cerr << read.status().message() << "\n";
      return 2;
    }
    *token = *read;
  }
  if (silent >= fo.agents) {
    std::cerr << "--silent must be below --agents\n";
    return 2;
  }

  furnace::bench::LatencyBook book;
  auto created = furnace::bench::Fleet::Create(fo, book);
  if (!created.ok()) {
    std::cerr << created.status().message() << "\n";
    return 2;
  }
  furnace::bench::Fleet& fleet = **created;
  json out;
  std::vector<std::string> problems;
  // The controller's process, and this generator's own (it shares the machine's cores).
  auto sample_of = [](int p) {
    auto s = furnace::bench::SampleProcess(p);
    if (!s.ok()) {
      std::cerr << s.status().message() << "\n";
      std::exit(1);
    }
    return *s;
  };
  auto sample = [&] { return sample_of(pid); };
  const int self = static_cast<int>(::getpid());
  const auto g0 = sample_of(self);
  out["agents"] = fo.agents;
  out["channels"] = fo.channels;
  out["step_s"] = fo.step_s;
  out["tls"] = fo.tls.enabled();
  out["tokens"] = !fo.join_token.empty();

  // 1. Registration and command streams.
  const auto s0 = sample();
  const uint32_t registered = fleet.RegisterAll();
  out["registered"] = registered;
  out["register_seconds"] = Now() - s0.mono_s;
  if (registered != fo.agents) problems.push_back(absl::StrCat(registered, " agents registered"));
  fleet.OpenStreams();
  fleet.Start();

  // 2. A job over all but the silent agents; every rank's health-check rendezvous.
  const uint32_t world = fo.agents - silent;
  const double submit_at = Now();
  auto job = fleet.Submit(JobYaml(world));
  if (!job.ok()) {
    std::cerr << "submit: " << job.status().message() << "\n";
    return 1;
  }
  out["job_id"] = *job;
  out["world"] = world;
  if (!WaitFor([&] { return fleet.ranks_arrived() >= world; }, start_timeout_s)) {
    problems.push_back(absl::StrCat(fleet.ranks_started(), " ranks started, ",
                                    fleet.ranks_arrived(), " through the rendezvous of ", world));
  }
  const auto s1 = sample();
  out["job_start"] = Window(s0, s1);
  out["job_start"]["seconds_submit_to_all_arrived"] = fleet.all_arrived_at() - submit_at;
  out["job_start"]["rpcs"] = book.Summary();
  out["ranks_started"] = fleet.ranks_started();

  // 3. Steady state.
  out["telemetry_flush_s"] = fleet.flush_s();
  Sleep(warmup_steps * fo.step_s + fleet.flush_s());
  book.Reset();
  const auto s2 = sample();
  const auto g2 = sample_of(self);
  const uint64_t records0 = fleet.telemetry_records();
  const uint64_t views0 = fleet.heartbeats_with_view();
  Sleep(window_s);
  const auto s3 = sample();
  const auto g3 = sample_of(self);
  out["steady"] = Window(s2, s3);
  out["steady"]["generator_cpu_cores"] = (g3.cpu_s - g2.cpu_s) / (g3.mono_s - g2.mono_s);
  out["steady"]["rpcs"] = book.Summary();
  out["steady"]["telemetry_records_per_s"] =
      (fleet.telemetry_records() - records0) / (s3.mono_s - s2.mono_s);
  out["steady"]["heartbeats_per_s"] =
      out["steady"]["rpcs"].value("/Heartbeat/calls"_json_pointer, 0) / (s3.mono_s - s2.mono_s);
  if (const double beats = out["steady"]["rpcs"].value("/Heartbeat/calls"_json_pointer, 0.0);
      beats > 0) {
    out["steady"]["heartbeats_with_view_fraction"] =
        (fleet.heartbeats_with_view() - views0) / beats;
  }
  auto step = fleet.JobStep(*job);
  out["steps_sent"] = fleet.last_step();
  out["steps_aggregated"] = step.ok() ? *step : 0;
  if (!step.ok() || *step == 0) problems.push_back("no training step aggregated by the controller");

  // 4. Loss of silent agents.
  book.Reset();
  std::vector<furnace::bench::SimAgent*> gone = fleet.Silence(silent);
  std::map<std::string, double> last_beat, seen_lost;
  for (auto* a : gone) {
    std::lock_guard<std::mutex> lock(a->mu);
    last_beat[a->worker_id] = a->last_heartbeat_sent;
  }
  uint32_t wrongly_lost = 0;
  const double give_up = Now() + worker_timeout_s + 30;
  while (seen_lost.size() < gone.size() && Now() < give_up) {
    auto workers = fleet.ListWorkers();
    const double t = Now();
    if (workers.ok()) {
      wrongly_lost = 0;
      for (const auto& w : *workers) {
        if (w.state() != furnace::v1::WORKER_STATE_LOST) continue;
        if (last_beat.count(w.worker_id())) {
          seen_lost.emplace(w.worker_id(), t);
        } else {
          ++wrongly_lost;
        }
      }
    }
    Sleep(0.1);
  }
  std::vector<float> detect;
  for (const auto& [id, t] : seen_lost) detect.push_back(static_cast<float>(t - last_beat[id]));
  std::vector<std::string> gone_ids;
  for (const auto& [id, t] : last_beat) gone_ids.push_back(id);
  out["loss"] = {{"silent", gone.size()},
                 {"workers", gone_ids},
                 {"declared_lost", seen_lost.size()},
                 {"others_declared_lost", wrongly_lost},
                 {"worker_timeout_s", worker_timeout_s},
                 {"seconds_from_last_heartbeat_p50", furnace::bench::Quantile(detect, 0.5)},
                 {"seconds_from_last_heartbeat_max", furnace::bench::Quantile(detect, 1.0)},
                 {"rpcs", book.Summary()}};
  if (gone.size() != silent) problems.push_back(absl::StrCat(gone.size(), " idle agents to stop"));
  if (seen_lost.size() != gone.size()) {
    problems.push_back(absl::StrCat(seen_lost.size(), " of ", gone.size(), " silent agents lost"));
  }
  if (wrongly_lost > 0) problems.push_back(absl::StrCat(wrongly_lost, " live agents lost"));

  // 5. The end (--end): a cancel (every rank is told to stop and reports it), or every rank
  // exiting successfully at once (every report answered once its exit is written).
  book.Reset();
  const auto s4 = sample();
  const double end_start = Now();
  if (end == "cancel") {
    if (auto s = fleet.Cancel(*job); !s.ok())
      problems.push_back(absl::StrCat("cancel: ", s.message()));
  } else {
    fleet.Finish();
  }
  if (!WaitFor([&] { return fleet.ranks_stopped() >= world; }, start_timeout_s)) {
    problems.push_back(absl::StrCat(fleet.ranks_stopped(), " of ", world, " ranks stopped"));
  }
  out[end] = Window(s4, sample());
  out[end]["seconds_until_every_exit_answered"] = Now() - end_start;
  out[end]["rpcs"] = book.Summary();
  if (end == "finish") {
    auto state = fleet.JobState(*job);
    out[end]["job_state"] =
        state.ok() ? furnace::v1::JobState_Name(*state) : std::string(state.status().message());
    if (!state.ok() || *state != furnace::v1::JOB_SUCCEEDED) {
      problems.push_back(
          absl::StrCat("finish: the job is ", out[end]["job_state"].get<std::string>()));
    }
  }
  fleet.Stop();
  out["ranks_stopped"] = fleet.ranks_stopped();
  out["reregister_asks"] = fleet.reregister_asks();
  out["end"] = Window(s0, sample());
  out["generator"] = Window(g0, sample_of(self));

  auto count_failures = [&](const json& rpcs, const std::string& phase) {
    for (const auto& [kind, r] : rpcs.items()) {
      if (r.value("failures", 0) > 0) {
        problems.push_back(absl::StrCat(phase, " ", kind, ": ", r.value("failures", 0), " failed (",
                                        r.value("first_error", ""), ")"));
      }
    }
  };
  count_failures(out["job_start"]["rpcs"], "start");
  count_failures(out["steady"]["rpcs"], "steady");
  count_failures(out["loss"]["rpcs"], "loss");
  count_failures(out[end]["rpcs"], end);
  out["problems"] = problems;
  std::cout << out.dump(2) << std::endl;
  return problems.empty() ? 0 : 1;
}
