#include "worker/agent.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string_view>
#include <utility>

#include "absl/strings/str_cat.h"
#include "grpcpp/grpcpp.h"
#include "proto/furnace/v1/job_paths.h"
#include "runtime/base/status.h"
#include "spdlog/spdlog.h"
#include "worker/rank_log_retention.h"

namespace furnace::worker {
namespace {

std::string RandomInstanceId() {
  std::random_device rd;
  const uint64_t a = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  const uint64_t b = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  return absl::StrCat(absl::Hex(a, absl::kZeroPad16), absl::Hex(b, absl::kZeroPad16));
}

constexpr double kMinBackoffS = 0.2;
constexpr double kMaxBackoffS = 2.0;
constexpr size_t kMaxBatch = 1000;
// A push's records or lines together at most this many bytes (one larger item goes alone), well
// under the controller's --max-request-bytes (64 MiB by default): 1,000 log lines of the
// supervisor's longest (64 KiB) came to about 62.5 MiB, and a batch over it is refused for good.
constexpr size_t kMaxBatchBytes = size_t{8} << 20;

// Whether a push the controller refused may succeed if sent again: it was not reached, or was
// busy. Any other error (its log store could not write, the batch is over its request limit, ...)
// answers the same bytes the same way every time: that batch is dropped and counted, so that it
// cannot hold back the records behind it, nor an exit report (the report loop flushes first).
bool PushWorthRetrying(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::UNAVAILABLE:
    case grpc::StatusCode::DEADLINE_EXCEEDED:
    case grpc::StatusCode::CANCELLED:
    case grpc::StatusCode::ABORTED:
    case grpc::StatusCode::UNKNOWN:
    case grpc::StatusCode::UNAUTHENTICATED:  // as the exit report would be: nothing to gain
    case grpc::StatusCode::PERMISSION_DENIED:
      return true;
    default:
      return false;
  }
}

std::string RankKey(const std::string& job_id, uint32_t attempt, uint32_t rank) {
  return absl::StrCat(job_id, "/", attempt, "/", rank);
}

// Job ids come from the controller; keep them from escaping the work directory all the same.
std::string SafeName(std::string name) {
  for (char& c : name) {
    if (c == '/' || c == '\0') c = '_';
  }
  if (name.empty() || name == "." || name == "..") name = absl::StrCat("_", name);
  return name;
}

std::chrono::duration<double> Seconds(double s) { return std::chrono::duration<double>(s); }

void SetDeadline(grpc::ClientContext* context, double seconds) {
  context->set_deadline(std::chrono::system_clock::now() +
                        std::chrono::duration_cast<std::chrono::milliseconds>(Seconds(seconds)));
}

std::string Describe(const grpc::Status& status) {
  if (status.ok()) return "OK";
  return absl::StrCat(static_cast<int>(status.error_code()), " ", status.error_message());
}

}  // namespace

std::string Agent::UnreachableHint(const grpc::Status& status) const {
  const furnace::v1::ChannelSecurity& tls = options_.channel_security;
  const bool with_tls = !tls.tls_ca().empty() || !tls.tls_cert().empty();
  const std::string& error = status.error_message();
  if (!with_tls) {
    return absl::StrCat("Is furnace-controller running at ", options_.controller,
                        " (--controller)? One that runs with TLS closes plaintext connections: "
                        "give --tls-ca, --tls-cert and --tls-key");
  }
  if (error.find("wrong version number") != std::string::npos) {
    return "The controller does not speak TLS (a plaintext controller): start it with "
           "--tls-cert/--tls-key/--tls-ca, or drop them here";
  }
  // The name the controller's certificate must carry: the host of --controller.
  std::string host = options_.controller;
  if (host.starts_with("[")) {
    host = host.substr(1, host.find(']') - 1);
  } else if (const size_t colon = host.rfind(':'); colon != std::string::npos) {
    host.resize(colon);
  }
  const bool handshake = error.find("andshake") != std::string::npos;
  return absl::StrCat(
      handshake ? "The TLS handshake failed"
                : "If the controller is up, the TLS handshake may fail",
      ": check --tls-ca ", tls.tls_ca(), " (the CA that signed the controller's certificate), ",
      "--tls-cert ", tls.tls_cert(),
      " and --tls-key (this worker's certificate and key, signed by "
      "the CA the controller trusts), that the controller's certificate names ",
      host, ", and both certificates' dates (`openssl x509 -noout -dates -in FILE`)");
}

AgentOptions ResolveAgentOptions(AgentOptions options) {
  if (options.worker_id.empty()) {
    char host[256] = {};
    if (gethostname(host, sizeof(host) - 1) != 0) std::snprintf(host, sizeof(host), "localhost");
    options.worker_id = absl::StrCat(host, "/", options.slot);
  }
  if (options.work_dir.empty()) options.work_dir = absl::StrCat("./worker-", options.slot);
  if (options.rank_command.empty()) options.rank_command = {"/proc/self/exe", "rank", "--task"};
  return options;
}

