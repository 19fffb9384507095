// furnace-worker: the worker agent daemon (one per slot) and, as `furnace-worker rank`, the rank
// process the agent spawns for each rank task. Flags, the YAML config file and signal handling
// live here; the logic is in agent.h and rank_main.h.
#include <pthread.h>
#include <signal.h>

#include <atomic>
#include <cstdio>
#include <fstream>
#include <thread>

#include "CLI/CLI.hpp"
#include "absl/strings/str_replace.h"
#include "furnace/v1/agent.grpc.pb.h"
#include "spdlog/sinks/stdout_sinks.h"
#include "spdlog/spdlog.h"
#include "worker/agent.h"
#include "worker/controller_channel.h"
#include "worker/device_probe.h"
#include "worker/rank_main.h"
#include "yaml-cpp/yaml.h"

namespace {

// Reads the --config file: a flat YAML map whose keys are the long flag names (work-dir or
// work_dir). Flags given on the command line override it (CLI11's precedence).
class YamlConfig : public CLI::Config {
 public:
  std::string to_config(const CLI::App*, bool, bool, std::string) const override { return ""; }

  std::vector<CLI::ConfigItem> from_config(std::istream& input) const override {
    YAML::Node root;
    try {
      root = YAML::Load(input);
    } catch (const YAML::Exception& e) {
      throw CLI::ConversionError(std::string("config file: ") + e.what());
    }
    std::vector<CLI::ConfigItem> items;
    if (root.IsNull()) return items;
    if (!root.IsMap()) throw CLI::ConversionError("config file: expected a map of flag: value");
    for (const auto& entry : root) {
      CLI::ConfigItem item;
      item.name = absl::StrReplaceAll(entry.first.as<std::string>(), {{"_", "-"}});
      if (!entry.second.IsScalar()) {
        throw CLI::ConversionError("config file: '" + item.name + "' must be a single value");
      }
      item.inputs = {entry.second.as<std::string>()};
      items.push_back(std::move(item));
    }
    return items;
  }
};

int RunAgent(furnace::worker::AgentOptions options, const std::string& log_level) {
  auto device = furnace::worker::ProbeDevice(options.device_kind, options.slot);
  if (!device.ok()) {
    std::fprintf(stderr, "furnace-worker: --device-kind %s: %s\n", options.device_kind.c_str(),
                 std::string(device.status().message()).c_str());
    return 2;
  }
  options.device_kind = device->kind;
  if (options.device_memory == 0) options.device_memory = device->memory;
  options = furnace::worker::ResolveAgentOptions(std::move(options));
  auto logger = spdlog::stderr_logger_mt("worker");
  logger->set_pattern("[%Y-%m-%d %H:%M:%S.%e] [worker " + options.worker_id + "] [%l] %v");
  spdlog::set_default_logger(logger);
  spdlog::set_level(spdlog::level::from_str(log_level));
  spdlog::flush_on(spdlog::level::info);

  // Signals are taken by one thread with sigwait, so every other thread (gRPC's, supervisors')
  // runs with them blocked. Ranks get a clean mask (rank_supervisor.cc).
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  signal(SIGPIPE, SIG_IGN);

  furnace::worker::Agent agent(
      options,
      furnace::v1::AgentService::NewStub(furnace::worker::MakeControllerChannel(options.controller)));
  std::atomic<bool> finished{false};
  std::thread signal_thread([&] {
    while (true) {
      int sig = 0;
      sigwait(&signals, &sig);
      if (finished.load()) return;
      spdlog::info("received {}; shutting down", sig == SIGINT ? "SIGINT" : "SIGTERM");
      agent.Shutdown();
    }
  });
  const absl::Status status = agent.Run();
  finished.store(true);
  pthread_kill(signal_thread.native_handle(), SIGTERM);
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
  app.config_formatter(std::make_shared<YamlConfig>());
  app.allow_config_extras(CLI::config_extras_mode::error);
  app.set_config("--config", "", "YAML file with the same keys as the flags (flags override it)");

  furnace::worker::AgentOptions options;
  std::string log_level = "info";
  app.add_option("--controller", options.controller, "controller address (AgentService)")
      ->capture_default_str();
  app.add_option("--slot", options.slot, "slot number on this host")->capture_default_str();
  app.add_option("--host", options.host, "address peers use to reach this worker's ranks")
      ->capture_default_str();
  app.add_option("--id", options.worker_id, "worker id (default <hostname>/<slot>)");
  app.add_option("--work-dir", options.work_dir,
                 "directory for task files and rank logs (default ./worker-<slot>)");
  app.add_option("--device-kind", options.device_kind,
                 "cpu | cuda | auto (cuda when this slot has a GPU, else cpu)")
      ->check(CLI::IsMember({"cpu", "cuda", "auto"}))
      ->capture_default_str();
  app.add_option("--device-memory", options.device_memory,
                 "device memory in bytes to offer (default: what the device has)")
      ->capture_default_str();
  app.add_option("--telemetry-capacity", options.telemetry_capacity,
                 "records the agent buffers for the controller; the oldest are dropped beyond")
      ->capture_default_str();
  app.add_option("--shutdown-grace", options.shutdown_grace_s,
                 "seconds ranks get between SIGTERM and SIGKILL when the agent stops")
      ->capture_default_str();
  app.add_option("--log-level", log_level, "trace | debug | info | warn | error")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error"}))
      ->capture_default_str();

  std::string task_path;
  CLI::App* rank = app.add_subcommand(
      "rank", "run one rank task (spawned by the agent; exit codes: 0 success, 1 error, 2 job kind "
              "not in this build, 3 out of memory)");
  rank->add_option("--task", task_path, "RankTask file (binary furnace.v1.RankTask)")
      ->required()
      ->check(CLI::ExistingFile);

  CLI11_PARSE(app, argc, argv);
  if (rank->parsed()) return furnace::worker::RankMain(task_path);
  return RunAgent(std::move(options), log_level);
}
