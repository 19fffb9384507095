// furnace_bench_controlplane_service: the controller's own service time per call at N workers,
// in-process (a Controller on a temporary state dir, no gRPC, no TLS, one thread): what each of
// its hot paths costs apart from the transport and from waiting for a core. Registers N workers,
// places a train job over all of them, reports every rank started, beats every worker once,
// pushes one step's telemetry (one record per rank), ticks, lists the workers and cancels.
// With --pending P the train job leaves kFree workers free, and P more jobs wait behind it: the
// first needs kFree + 1 workers and holds a reservation (--reserve-after passed), the others need
// 2 each, fit the free workers and are held back by it (each tick weighs them for a backfill,
// which the train job, with no time limit, never allows);
// the ticks are then timed again (tick_pending_ms).
// Prints one JSON object of microseconds per call (or milliseconds for the one-off operations).
//   furnace_bench_controlplane_service [--workers N] [--repeat R] [--pending P]
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

constexpr uint32_t kFree = 8;  // --pending: workers the train job leaves free

std::string TrainYaml(const std::string& name, uint32_t dp) {
  return absl::StrCat(
      "name: ", name,
      "\nkind: train\n"
      "model: {vocab: 64, seq_len: 64, d_model: 64, heads: 4, layers: 2, expert_ffn: 128}\n"
      "moe: {experts: 8, top_k: 2}\nparallel: {dp: ",
      dp,
      ", micro_batch: 1, micro_batches: 1}\ntrain: {steps: 1000000}\ndata: {source: markov}\n"
      "recovery: {max_restarts: 0}\n");
}

}  // namespace

int main(int argc, char** argv) {
  uint32_t n = 12288;
  int repeat = 3;
  uint32_t pending = 0;
  CLI::App app{"furnace_bench_controlplane_service: the controller's service time per call"};
  app.add_option("--workers", n, "simulated workers")->capture_default_str();
  app.add_option("--repeat", repeat, "runs (the median of each time is printed)")
      ->capture_default_str();
  app.add_option("--pending", pending, "jobs waiting behind the train job (0: none)")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  if (pending > 0 && n <= kFree) {
    std::cerr << "--pending needs more than " << kFree << " --workers\n";
    return 2;
  }
  spdlog::set_level(spdlog::level::warn);

  std::map<std::string, std::vector<float>> times;  // name -> one value per repeat
  for (int rep = 0; rep < repeat; ++rep) {
    const std::filesystem::path dir =
        std::filesystem::temp_directory_path() / absl::StrCat("furnace-service-bench-", ::getpid());
    std::filesystem::remove_all(dir);
    furnace::controller::ControllerOptions o;
    o.state_dir = dir.string();
    o.advertise_address = "127.0.0.1:1";
    o.reserve_after_s = 0.001;  // --pending: the first waiting job holds its reservation at once
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
    const std::string yaml = TrainYaml("t", pending > 0 ? n - kFree : n);
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
    if (pending > 0) {
      t = Now();
      for (uint32_t k = 0; k < pending; ++k) {
        const uint32_t dp = k == 0 ? kFree + 1 : 2;
        if (auto id = c.Submit(TrainYaml(absl::StrCat("p", k), dp), "p.yaml"); !id.ok()) {
          std::cerr << id.status() << "\n";
          return 1;
        }
        // The first one's reservation begins once --reserve-after has passed since its submit.
        if (k == 0) std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
      times["submit_pending_us"].push_back(static_cast<float>((Now() - t) / pending * 1e6));
      t = Now();
      for (int k = 0; k < 10; ++k) c.Tick();
      times["tick_pending_ms"].push_back(static_cast<float>((Now() - t) / 10 * 1e3));
      const auto listed = c.ListJobs();
      uint32_t waiting = 0;
      for (const auto& j : listed) waiting += j.state() == v1::JOB_PENDING;
      if (waiting != pending) {
        std::cerr << waiting << " of the " << pending << " jobs submitted wait, not all\n";
        return 1;
      }
    }
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
  out["pending"] = pending;
  for (auto& [name, v] : times) {
    out[name] = furnace::bench::Quantile(v, 0.5);
    out[name + "_min_max"] = {*std::min_element(v.begin(), v.end()),
                              *std::max_element(v.begin(), v.end())};
  }
  std::cout << out.dump(2) << std::endl;
  return 0;
}