absl::Status CheckWorkDir(const std::string& dir) {
  struct stat st {};
  // lstat: a symlink is refused (below, not a directory), not followed. Another user could plant
  // one in a shared directory pointing at a directory of this user's now, and re-point it later.
  if (::lstat(dir.c_str(), &st) != 0) {
    if (errno == ENOENT) return absl::OkStatus();
    return absl::FailedPreconditionError(
        absl::StrCat("--work-dir ", dir, ": cannot examine it (", std::strerror(errno), ")"));
  }
  if (!S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--work-dir ", dir, S_ISLNK(st.st_mode) ? ": a symbolic link" : ": not a directory",
        " (allowed: a directory of this user's own, or a path that does not exist "
        "yet)"));
  }
  if (st.st_uid != geteuid()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--work-dir ", dir, ": owned by uid ", st.st_uid, ", not by this user (uid ", geteuid(),
        "), who would run ranks from the task files its owner can change; use a directory of "
        "your own (the agent creates a missing one, mode 0700)"));
  }
  if ((st.st_mode & 022) != 0) {
    char mode[8];
    std::snprintf(mode, sizeof(mode), "%04o", static_cast<unsigned>(st.st_mode & 07777));
    return absl::FailedPreconditionError(
        absl::StrCat("--work-dir ", dir, ": mode ", mode,
                     " lets other users write the task files ranks start from; `chmod go-w ", dir,
                     "` (0700 is what the agent gives one it creates)"));
  }
  return absl::OkStatus();
}

Agent::Agent(AgentOptions options, std::shared_ptr<furnace::v1::AgentService::StubInterface> stub,
             const Clock& clock)
    : options_(ResolveAgentOptions(std::move(options))),
      stub_(std::move(stub)),
      clock_(clock),
      instance_id_(RandomInstanceId()),
      telemetry_(options_.telemetry_capacity, options_.telemetry_bytes),
      unsettled_(options_.telemetry_capacity, options_.telemetry_bytes),
      logs_(options_.log_capacity, options_.log_bytes),
      flush_interval_s_(options_.flush_interval_s) {}

Agent::~Agent() {
  Shutdown();
  std::map<std::string, RankEntry> ranks;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ranks.swap(ranks_);
  }
  // A rank SIGKILL could not end (stuck in the kernel, reported already) would hold its
  // supervisor's destructor until the kernel lets it go: the agent exits without reaping it.
  for (auto& [key, entry] : ranks) {
    if (entry.supervisor == nullptr || !entry.supervisor->stuck()) continue;
    spdlog::error("rank {} (pid {}) did not end after SIGKILL; exiting without reaping it", key,
                  entry.pid);
    // Its thread still waits on the child (and may yet flush a line): it must not reach this agent.
    entry.supervisor->DetachSinks();
    (void)entry.supervisor.release();
  }
  // Supervisor destructors kill what still runs; their exit sinks take mu_, so not under it.
  ranks.clear();
}

void Agent::Shutdown() {
  std::lock_guard<std::mutex> lock(mu_);
  shutting_down_ = true;
  if (watch_context_ != nullptr) watch_context_->TryCancel();
  if (register_context_ != nullptr) register_context_->TryCancel();
  cv_.notify_all();
}

absl::Status Agent::Run() {
  RETURN_IF_ERROR(CheckWorkDir(options_.work_dir));
  std::error_code ec;
  if (!std::filesystem::exists(options_.work_dir, ec)) {
    std::filesystem::create_directories(options_.work_dir, ec);
    if (!ec) {
      std::filesystem::permissions(options_.work_dir, std::filesystem::perms::owner_all,
                                   std::filesystem::perm_options::replace, ec);
    }
    if (ec) {
      return absl::FailedPreconditionError(
          absl::StrCat("cannot create --work-dir ", options_.work_dir, ": ", ec.message()));
    }
  }
  for (const char* sub : {"tasks", "logs"}) {
    std::filesystem::create_directories(std::filesystem::path(options_.work_dir) / sub, ec);
    if (ec) {
      return absl::FailedPreconditionError(
          absl::StrCat("cannot create ", options_.work_dir, "/", sub, ": ", ec.message()));
    }
  }
  // Task files a predecessor left (killed outright, it could not remove them): its ranks died
  // with it (PR_SET_PDEATHSIG), and each rank read its file at start, so none is read again.
  size_t swept = 0;
  for (const auto& entry : std::filesystem::directory_iterator(
           std::filesystem::path(options_.work_dir) / "tasks", ec)) {
    std::error_code rm;
    if (entry.is_regular_file(rm) && std::filesystem::remove(entry.path(), rm)) ++swept;
  }
  if (swept > 0) spdlog::info("removed {} task file(s) a previous agent left", swept);
  if (options_.keep_rank_logs_s > 0) SweepRankLogsNow();  // then every kRankLogSweepEveryS
  spdlog::info("worker {} (slot {}, {} {} bytes, host {}) -> controller {}, work dir {}",
               options_.worker_id, options_.slot, options_.device_kind, options_.device_memory,
               options_.host, options_.controller, options_.work_dir);
  std::thread watcher(&Agent::WatchLoop, this);
  std::thread reporter(&Agent::ReportLoop, this);
  std::thread flusher(&Agent::FlushLoop, this);
  std::thread sweeper;
  if (options_.keep_rank_logs_s > 0) sweeper = std::thread(&Agent::SweepLoop, this);

  HeartbeatLoop();  // until Shutdown()

  SayLeaving();
  spdlog::info("shutting down: stopping ranks (grace {} s)", options_.shutdown_grace_s);
  StopAllRanks();
  const double flush_until = clock_.MonotonicSeconds() + options_.shutdown_flush_s;
  {
    std::unique_lock<std::mutex> lock(mu_);
    while (!reports_.empty() && clock_.MonotonicSeconds() < flush_until) {
      cv_.wait_for(lock, Seconds(0.05));
    }
    if (!reports_.empty()) {
      spdlog::warn("exiting with {} rank report(s) the controller did not acknowledge",
                   reports_.size());
    }
    stop_senders_ = true;
    cv_.notify_all();
  }
  watcher.join();
  reporter.join();
  flusher.join();
  if (sweeper.joinable()) sweeper.join();
  bool registered;
  {
    std::lock_guard<std::mutex> lock(mu_);
    registered = registered_;
  }
  if (registered) FlushOnce();
  ReapFinished();
  return absl::OkStatus();
}

