// furnace_bench_controlplane_service: the controller's own service time per call at N workers,
// in-process (a Controller on a temporary state dir, no gRPC, no TLS, one thread): what each of
// its hot paths costs apart from the transport and from waiting for a core. Registers N workers,
// places a train job over all of them, reports every rank started, beats every worker once,
// pushes one step's telemetry (one record per rank), ticks, lists the workers and cancels.
// Prints one JSON object of microseconds per call (or milliseconds for the one-off operations).
//   furnace_bench_controlplane_service [--workers N] [--repeat R]
// Times are reported, never judged.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <iostream>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "bench/common/stats.h"
#include "bench/controlplane/latency_book.h"
#include "controller/service/controller.h"
#include "nlohmann/json.hpp"
#include "spdlog/spdlog.h"

namespace {

namespace v1 = furnace::v1;
using furnace::bench::Now;

std::string WorkerId(uint32_t i) { return absl::StrCat("w-", i / 8, "/", i % 8); }

}  // namespace

int main(int argc, char** argv) {
  uint32_t n = 12288;
  int repeat = 3;
  CLI::App app{"furnace_bench_controlplane_service: the controller's service time per call"};
  app.add_option("--workers", n, "simulated workers")->capture_default_str();
  app.add_option("--repeat", repeat, "runs (the median of each time is printed)")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  spdlog::set_level(spdlog::level::warn);

  std::map<std::string, std::vector<float>> times;  // name -> one value per repeat
  for (int rep = 0; rep < repeat; ++rep) {
    const std::filesystem::path dir =
        std::filesystem::temp_directory_path() / absl::StrCat("furnace-service-bench-", ::getpid());
    std::filesystem::remove_all(dir);
    furnace::controller::ControllerOptions o;
    o.state_dir = dir.string();
    o.advertise_address = "127.0.0.1:1";
    auto created = furnace::controller::Controller::Create(o);
    if (!created.ok()) {
      std::cerr << created.status() << "\n";
      return 1;
    }
    furnace::controller::Controller& c = **created;
    std::vector<std::string> sessions(n);
    double t = Now();
    for (uint32_t i = 0; i < n; ++i) {
      v1::RegisterRequest r;
      r.set_worker_id(WorkerId(i));
      r.set_host("h");
      r.set_slot(i % 8);
      r.set_device_kind("cpu");
      r.set_pid(static_cast<int>(i));
      r.set_instance_id("x");
      sessions[i] = c.Register(r)->session_id();
    }
    times["register_us"].push_back(static_cast<float>((Now() - t) / n * 1e6));
    c.Tick();
    const std::string yaml = absl::StrCat(
        "name: t\nkind: train\n"
        "model: {vocab: 64, seq_len: 64, d_model: 64, heads: 4, layers: 2, expert_ffn: 128}\n"
        "moe: {experts: 8, top_k: 2}\nparallel: {dp: ",
        n,
        ", micro_batch: 1, micro_batches: 1}\ntrain: {steps: 1000000}\ndata: {source: markov}\n"
        "recovery: {max_restarts: 0}\n");
    t = Now();
    auto job = c.Submit(yaml, "t.yaml");
    times["submit_and_place_ms"].push_back(static_cast<float>((Now() - t) * 1e3));
    if (!job.ok()) {
      std::cerr << job.status() << "\n";
      return 1;
    }
    std::vector<std::pair<uint32_t, uint32_t>> ranks;  // (worker index, rank)
    for (uint32_t i = 0; i < n; ++i) {
      auto cmds = c.NextCommands(WorkerId(i), sessions[i], 0);
      if (cmds.ok() && !cmds->empty()) ranks.emplace_back(i, (*cmds)[0].start().rank());
    }
    t = Now();
    for (const auto& [i, rank] : ranks) {
      v1::RankReport rep;
      rep.set_worker_id(WorkerId(i));
      rep.set_job_id(*job);
      rep.set_attempt(1);
      rep.set_rank(rank);
      rep.set_event(v1::RANK_STARTED);
      (void)c.ReportRank(rep);
    }
    times["report_started_us"].push_back(static_cast<float>((Now() - t) / ranks.size() * 1e6));
    t = Now();
    for (uint32_t i = 0; i < n; ++i) {
      v1::HeartbeatRequest h;
      h.set_worker_id(WorkerId(i));
      h.set_session_id(sessions[i]);
      (void)c.TryHeartbeat(h);
    }
    times["heartbeat_us"].push_back(static_cast<float>((Now() - t) / n * 1e6));
    std::atomic<size_t> taken{0};
    t = Now();
    for (const auto& [i, rank] : ranks) {
      v1::TelemetryBatch b;
      b.set_worker_id(WorkerId(i));
      v1::TelemetryRecord* rec = b.add_records();
      rec->set_job_id(*job);
      rec->set_attempt(1);
      rec->set_rank(rank);
      rec->set_step(1);
      rec->set_phase("running");
      v1::StepTelemetry* st = rec->mutable_train();
      st->set_loss(1);
      st->set_tokens(10);
      for (int k = 0; k < 2; ++k) {
        v1::CommTelemetry* cm = st->add_comm();
        cm->set_op(k == 0 ? v1::COLLECTIVE_OP_ALL_TO_ALL : v1::COLLECTIVE_OP_ALL_REDUCE);
        cm->set_bytes(1000);
        cm->set_calls(8);
      }
      c.PushTelemetry(b, [&taken](absl::Status) { ++taken; });
    }
    times["telemetry_record_us"].push_back(static_cast<float>((Now() - t) / ranks.size() * 1e6));
    t = Now();
    for (int k = 0; k < 10; ++k) c.Tick();
    times["tick_ms"].push_back(static_cast<float>((Now() - t) / 10 * 1e3));
    t = Now();
    (void)c.ListWorkers();
    times["list_workers_ms"].push_back(static_cast<float>((Now() - t) * 1e3));
    t = Now();
    (void)c.Cancel(*job);
    times["cancel_ms"].push_back(static_cast<float>((Now() - t) * 1e3));
    created->reset();
    std::filesystem::remove_all(dir);
  }
  nlohmann::json out;
  out["workers"] = n;
  out["repeat"] = repeat;
  for (auto& [name, v] : times) {
    out[name] = furnace::bench::Quantile(v, 0.5);
    out[name + "_min_max"] = {*std::min_element(v.begin(), v.end()),
                              *std::max_element(v.begin(), v.end())};
  }
  std::cout << out.dump(2) << std::endl;
  return 0;
}
