// furnace-controller: the job-level coordinator daemon. See controller.h for what it does and
// README.md for how to run it.
#include <grpcpp/grpcpp.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <iostream>
#include <optional>
#include <thread>
#include <tuple>

#include "CLI/CLI.hpp"
#include "absl/synchronization/mutex.h"
#include "controller/http/monitoring_server.h"
#include "controller/http/proto_json.h"
#include "controller/http/static_files.h"
#include "controller/metrics/render_metrics.h"
#include "controller/service/agent_server.h"
#include "controller/service/controller.h"
#include "controller/service/grpc_services.h"
#include "controller/service/local_launcher.h"
#include "controller/service/options.h"
#include "controller/service/server_security.h"
#include "runtime/base/clock.h"
#include "runtime/base/daemon_flags.h"
#include "runtime/base/open_files.h"
#include "runtime/base/path_root.h"
#include "spdlog/spdlog.h"

namespace {

// SIGINT or SIGTERM stops the controller; a second SIGINT (Ctrl-C pressed again) while its local
// workers stop kills them at once. Only SIGINT hurries: a script that sends SIGTERM after the
// terminal's Ctrl-C reached both (scripts/demo.sh's cleanup) must not cut the ranks' checkpoint.
std::atomic<bool> g_stop{false};
std::atomic<int> g_interrupts{0};
// Below this many open files the controller says so at start (a fleet of a few thousand agents,
// their rank logs and the store's files need more).
constexpr uint64_t kFewOpenFiles = 65536;
void OnSignal(int signo) {
  if (signo == SIGINT) g_interrupts.fetch_add(1);
  g_stop = true;
}

}  // namespace