void Agent::HeartbeatLoop() {
  double backoff = kMinBackoffS;
  int failures = 0;
  while (true) {
    bool registered;
    double interval;
    uint64_t generation;
    std::string session;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (shutting_down_) return;
      registered = registered_;
      interval = heartbeat_interval_s_;
      generation = generation_;
      session = session_id_;
    }
    ReapFinished();
    if (!registered) {
      if (RegisterOnce()) {
        backoff = kMinBackoffS;
        failures = 0;
        continue;
      }
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait_for(lock, Seconds(backoff), [&] { return shutting_down_; });
      backoff = std::min(kMaxBackoffS, backoff * 2);
      continue;
    }
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait_for(lock, Seconds(interval), [&] { return shutting_down_ || !registered_; });
      if (shutting_down_) return;
      if (!registered_) continue;
    }
    furnace::v1::HeartbeatRequest request;
    request.set_worker_id(options_.worker_id);
    request.set_session_id(session);
    for (auto& running : Running()) *request.add_running() = std::move(running);
    furnace::v1::HeartbeatResponse response;
    grpc::ClientContext context;
    // Well above the interval: a controller busy for a moment (an fsync) is not a lost one.
    SetDeadline(&context, std::clamp(3 * interval, 3.0, std::max(3.0, options_.rpc_timeout_s)));
    const grpc::Status status = stub_->Heartbeat(&context, request, &response);
    if (status.ok() && !response.reregister()) {
      if (response.telemetry_flush_s() > 0) {
        std::lock_guard<std::mutex> lock(mu_);
        flush_interval_s_ = response.telemetry_flush_s();
      }
      if (response.reconcile()) Reconcile(request, response, generation);
      continue;
    }
    if (status.ok()) {
      spdlog::warn("controller asked to register again (session {} unknown)", session);
    } else if (failures++ % 10 == 0) {
      spdlog::warn("heartbeat failed: {}; registering again", Describe(status));
    }
    std::lock_guard<std::mutex> lock(mu_);
    RequestReregisterLocked(generation);
  }
}

void Agent::SayLeaving() {
  std::string session;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!registered_) return;
    session = session_id_;
  }
  furnace::v1::HeartbeatRequest request;
  request.set_worker_id(options_.worker_id);
  request.set_session_id(session);
  request.set_leaving(true);
  furnace::v1::HeartbeatResponse response;
  grpc::ClientContext context;
  SetDeadline(&context, std::min(2.0, options_.rpc_timeout_s));  // best effort: it is leaving
  const grpc::Status status = stub_->Heartbeat(&context, request, &response);
  if (!status.ok()) {
    spdlog::warn("could not tell the controller this worker is leaving: {}", Describe(status));
  }
}

bool Agent::RegisterOnce() {
  furnace::v1::RegisterRequest request;
  request.set_worker_id(options_.worker_id);
  request.set_host(options_.host);
  request.set_slot(options_.slot);
  request.set_device_kind(options_.device_kind);
  request.set_device_memory(options_.device_memory);
  request.set_pid(getpid());
  request.set_instance_id(instance_id_);
  for (auto& running : Running()) *request.add_running() = std::move(running);
  furnace::v1::RegisterResponse response;
  grpc::ClientContext context;
  bool probe = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (shutting_down_) return false;
    register_context_ = &context;
    probe = unreachable_registers_ >= kUnreachableWarnAfter &&
            clock_.MonotonicSeconds() - unreachable_warned_s_ >= kUnreachableWarnS;
  }
  // Wait for the channel rather than fail fast while it is down: after a controller restart the
  // registration leaves the moment the controller listens, not at our next backoff tick. A
  // shutdown cancels the wait. A wait that ends at its deadline says only "Deadline Exceeded",
  // though, where a failed TLS handshake has a reason: the attempt that is to warn fails fast, and
  // so carries the channel's last error (`... Ssl handshake failed: ... certificate verify
  // failed`).
  context.set_wait_for_ready(!probe);
  SetDeadline(&context, options_.rpc_timeout_s);
  const grpc::Status status = stub_->Register(&context, request, &response);
  {
    std::lock_guard<std::mutex> lock(mu_);
    register_context_ = nullptr;
  }
  if (!status.ok()) {
    // An unreachable controller is the usual wait for one to come up; a refusal (credentials, a
    // worker id its certificate does not allow) is what an operator must see.
    const bool unreachable = status.error_code() == grpc::StatusCode::UNAVAILABLE ||
                             status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED;
    constexpr double kRegisterWarnS = 30;
    std::lock_guard<std::mutex> lock(mu_);
    const double now = clock_.MonotonicSeconds();
    // A call the agent's own shutdown cancelled is no refusal.
    if (shutting_down_) return false;
    if (!unreachable) unreachable_registers_ = 0;  // it answered
    if (!unreachable && now - register_warned_s_ >= kRegisterWarnS) {
      register_warned_s_ = now;
      spdlog::warn(
          "the controller refused registration: {} (retrying; said at most every {:.0f} s)",
          Describe(status), kRegisterWarnS);
    } else if (unreachable && ++unreachable_registers_ > kUnreachableWarnAfter && probe) {
      // A failed TLS handshake (an expired or wrong certificate, a CA that did not sign the
      // controller's, a name the controller's certificate does not carry) looks the same as a
      // controller that is not up yet: said once a minute while it lasts, with what to check.
      unreachable_warned_s_ = now;
      spdlog::warn(
          "cannot register with the controller at {}: {} registrations in a row failed, "
          "the last with: {}. {} (retrying; said at most every {:.0f} s)",
          options_.controller, unreachable_registers_, Describe(status), UnreachableHint(status),
          kUnreachableWarnS);
    } else {
      spdlog::debug("register failed: {}", Describe(status));
    }
    return false;
  }
  std::lock_guard<std::mutex> lock(mu_);
  unreachable_registers_ = 0;
  session_id_ = response.session_id();
  heartbeat_interval_s_ =
      response.heartbeat_interval_s() > 0 ? response.heartbeat_interval_s() : 1.0;
  flush_interval_s_ =
      response.telemetry_flush_s() > 0 ? response.telemetry_flush_s() : options_.flush_interval_s;
  registered_ = true;
  ++generation_;
  reconciled_.clear();
  // A stream from an older session may still be open: close it, WatchLoop opens the new one.
  if (watch_context_ != nullptr) watch_context_->TryCancel();
  cv_.notify_all();
  spdlog::info(
      "registered with {} (session {}, heartbeat every {} s, telemetry every {} s, {} rank(s) "
      "running)",
      options_.controller, session_id_, heartbeat_interval_s_, flush_interval_s_,
      request.running_size());
  return true;
}

