// furnace-worker: the worker agent daemon (one per slot) and, as `furnace-worker rank`, the rank
// process the agent spawns for each rank task. Flags, the YAML config file and signal handling
// live here; the logic is in agent.h and rank_main.h.
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <optional>
#include <thread>
#include <utility>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "furnace/v1/agent.grpc.pb.h"
#include "runtime/base/daemon_flags.h"
#include "runtime/base/open_files.h"
#include "runtime/base/path_root.h"
#include "runtime/base/yaml_config.h"
#include "spdlog/sinks/stdout_sinks.h"
#include "spdlog/spdlog.h"
#include "transport/listen_address.h"
#include "transport/pem_check.h"
#include "worker/agent.h"
#include "worker/controller_channel.h"
#include "worker/device_probe.h"
#include "worker/rank_exit.h"
#include "worker/rank_log_retention.h"
#include "worker/rank_main.h"

namespace {

// The worker's side of the listen rule: the agent listens on nothing, but it dials the controller
// and sends its join token; to a controller another machine hosts, that needs TLS and the join
// token, or --insecure.
absl::Status CheckControllerLink(const furnace::worker::AgentOptions& options, bool insecure) {
  const auto& s = options.channel_security;
  const bool tls = !s.tls_ca().empty() || !s.tls_cert().empty() || !s.tls_key().empty();
  if (furnace::transport::IsLoopbackAddress(options.controller) || insecure ||
      (tls && !s.join_token_file().empty())) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(
      "--controller " + options.controller +
      " is not a loopback address: give --tls-ca, --tls-cert, --tls-key and --join-token-file "
      "(`furnace certs init DIR` makes development ones), or pass --insecure to dial it in "
      "plaintext");
}

// The agent's SIGTERM / SIGINT: the handler only writes the signal's number to this pipe
// (async-signal-safe), and the signal thread acts on it; 0 tells that thread to return.
int g_signal_pipe[2] = {-1, -1};
constexpr unsigned char kSignalThreadDone = 0;

void OnSignal(int sig) {
  const int saved = errno;
  const auto byte = static_cast<unsigned char>(sig);
  (void)!write(g_signal_pipe[1], &byte, 1);  // a full pipe already holds a shutdown request
  errno = saved;
}

int RunAgent(furnace::worker::AgentOptions options, const std::string& log_level, bool insecure) {
  if (absl::Status link = CheckControllerLink(options, insecure); !link.ok()) {
    std::fprintf(stderr, "furnace-worker: %s\n", std::string(link.message()).c_str());
    return 2;
  }
  auto device = furnace::worker::ProbeDevice(options.device_kind, options.slot);
  if (!device.ok()) {
    std::fprintf(stderr, "furnace-worker: --device-kind %s: %s\n", options.device_kind.c_str(),
                 std::string(device.status().message()).c_str());
    return 2;
  }
  options.device_kind = device->kind;
  if (options.device_memory == 0) options.device_memory = device->memory;
  // The address peers dial this worker's ranks at. A loopback default served one machine only:
  // with a controller elsewhere, every rank on another machine dialled itself.
  std::string host_note;
  if (options.host.empty()) {
    options.host = "127.0.0.1";
    if (!furnace::transport::IsLoopbackAddress(options.controller)) {
      absl::StatusOr<std::string> source = furnace::worker::SourceAddressToward(options.controller);
      if (!source.ok()) {
        // Not 127.0.0.1 for the agent's whole life (its peers would dial themselves): exit, and
        // a service manager starts it again once the name resolves and a route exists.
        std::fprintf(stderr,
                     "furnace-worker: --host not given, and this machine's address toward the "
                     "controller %s is unknown: %s (give --host, the address other machines reach "
                     "this one at)\n",
                     options.controller.c_str(), std::string(source.status().message()).c_str());
        return 1;
      }
      options.host = *source;
      host_note = " (its address toward the controller; --host sets another)";
    }
  }
  options = furnace::worker::ResolveAgentOptions(std::move(options));
  if (absl::Status work_dir = furnace::worker::CheckWorkDir(options.work_dir); !work_dir.ok()) {
    std::fprintf(stderr, "furnace-worker: %s\n", std::string(work_dir.message()).c_str());
    return 2;
  }
  for (auto [flag, root] : {std::pair{"--data-root", &options.data_root},
                            std::pair{"--checkpoint-root", &options.checkpoint_root}}) {
    if (root->empty()) continue;
    absl::StatusOr<std::string> resolved = furnace::ResolveDaemonRoot(*root, flag);
    if (!resolved.ok()) {
      std::fprintf(stderr, "furnace-worker: %s\n",
                   std::string(resolved.status().message()).c_str());
      return 2;
    }
    *root = *resolved;
  }
  auto logger = spdlog::stderr_logger_mt("worker");
  logger->set_pattern("[%Y-%m-%d %H:%M:%S.%e] [worker " + options.worker_id + "] [%l] %v");
  spdlog::set_default_logger(logger);
  spdlog::set_level(spdlog::level::from_str(log_level));
  options.log_level = log_level;
  spdlog::flush_on(spdlog::level::info);
  // Pipes and log files per rank, its gRPC channel; the ranks inherit the raised limit (each
  // also raises its own: worker/rank_main.cc).
  if (absl::StatusOr<furnace::OpenFileLimit> files = furnace::RaiseOpenFileLimit(); files.ok()) {
    spdlog::info("{}", furnace::DescribeOpenFileLimit(*files));
  } else {
    spdlog::warn("open files: {}", std::string(files.status().message()));
  }
  if (!host_note.empty()) {
    spdlog::info("peers reach this worker's ranks at {}{}", options.host, host_note);
  }

  // SIGTERM and SIGINT: a handler writes the signal's number to a pipe the signal thread reads.
  // Not sigwait on a mask: threads that libraries start before main (OpenBLAS's pool, from its
  // load-time constructor) never got the mask, the kernel handed them the signal, and its default
  // action ended the agent without its shutdown. A handler runs on whichever thread gets it. The
  // threads started from here on block both, except the signal thread, so a signal interrupts no
  // gRPC or supervisor call. Ranks get default actions and a clean mask (rank_supervisor.cc).
  if (pipe2(g_signal_pipe, O_CLOEXEC | O_NONBLOCK) != 0) {
    std::fprintf(stderr, "furnace-worker: pipe: %s\n", std::strerror(errno));
    return 1;
  }
  struct sigaction on_signal {};
  on_signal.sa_handler = OnSignal;
  sigemptyset(&on_signal.sa_mask);
  on_signal.sa_flags = SA_RESTART;
  sigset_t signals;
  sigemptyset(&signals);
  for (int sig : {SIGTERM, SIGINT}) {
    sigaddset(&signals, sig);
    sigaction(sig, &on_signal, nullptr);
  }
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  signal(SIGPIPE, SIG_IGN);

  if (insecure && !furnace::transport::IsLoopbackAddress(options.controller)) {
    spdlog::warn("INSECURE (--insecure): dialing the controller at {} without TLS or a join token",
                 options.controller);
  }
  // An expired (or not yet valid) client certificate fails every TLS handshake, which the agent
  // cannot tell from a controller that is not up: its dates are said at start.
  if (const std::string& cert = options.channel_security.tls_cert(); !cert.empty()) {
    const absl::StatusOr<std::string> pem = furnace::transport::ReadFileForFlag(cert, "--tls-cert");
    absl::StatusOr<furnace::transport::CertificateDates> dates =
        pem.ok() ? furnace::transport::ReadCertificateDates(*pem, "--tls-cert " + cert)
                 : pem.status();
    if (dates.ok()) {
      spdlog::info("client certificate --tls-cert {}: {}", cert,
                   furnace::transport::DescribeCertificateDates(*dates));
      if (std::optional<std::string> problem = furnace::transport::CertificateDateProblem(
              *dates, static_cast<int64_t>(std::time(nullptr)), "--tls-cert " + cert)) {
        spdlog::warn("{}", *problem);
      }
    }  // else: the channel below names what is wrong with the file
  }
  auto channel = furnace::worker::MakeControllerChannel(
      options.controller, options.channel_security, options.worker_id);
  if (!channel.ok()) {
    spdlog::error("{}", channel.status().ToString());
    return 2;
  }
  furnace::worker::Agent agent(options, furnace::v1::AgentService::NewStub(*channel));
  std::thread signal_thread([&] {
    pthread_sigmask(SIG_UNBLOCK, &signals, nullptr);
    pollfd readable{g_signal_pipe[0], POLLIN, 0};
    while (true) {
      if (poll(&readable, 1, -1) < 0 && errno != EINTR) return;
      unsigned char sig = 0;
      while (read(g_signal_pipe[0], &sig, 1) == 1) {
        if (sig == kSignalThreadDone) return;
        spdlog::info("received {}; shutting down", sig == SIGINT ? "SIGINT" : "SIGTERM");
        agent.Shutdown();
      }
    }
  });
  const absl::Status status = agent.Run();
  const unsigned char done = kSignalThreadDone;
  (void)!write(g_signal_pipe[1], &done, 1);
  signal_thread.join();
  if (!status.ok()) {
    spdlog::error("{}", status.ToString());
    return 1;
  }
  spdlog::info("stopped");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app(
      "furnace-worker: the Furnace worker agent. Registers with the controller, runs the rank "
      "tasks it is given as child processes, and reports their exits, telemetry and logs.");
  furnace::AddYamlConfigOption(app,
                               "YAML file with the same keys as the flags (flags override it)");

  furnace::worker::AgentOptions options;
  std::string log_level = "info";
  app.add_option("--controller", options.controller, "controller address (AgentService)")
      ->capture_default_str();
  app.add_option("--slot", options.slot, "slot number on this host")->capture_default_str();
  options.host.clear();  // chosen in RunAgent unless given
  app.add_option("--host", options.host,
                 "address peers use to reach this worker's ranks (default: 127.0.0.1 for a "
                 "controller on loopback, else this machine's address on the route to the "
                 "controller)");
  app.add_option("--id", options.worker_id, "worker id (default <hostname>/<slot>)");
  app.add_option("--work-dir", options.work_dir,
                 "directory for task files and rank logs (default ./worker-<slot>)");
  app.add_option("--device-kind", options.device_kind,
                 "cpu | cuda | emulated | auto (cuda when this slot has a GPU, else cpu); "
                 "emulated: the emulated discrete device, for CI and for testing the GPU path "
                 "(resources.device: emulated)")
      ->check(CLI::IsMember({"cpu", "cuda", "emulated", "auto"}))
      ->capture_default_str();
  app.add_option("--device-memory", options.device_memory,
                 "device memory in bytes to offer (default: what the device has; emulated: "
                 "4 GiB); an emulated device is made this large")
      ->capture_default_str();
  app.add_option("--telemetry-capacity", options.telemetry_capacity,
                 "records the agent buffers for the controller; the oldest are dropped beyond")
      ->capture_default_str();
  app.add_option("--telemetry-bytes", options.telemetry_bytes,
                 "bytes of records the agent buffers for the controller (either bound drops the "
                 "oldest)")
      ->capture_default_str();
  app.add_option("--log-bytes", options.log_bytes,
                 "bytes of rank log lines the agent buffers for the controller (the oldest are "
                 "dropped beyond; the local log files keep every line)")
      ->capture_default_str();
  app.add_option("--keep-rank-logs", options.keep_rank_logs_s,
                 "seconds a job's rank logs stay in --work-dir/logs once none has changed and no "
                 "rank of the job runs here (the controller keeps its own copy: `furnace logs`); "
                 "at least 3600; 0 keeps them forever")
      ->check(furnace::ZeroOrSeconds(furnace::worker::kMinKeepRankLogsS, 1e10))
      ->capture_default_str();
  app.add_option("--max-stop-grace", options.max_stop_grace_s,
                 "the most seconds of a job's checkpoint.stop_grace_s this agent's own stop gives "
                 "a train rank to checkpoint its step (SIGUSR1) before SIGTERM; the service "
                 "manager's stop timeout must cover it plus --shutdown-grace")
      ->check(furnace::FiniteRange(0.0, 3600.0))
      ->capture_default_str();
  app.add_option("--shutdown-grace", options.shutdown_grace_s,
                 "seconds ranks get between SIGTERM and SIGKILL when the agent stops")
      ->check(furnace::FiniteRange(0.0, 86400.0))
      ->capture_default_str();
  app.add_option("--data-root", options.data_root,
                 "confine the data files jobs name to this directory: ranks resolve them under it "
                 "(realpath) and refuse any that leads outside");
  app.add_option("--checkpoint-root", options.checkpoint_root,
                 "confine checkpoint.dir to this directory (as --data-root)");
  app.add_option("--log-level", log_level, "trace | debug | info | warn | error")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error"}))
      ->capture_default_str();
  std::string tls_ca, tls_cert, tls_key, join_token_file;
  bool insecure = false;
  app.add_option("--tls-ca", tls_ca, "PEM CA that signed the controller's certificate (TLS)");
  app.add_option("--tls-cert", tls_cert,
                 "PEM client certificate signed by the controller's --tls-ca");
  app.add_option("--tls-key", tls_key, "PEM private key of --tls-cert");
  app.add_option("--join-token-file", join_token_file,
                 "file with the controller's join token (sent on every call; needs TLS)");
  app.add_flag("--insecure", insecure,
               "allow a non-loopback --controller without TLS and a join token");

  std::string task_path;
  CLI::App* rank = app.add_subcommand(
      "rank",
      "run one rank task (spawned by the agent; exit codes: 0 success, 1 error, 2 job kind "
      "not in this build, 3 out of memory, 4 bad input, 80 failed health check, 81 corrupt "
      "data, 82 stopped on SIGUSR1 after a checkpoint)");
  rank->add_option("--task", task_path, "RankTask file (binary furnace.v1.RankTask)")
      ->required()
      ->check(CLI::ExistingFile);

  if (std::optional<int> exit = furnace::ParseDaemonFlags(app, "furnace-worker", argc, argv)) {
    // A rank's exit 2 says its job kind is not in this build: a bad option of `rank` (the agent
    // spawned it) is an error.
    return *exit == furnace::kDaemonExitUsage && rank->parsed() ? furnace::worker::kRankExitError
                                                                : *exit;
  }
  if (rank->parsed()) return furnace::worker::RankMain(task_path);
  // Absolute: ranks read them from their own working directories.
  const auto absolute = [](const std::string& path) {
    return path.empty() ? path : std::filesystem::absolute(path).string();
  };
  options.channel_security.set_tls_ca(absolute(tls_ca));
  options.channel_security.set_tls_cert(absolute(tls_cert));
  options.channel_security.set_tls_key(absolute(tls_key));
  options.channel_security.set_join_token_file(absolute(join_token_file));
  return RunAgent(std::move(options), log_level, insecure);
}