int main(int argc, char** argv) {
  furnace::controller::ControllerFlags f;
  CLI::App app{"furnace-controller: places, watches and restarts Furnace jobs"};
  furnace::controller::AddControllerOptions(app, f);
  if (std::optional<int> exit = furnace::ParseDaemonFlags(app, "furnace-controller", argc, argv)) {
    return *exit;
  }
  // Debian's Abseil checks every Mutex acquisition for lock-order cycles (gRPC's locks): a
  // debugging aid that cost a few percent of the controller's CPU under load.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);

  spdlog::set_level(spdlog::level::from_str(f.log_level));
  spdlog::set_pattern("%Y-%m-%d %H:%M:%S.%e [controller] %^%l%$ %v");
  // A socket per agent connection, beside the store's files and the rank logs: the soft limit of
  // 1024 that systemd and shells give ran out at about a thousand agents (accept: EMFILE).
  if (absl::StatusOr<furnace::OpenFileLimit> files = furnace::RaiseOpenFileLimit(); files.ok()) {
    spdlog::info("{}", furnace::DescribeOpenFileLimit(*files));
    if (files->soft < kFewOpenFiles) {
      spdlog::warn(
          "only {} open files: the controller holds one per agent connection, beside its store "
          "and rank logs; for a large fleet raise the hard limit (LimitNOFILE= of the systemd "
          "unit, `ulimit -Hn`)",
          files->soft);
    }
  } else {
    spdlog::warn("open files: {}", std::string(files.status().message()));
  }

  furnace::controller::ControllerOptions options;
  options.state_dir = std::filesystem::absolute(f.state_dir).string();
  // An agent is lost after --worker-timeout of silence: shorter than two heartbeats, healthy
  // agents would be lost between two of theirs.
  if (f.worker_timeout_s < 2 * f.heartbeat_interval_s) {
    std::cerr << "furnace-controller: --worker-timeout " << f.worker_timeout_s
              << " s is shorter than two heartbeats (--heartbeat-interval "
              << f.heartbeat_interval_s << " s); allowed: at least " << 2 * f.heartbeat_interval_s
              << "\n";
    return 2;
  }
  options.heartbeat_interval_s = f.heartbeat_interval_s;
  options.telemetry_flush_s = f.telemetry_flush_s;
  options.worker_timeout_s = f.worker_timeout_s;
  options.reattach_grace_s = f.reattach_grace_s;
  options.forget_lost_s = f.forget_lost_s;
  options.forget_ended_s = f.forget_ended_s;
  options.reserve_after_s = f.reserve_after_s;
  options.default_time_limit_s = f.default_time_limit_s;
  options.max_time_limit_s = f.max_time_limit_s;
  options.local_workers = f.local_workers;
  options.submit_rate = f.submit_rate;
  options.submit_burst = f.submit_burst;
  options.audit_keep = f.audit_keep;
  for (auto [flag, given, resolved] :
       {std::tuple{"--data-root", &f.data_root, &options.data_root},
        std::tuple{"--checkpoint-root", &f.checkpoint_root, &options.checkpoint_root}}) {
    if (given->empty()) continue;
    absl::StatusOr<std::string> root = furnace::ResolveDaemonRoot(*given, flag);
    if (!root.ok()) {
      std::cerr << "furnace-controller: " << root.status().message() << "\n";
      return 2;
    }
    *resolved = *root;
    spdlog::info("{} {}: job paths are confined to it", flag, *resolved);
  }

  // Before anything listens (and before the security checks read it as an address).
  if (!f.metrics_listen.empty()) {
    if (absl::Status s = furnace::controller::http::MonitoringServer::CheckListen(f.metrics_listen);
        !s.ok()) {
      std::cerr << "furnace-controller: --metrics-listen: " << s.message() << "\n";
      return 2;
    }
  }
  // Ranks dial the advertised address for rendezvous, so it must be a real one.
  absl::StatusOr<std::string> advertise = furnace::controller::AdvertiseAddress(f);
  if (!advertise.ok()) {
    std::cerr << "furnace-controller: " << advertise.status().message() << "\n";
    return 2;
  }
  options.advertise_address = *advertise;
  auto security = furnace::controller::MakeServerSecurity(f);
  if (!security.ok()) {
    std::cerr << "furnace-controller: " << security.status().message() << "\n";
    return 2;
  }
  for (const std::string& warning : security->warnings) {
    spdlog::warn("INSECURE (--insecure): {}", warning);
  }
  std::unique_ptr<furnace::controller::Controller> controller;
  std::unique_ptr<furnace::controller::JobServiceImpl> jobs;
  std::unique_ptr<furnace::controller::AgentServer> agents;
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(f.listen, security->credentials, &port);
  furnace::controller::ConfigureServerLimits(builder, f);
  auto c = furnace::controller::Controller::Create(options);
  if (!c.ok()) {
    std::cerr << "furnace-controller: " << c.status().message() << "\n";
    return 1;
  }
  controller = std::move(*c);
  jobs = std::make_unique<furnace::controller::JobServiceImpl>(*controller);
  agents = std::make_unique<furnace::controller::AgentServer>(*controller, builder);
  builder.RegisterService(jobs.get());
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || port == 0) {
    std::cerr << "furnace-controller: cannot listen on " << f.listen
              << " (address in use or not valid)\n";
    return 1;
  }
  agents->Start();
  spdlog::info(
      "listening on {} ({}{}; state dir {})", f.listen, security->tls ? "mutual TLS" : "plaintext",
      security->tls ? (security->tokens ? ", tokens" : ", no tokens") : "", options.state_dir);

  // Prometheus /metrics and the dashboard: plain renderings of the controller's state.
  std::unique_ptr<furnace::controller::http::MonitoringServer> monitoring;
  if (!f.metrics_listen.empty()) {
    namespace http = furnace::controller::http;
    http::MonitoringOptions mo;
    mo.listen = f.metrics_listen;
    mo.web_root = f.web_root.empty() ? http::DefaultWebRoot() : f.web_root;
    mo.allowed_hosts = f.metrics_allowed_hosts;
    http::MonitoringHandlers handlers;
    auto* c = controller.get();
    const bool insecure = security->insecure;
    handlers.metrics_text = [c, insecure] {
      return furnace::controller::metrics::RenderMetrics(c->Metrics()) +
             furnace::controller::InsecureGaugeText(insecure);
    };
    // A page polls it every 2 s: the jobs ever run would only grow it.
    handlers.jobs_json = [c]() -> absl::StatusOr<std::string> {
      return http::JobsJson(c->RecentJobs(/*ended=*/100));
    };
    // The workers panel: every worker the controller knows (lost ones until
    // --forget-lost-workers).
    handlers.workers_json = [c]() -> absl::StatusOr<std::string> {
      furnace::v1::ListWorkersResponse workers;
      for (furnace::v1::WorkerInfo& w : c->ListWorkers()) *workers.add_workers() = std::move(w);
      return http::WorkersJson(workers, furnace::RealClock().UnixSeconds());
    };
    handlers.series_json = [c](const std::string& job_id,
                               const http::SeriesQuery& q) -> absl::StatusOr<std::string> {
      furnace::v1::GetJobSeriesRequest req;
      req.set_job_id(job_id);
      req.set_since_step(q.since_step);
      if (q.cursor) {
        req.set_after_attempt(q.after_attempt);
        req.set_after_step(q.after_step);
      }
      req.set_max_points(q.max_points);
      auto series = c->GetJobSeries(req);
      if (!series.ok()) return series.status();
      return http::SeriesJson(*series);
    };
    auto started = http::MonitoringServer::Start(mo, std::move(handlers));
    if (!started.ok()) {
      std::cerr << "furnace-controller: --metrics-listen " << f.metrics_listen << ": "
                << started.status().message() << "\n";
      agents->Stop(*server, std::chrono::system_clock::now());
      return 1;
    }
    monitoring = std::move(*started);
    spdlog::info("metrics and dashboard on http://{}/ (web root {})", monitoring->address(),
                 mo.web_root);
  }

  std::unique_ptr<furnace::controller::LocalLauncher> launcher;
  if (f.local_workers > 0) {
    furnace::controller::LocalLauncherOptions lo;
    lo.workers = f.local_workers;
    lo.worker_binary =
        f.worker_binary.empty() ? furnace::controller::DefaultWorkerBinary() : f.worker_binary;
    lo.controller_address = options.advertise_address;
    lo.state_dir = options.state_dir;
    lo.log_level = f.log_level;
    // Local workers dial the controller the way it listens: its own certificate (certs init gives
    // it client usage too) and join token; --insecure where the advertised address needs it.
    const auto pass = [&lo](const char* flag, const std::string& path) {
      if (!path.empty()) lo.extra_args.insert(lo.extra_args.end(), {flag, path});
    };
    pass("--tls-ca", f.tls_ca.empty() ? "" : std::filesystem::absolute(f.tls_ca).string());
    pass("--tls-cert", f.tls_cert.empty() ? "" : std::filesystem::absolute(f.tls_cert).string());
    pass("--tls-key", f.tls_key.empty() ? "" : std::filesystem::absolute(f.tls_key).string());
    pass("--join-token-file",
         f.join_token_file.empty() ? "" : std::filesystem::absolute(f.join_token_file).string());
    if (f.insecure) lo.extra_args.push_back("--insecure");
    lo.data_root = options.data_root;
    lo.checkpoint_root = options.checkpoint_root;
    launcher = std::make_unique<furnace::controller::LocalLauncher>(lo, *controller);
    launcher->Start();
  }

  signal(SIGINT, OnSignal);
  signal(SIGTERM, OnSignal);
  signal(SIGPIPE, SIG_IGN);
  // The calls authentication refused (recorded on gRPC's threads) into the audit log.
  const auto audit_refusals = [&] {
    if (security->refusals == nullptr) return;
    for (const auto& r : security->refusals->Take()) {
      controller->AuditRefused(r.unix_time, r.identity, r.action, r.outcome);
    }
  };
  while (!g_stop) {
    controller->Tick();
    audit_refusals();
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  // Ctrl-C pressed again from here on (the store's flush below included) hurries the stop.
  const int interrupts = g_interrupts.load();
  spdlog::info("shutting down");
  audit_refusals();
  // Record running attempts as interrupted (not failed) before our own workers stop them, so the
  // jobs resume after a restart without spending their restart budget.
  controller->Shutdown(/*stopping_workers=*/launcher != nullptr);
  if (launcher) {
    spdlog::info(
        "stopping the {} local worker(s): their train ranks save the step in progress first "
        "(up to {:.0f} s; Ctrl-C again stops them at once, losing it)",
        f.local_workers, launcher->StopTimeoutS());
    launcher->Stop([interrupts] { return g_interrupts.load() > interrupts; });
  }
  agents->Stop(*server, std::chrono::system_clock::now() + std::chrono::seconds(2));
  controller->FlushRecords();
  monitoring.reset();
  return 0;
}