void Agent::RequestReregisterLocked(uint64_t generation) {
  if (generation_ != generation || !registered_) return;  // already handled
  registered_ = false;
  cv_.notify_all();
}

void Agent::WatchLoop() {
  uint64_t seen = 0;
  while (true) {
    furnace::v1::WatchCommandsRequest request;
    request.set_worker_id(options_.worker_id);
    grpc::ClientContext context;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return shutting_down_ || (registered_ && generation_ != seen); });
      if (shutting_down_) return;
      seen = generation_;
      request.set_session_id(session_id_);
      watch_context_ = &context;
    }
    std::unique_ptr<grpc::ClientReaderInterface<furnace::v1::AgentCommand>> reader =
        stub_->WatchCommands(&context, request);
    furnace::v1::AgentCommand command;
    while (reader->Read(&command)) HandleCommand(command);
    const grpc::Status status = reader->Finish();
    std::lock_guard<std::mutex> lock(mu_);
    watch_context_ = nullptr;
    if (shutting_down_) return;
    if (generation_ == seen) {
      spdlog::warn("command stream ended ({}); registering again", Describe(status));
      RequestReregisterLocked(seen);
    }
  }
}

void Agent::HandleCommand(const furnace::v1::AgentCommand& command) {
  switch (command.command_case()) {
    case furnace::v1::AgentCommand::kStart:
      HandleStart(command.start());
      break;
    case furnace::v1::AgentCommand::kStop:
      HandleStop(command.stop());
      break;
    default:
      spdlog::warn("ignoring an empty or unknown command");
  }
}

absl::Status Agent::WriteTaskFile(const furnace::v1::RankTask& task, std::string* path) const {
  const std::filesystem::path dir = std::filesystem::path(options_.work_dir) / "tasks";
  *path =
      (dir / absl::StrCat(SafeName(task.job_id()), "-a", task.attempt(), "-r", task.rank(), ".pb"))
          .string();
  const std::string tmp = *path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out || !task.SerializeToOstream(&out)) {
      return absl::InternalError(absl::StrCat("cannot write the task file ", tmp));
    }
  }
  std::error_code ec;
  std::filesystem::rename(tmp, *path, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot rename ", tmp, ": ", ec.message()));
  return absl::OkStatus();
}

void Agent::HandleStart(furnace::v1::RankTask task) {
  const std::string key = RankKey(task.job_id(), task.attempt(), task.rank());
  if (task.controller_address().empty()) task.set_controller_address(options_.controller);
  if (task.host().empty()) task.set_host(options_.host);
  *task.mutable_channel_security() = options_.channel_security;
  // The roots are this agent's, whatever the controller sent.
  task.set_data_root(options_.data_root);
  task.set_checkpoint_root(options_.checkpoint_root);
  // The slot's device, for resources.device cuda (its GPU) and emulated (its size).
  task.set_device_ordinal(options_.slot);
  task.set_device_memory(options_.device_memory);
  task.set_log_level(options_.log_level);

  furnace::v1::RankReport report;
  report.set_job_id(task.job_id());
  report.set_attempt(task.attempt());
  report.set_rank(task.rank());
  // Held across the spawn so this rank's exit report cannot overtake its start report.
  std::lock_guard<std::mutex> lock(mu_);
  if (shutting_down_) {
    spdlog::warn("not starting rank {}: the agent is shutting down", key);
    return;
  }
  if (forgotten_.count(key) > 0) {
    spdlog::info("rank {} already ran here; ignoring the repeated start", key);
    return;
  }
  if (auto it = ranks_.find(key); it != ranks_.end()) {
    if (!it->second.exited) {
      spdlog::info("rank {} already running (pid {}); confirming", key, it->second.pid);
      report.set_event(furnace::v1::RANK_STARTED);
      report.set_pid(it->second.pid);
      EnqueueReportLocked(std::move(report));
    } else {
      spdlog::info("rank {} already ran here; ignoring the repeated start", key);
    }
    return;
  }
  // A rank SIGKILL could not end (stuck in the kernel, reported already) still holds this slot's
  // device: a new one there would share it with a process the driver will not let go. Refused as
  // any start that fails (the launch report below).
  absl::Status status;
  for (const auto& [other, held] : ranks_) {
    if (held.supervisor == nullptr || !held.supervisor->stuck()) continue;
    status = absl::FailedPreconditionError(
        absl::StrCat("rank ", other, " (pid ", held.pid,
                     ") of this worker did not end after SIGKILL and still holds its slot"));
    break;
  }
  RankEntry& entry = ranks_[key];
  entry.task = task;

  std::string task_path;
  if (status.ok()) status = WriteTaskFile(task, &task_path);
  entry.task_path = task_path;
  absl::StatusOr<std::unique_ptr<RankSupervisor>> supervisor = absl::UnknownError("not started");
  if (!status.ok()) {
    supervisor = status;
  } else {
    RankLaunch launch;
    launch.job_id = task.job_id();
    launch.attempt = task.attempt();
    launch.rank = task.rank();
    launch.argv = options_.rank_command;
    launch.argv.push_back(task_path);
    launch.log_path =
        (std::filesystem::path(options_.work_dir) / "logs" / SafeName(task.job_id()) /
         absl::StrCat("attempt-", task.attempt()) / absl::StrCat("rank-", task.rank(), ".log"))
            .string();
    launch.hang_timeout_s = task.spec().recovery().hang_timeout_s();
    launch.start_timeout_s = StartTimeoutS(task);
    RankSinks sinks;
    sinks.on_log = [this](furnace::v1::LogLine line) { logs_.Push(std::move(line)); };
    sinks.on_telemetry = [this](furnace::v1::TelemetryRecord record) {
      telemetry_.Push(std::move(record));
    };
    sinks.on_exit = [this, key](const furnace::v1::RankReport& exit) { OnRankExit(key, exit); };
    supervisor = RankSupervisor::Start(std::move(launch), std::move(sinks), clock_);
  }
  report.set_unix_time(clock_.UnixSeconds());
  if (!supervisor.ok()) {
    spdlog::error("rank {} could not be started: {}", key, supervisor.status().ToString());
    entry.exited = true;
    report.set_event(furnace::v1::RANK_EXITED);
    report.set_exit_kind(furnace::v1::EXIT_KIND_LAUNCH);
    report.set_reason(absl::StrCat("could not start: ", supervisor.status().message()));
    report.set_failed_unix(report.unix_time());
    entry.exit_report = report;
    entry.exit_report->set_worker_id(options_.worker_id);
    EnqueueReportLocked(std::move(report));
    return;
  }
  entry.supervisor = *std::move(supervisor);
  entry.pid = entry.supervisor->pid();
  spdlog::info("rank {} started (pid {}, world size {}, kind {})", key, entry.pid,
               task.world_size(), task.spec().kind());
  report.set_event(furnace::v1::RANK_STARTED);
  report.set_pid(entry.pid);
  EnqueueReportLocked(std::move(report));
}

void Agent::HandleStop(const furnace::v1::StopRank& stop) {
  const std::string key = RankKey(stop.job_id(), stop.attempt(), stop.rank());
  std::lock_guard<std::mutex> lock(mu_);
  if (forgotten_.count(key) > 0) return;  // ended, and its exit report was delivered
  auto it = ranks_.find(key);
  if (it == ranks_.end()) {
    // Nothing to stop; say so, so a controller waiting for this rank to end can move on.
    spdlog::info("stop for rank {} which is not running here", key);
    furnace::v1::RankReport report;
    report.set_job_id(stop.job_id());
    report.set_attempt(stop.attempt());
    report.set_rank(stop.rank());
    report.set_event(furnace::v1::RANK_EXITED);
    report.set_exit_kind(furnace::v1::EXIT_KIND_STOPPED);
    report.set_reason(
        absl::StrCat("stopped: ", stop.reason(), " (was not running on this worker)"));
    report.set_unix_time(clock_.UnixSeconds());
    EnqueueReportLocked(std::move(report));
    return;
  }
  if (it->second.exited || it->second.supervisor == nullptr) return;  // its exit is reported
  spdlog::info("stopping rank {} (grace {} s): {}", key, stop.grace_s(), stop.reason());
  it->second.supervisor->Stop(stop.grace_s(), stop.reason(), stop.checkpoint_grace_s());
}

void Agent::Reconcile(const furnace::v1::HeartbeatRequest& sent,
                      const furnace::v1::HeartbeatResponse& response, uint64_t generation) {
  constexpr double kStopGraceS = 5;
  std::lock_guard<std::mutex> lock(mu_);
  if (generation != generation_ || shutting_down_) return;
  std::set<std::string> listed, wanted;
  std::map<std::string, double> checkpoint_grace;  // unwanted ranks stopped keeping the progress
  for (const furnace::v1::ControllerRankView& view : response.ranks()) {
    const std::string key = RankKey(view.job_id(), view.attempt(), view.rank());
    listed.insert(key);
    if (view.wanted()) wanted.insert(key);
    if (view.checkpoint_grace_s() > 0) checkpoint_grace[key] = view.checkpoint_grace_s();
  }
  // Only ranks this heartbeat told the controller about: one started since may not be in the
  // records it answered from.
  for (const furnace::v1::RunningRank& running : sent.running()) {
    const std::string key = RankKey(running.job_id(), running.attempt(), running.rank());
    if (wanted.count(key) > 0) continue;
    auto it = ranks_.find(key);
    if (it == ranks_.end() || it->second.exited || it->second.supervisor == nullptr) continue;
    const std::string why = listed.count(key) > 0
                                ? "its attempt is over (the controller's view at heartbeat)"
                                : "the controller has no record of it here (heartbeat)";
    spdlog::warn("stopping rank {}: {}", key, why);
    // (A stop already asked keeps its signals' times: Stop only brings them forward.)
    const auto grace = checkpoint_grace.find(key);
    it->second.supervisor->Stop(kStopGraceS, why,
                                grace != checkpoint_grace.end() ? grace->second : 0);
  }
  for (const furnace::v1::ControllerRankView& view : response.ranks()) {
    if (!view.started()) continue;  // its start command may still be on the way
    const std::string key = RankKey(view.job_id(), view.attempt(), view.rank());
    auto it = ranks_.find(key);
    if (it != ranks_.end() && !it->second.exited) continue;  // runs here: nothing to say
    if (reconciled_.count(key) > 0) continue;
    const bool on_its_way = std::any_of(reports_.begin(), reports_.end(), [&](const auto& r) {
      return r.event() == furnace::v1::RANK_EXITED &&
             RankKey(r.job_id(), r.attempt(), r.rank()) == key;
    });
    if (on_its_way) continue;
    reconciled_.insert(key);
    const std::optional<furnace::v1::RankReport>* exit_report = nullptr;
    if (it != ranks_.end()) {
      exit_report = &it->second.exit_report;
    } else if (auto f = forgotten_.find(key); f != forgotten_.end()) {
      exit_report = &f->second;
    }
    if (exit_report != nullptr && exit_report->has_value()) {
      spdlog::warn(
          "the controller still believes rank {} runs here; sending its exit report "
          "again",
          key);
      EnqueueReportLocked(**exit_report);
      continue;
    }
    spdlog::warn(
        "the controller believes rank {} runs here, but this worker has no such rank; "
        "reporting it lost",
        key);
    furnace::v1::RankReport report;
    report.set_job_id(view.job_id());
    report.set_attempt(view.attempt());
    report.set_rank(view.rank());
    report.set_event(furnace::v1::RANK_EXITED);
    report.set_exit_kind(furnace::v1::EXIT_KIND_LOST);
    report.set_reason(absl::StrCat("lost: worker ", options_.worker_id,
                                   " does not run this rank (its agent has no record of it)"));
    report.set_unix_time(clock_.UnixSeconds());
    report.set_failed_unix(report.unix_time());
    EnqueueReportLocked(std::move(report));
  }
  ForgetEndedLocked(listed);
}

void Agent::ForgetEndedLocked(const std::set<std::string>& listed) {
  std::set<std::string> unacked;  // exit reports still to be delivered
  for (const furnace::v1::RankReport& r : reports_) {
    unacked.insert(RankKey(r.job_id(), r.attempt(), r.rank()));
  }
  for (auto it = ranks_.begin(); it != ranks_.end();) {
    const RankEntry& entry = it->second;
    // Reaped (ReapFinished on this thread), its end delivered, and over for the controller too.
    if (!entry.exited || entry.supervisor != nullptr || unacked.count(it->first) > 0 ||
        listed.count(it->first) > 0) {
      ++it;
      continue;
    }
    if (!entry.task_path.empty()) {
      std::error_code ec;
      std::filesystem::remove(entry.task_path, ec);  // best effort: a leftover file is harmless
    }
    forgotten_[it->first] = entry.exit_report;
    forgotten_order_.push_back(it->first);
    if (forgotten_order_.size() > kForgottenKept) {
      forgotten_.erase(forgotten_order_.front());
      forgotten_order_.pop_front();
    }
    it = ranks_.erase(it);
  }
}

size_t Agent::KnownRanks() const {
  std::lock_guard<std::mutex> lock(mu_);
  return ranks_.size();
}

void Agent::OnRankExit(const std::string& key, furnace::v1::RankReport report) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = ranks_.find(key);
  if (it != ranks_.end()) {
    it->second.exited = true;
    it->second.exit_report = report;
    it->second.exit_report->set_worker_id(options_.worker_id);
  }
  spdlog::info("rank {} (pid {}) ended: {}", key, report.pid(), report.reason());
  EnqueueReportLocked(std::move(report));
}

void Agent::EnqueueReportLocked(furnace::v1::RankReport report) {
  report.set_worker_id(options_.worker_id);
  reports_.push_back(std::move(report));
  cv_.notify_all();
}

void Agent::ReportLoop() {
  double backoff = kMinBackoffS;
  while (true) {
    furnace::v1::RankReport report;
    uint64_t generation;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_senders_ || (registered_ && !reports_.empty()); });
      if (stop_senders_) return;
      report = reports_.front();
      generation = generation_;
    }
    // A rank's last records (its final progress, its last words) reach the controller before
    // the report that it ended.
    if (report.event() == furnace::v1::RANK_EXITED && !FlushOnce()) {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait_for(lock, Seconds(backoff), [&] { return stop_senders_; });
      backoff = std::min(kMaxBackoffS, backoff * 2);
      continue;
    }
    furnace::v1::Ack ack;
    grpc::ClientContext context;
    SetDeadline(&context, options_.rpc_timeout_s);
    const grpc::Status status = stub_->ReportRank(&context, report, &ack);
    const grpc::StatusCode code = status.error_code();
    std::unique_lock<std::mutex> lock(mu_);
    // Only this thread pops, so the front is still `report`.
    if (status.ok() || code == grpc::StatusCode::INVALID_ARGUMENT ||
        code == grpc::StatusCode::NOT_FOUND) {
      if (!status.ok()) {
        spdlog::error("controller refused the report for {}/{}/{}: {}; dropping it",
                      report.job_id(), report.attempt(), report.rank(), Describe(status));
      }
      reports_.pop_front();
      backoff = kMinBackoffS;
      continue;
    }
    spdlog::debug("report failed: {}; will retry", Describe(status));
    if (code == grpc::StatusCode::FAILED_PRECONDITION ||
        code == grpc::StatusCode::UNAUTHENTICATED) {
      RequestReregisterLocked(generation);  // the controller does not know us (any more)
    }
    cv_.wait_for(lock, Seconds(backoff),
                 [&] { return stop_senders_ || generation_ != generation; });
    backoff = std::min(kMaxBackoffS, backoff * 2);
  }
}

void Agent::FlushLoop() {
  while (true) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      const double interval = flush_interval_s_;
      if (cv_.wait_for(lock, Seconds(interval), [&] { return stop_senders_; })) {
        return;
      }
      if (!registered_) continue;  // keep buffering; the queues are bounded
    }
    FlushOnce();
  }
}

bool Agent::FlushOnce() {
  // One flusher at a time (the flush loop, and the report loop before an exit report), so a
  // rank's records are pushed in order and an exit report never overtakes them.
  std::lock_guard<std::mutex> flush_lock(flush_mu_);
  // A new registration (the controller may have restarted and lost the steps it was merging):
  // the step records it acknowledged but has not stored are pushed again, first.
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (generation_ != flushed_generation_) {
      flushed_generation_ = generation_;
      telemetry_.PutBack(unsettled_.TakeAll());
    }
  }
  const auto push = [this](furnace::v1::TelemetryBatch& request) {
    {
      // Registered anew since this flush began: the held records go first, at the next flush.
      std::lock_guard<std::mutex> lock(mu_);
      if (generation_ != flushed_generation_) {
        return grpc::Status(grpc::StatusCode::UNAVAILABLE, "registered anew during the flush");
      }
    }
    request.set_worker_id(options_.worker_id);
    std::set<std::string> asked = unsettled_.Jobs();
    for (const std::string& job : asked) request.add_unsettled_jobs(job);
    for (const auto& record : request.records()) {
      if (UnsettledRecords::Holds(record)) asked.insert(record.job_id());
    }
    furnace::v1::TelemetryAck ack;
    grpc::ClientContext context;
    SetDeadline(&context, options_.rpc_timeout_s);
    const grpc::Status status = stub_->PushTelemetry(&context, request, &ack);
    if (status.ok()) {
      last_settle_query_s_ = clock_.MonotonicSeconds();
      // Its step records are held until an answer says their steps are stored (this one, or a
      // later one: the answer is of what was stored before they came).
      unsettled_.Add(std::vector<furnace::v1::TelemetryRecord>(request.records().begin(),
                                                               request.records().end()));
      unsettled_.Settle(ack, asked);
      if (const uint64_t dropped = unsettled_.dropped(); dropped > held_dropped_said_) {
        // Past the bounds: a controller restart now would lose those steps' records.
        const double now = clock_.MonotonicSeconds();
        if (now - held_dropped_warned_s_ >= 60) {
          held_dropped_warned_s_ = now;
          spdlog::warn(
              "let go of {} pushed step record(s) the controller has not stored yet "
              "(--telemetry-capacity / --telemetry-bytes); if it restarts now, their steps are "
              "stored without them (said at most once a minute)",
              dropped - held_dropped_said_);
          held_dropped_said_ = dropped;
        }
      }
    }
    return status;
  };
  bool pushed = false;
  // Several batches per tick at most, so a backlog drains quickly after a controller restart.
  for (int batch = 0; batch < 10; ++batch) {
    std::vector<furnace::v1::TelemetryRecord> records = telemetry_.Take(kMaxBatch, kMaxBatchBytes);
    const uint64_t dropped = telemetry_.TakeDropped();
    if (records.empty() && dropped == 0) break;
    furnace::v1::TelemetryBatch request;
    request.set_dropped(dropped);
    for (auto& record : records) *request.add_records() = std::move(record);
    const grpc::Status status = push(request);
    pushed = true;
    if (!status.ok() && !PushWorthRetrying(status.error_code())) {
      NoteRefused("telemetry", request.records_size(), status.error_message());
      telemetry_.AddDropped(dropped + static_cast<uint64_t>(request.records_size()));
      break;  // the rest at the next flush (not a burst of count-only batches now)
    }
    if (!status.ok()) {
      std::vector<furnace::v1::TelemetryRecord> back(request.records().begin(),
                                                     request.records().end());
      telemetry_.PutBack(std::move(back));
      telemetry_.AddDropped(dropped);
      return false;
    }
  }
  // Nothing new to push, but records held: ask how far their steps are stored, now and then
  // (kSettleQueryS; a job's last steps settle only after it ends).
  if (!pushed && unsettled_.size() > 0 &&
      clock_.MonotonicSeconds() - last_settle_query_s_ >= kSettleQueryS) {
    furnace::v1::TelemetryBatch request;
    const grpc::Status status = push(request);
    if (!status.ok() && PushWorthRetrying(status.error_code())) return false;
  }
  for (int batch = 0; batch < 10; ++batch) {
    std::vector<furnace::v1::LogLine> lines = logs_.Take(kMaxBatch, kMaxBatchBytes);
    if (const uint64_t dropped = logs_.TakeDropped(); dropped > 0) {
      spdlog::warn(
          "dropped {} rank log line(s) the controller could not take in time (they are "
          "still in the local log files)",
          dropped);
    }
    if (lines.empty()) break;
    furnace::v1::LogBatch request;
    request.set_worker_id(options_.worker_id);
    for (auto& line : lines) *request.add_lines() = std::move(line);
    furnace::v1::Ack ack;
    grpc::ClientContext context;
    SetDeadline(&context, options_.rpc_timeout_s);
    const grpc::Status status = stub_->PushLogs(&context, request, &ack);
    if (!status.ok() && !PushWorthRetrying(status.error_code())) {
      NoteRefused("logs", request.lines_size(), status.error_message());
      break;
    }
    if (!status.ok()) {
      logs_.PutBack(
          std::vector<furnace::v1::LogLine>(request.lines().begin(), request.lines().end()));
      return false;
    }
  }
  return true;
}

void Agent::NoteRefused(const char* what, int count, const std::string& why) {
  constexpr double kRefusalWarnS = 30;
  (std::string_view(what) == "logs" ? refused_lines_ : refused_records_) +=
      static_cast<uint64_t>(count);
  const double now = clock_.MonotonicSeconds();
  if (now - refusal_warned_s_ < kRefusalWarnS) return;
  refusal_warned_s_ = now;
  spdlog::warn(
      "the controller refused pushes for good ({}): dropped {} telemetry record(s) and {} rank "
      "log line(s) since the last such warning (the lines are still in the local log files; "
      "said at most every {:.0f} s)",
      why, std::exchange(refused_records_, 0), std::exchange(refused_lines_, 0), kRefusalWarnS);
}

std::vector<furnace::v1::RunningRank> Agent::Running() const {
  std::lock_guard<std::mutex> lock(mu_);
  return RunningLocked();
}

std::vector<furnace::v1::RunningRank> Agent::RunningLocked() const {
  std::vector<furnace::v1::RunningRank> running;
  for (const auto& [key, entry] : ranks_) {
    if (entry.exited || entry.supervisor == nullptr) continue;
    furnace::v1::RunningRank& r = running.emplace_back();
    r.set_job_id(entry.task.job_id());
    r.set_attempt(entry.task.attempt());
    r.set_rank(entry.task.rank());
    r.set_pid(entry.pid);
    if (const std::optional<double> silent = entry.supervisor->SilentSeconds()) {
      r.set_silent_s(*silent);
    }
  }
  return running;
}

size_t Agent::PendingReports() const {
  std::lock_guard<std::mutex> lock(mu_);
  return reports_.size();
}

void Agent::ReapFinished() {
  std::vector<std::unique_ptr<RankSupervisor>> finished;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [key, entry] : ranks_) {
      // The entry itself stays, so a repeated start of the same rank is recognised.
      if (entry.supervisor != nullptr && entry.supervisor->done()) {
        finished.push_back(std::move(entry.supervisor));
      }
    }
  }
  finished.clear();  // joins threads whose exit sinks already returned
}

void Agent::SweepRankLogsNow() {
  // Held across each removal, so HandleStart (which opens a rank's log under mu_) cannot start a
  // rank of that job in between: a job with a rank running here is never swept.
  const RankLogSweep sweep =
      SweepRankLogs((std::filesystem::path(options_.work_dir) / "logs").string(),
                    options_.keep_rank_logs_s, clock_.UnixSeconds(),
                    [this](const std::string& job_dir) {  // mu_ held
                      for (const auto& [key, entry] : ranks_) {
                        if (!entry.exited && SafeName(entry.task.job_id()) == job_dir) return true;
                      }
                      return false;
                    },
                    &mu_);
  if (sweep.removed > 0) {
    spdlog::info(
        "removed the rank logs of {} job(s) unchanged for over {:.0f} s "
        "(--keep-rank-logs)",
        sweep.removed, options_.keep_rank_logs_s);
  }
}

void Agent::SweepLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!shutting_down_) {
    cv_.wait_for(lock, Seconds(kRankLogSweepEveryS), [&] { return shutting_down_; });
    if (shutting_down_) return;
    lock.unlock();
    SweepRankLogsNow();
    lock.lock();
  }
}

void Agent::StopAllRanks() {
  std::vector<RankSupervisor*> running;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [key, entry] : ranks_) {
      if (entry.supervisor != nullptr && !entry.exited) {
        // Not a failure: a train rank first gets the job's checkpoint.stop_grace_s to stop after
        // its step with a checkpoint (the controller, told the agent leaves, asks the same of
        // the attempt's other ranks).
        entry.supervisor->Stop(options_.shutdown_grace_s, "the worker agent is shutting down",
                               std::min(furnace::v1::StopCheckpointGraceS(entry.task.spec()),
                                        std::max(0.0, options_.max_stop_grace_s)));
        running.push_back(entry.supervisor.get());
      }
    }
  }
  // Only this thread removes supervisors from ranks_ (ReapFinished), so the pointers stay valid.
  for (RankSupervisor* supervisor : running) supervisor->Wait();
}

}  // namespace furnace::worker
