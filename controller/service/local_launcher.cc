#include "controller/service/local_launcher.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "runtime/base/clock.h"
#include "spdlog/spdlog.h"

namespace furnace::controller {
namespace {

namespace fs = std::filesystem;

// True when `pid` is a furnace-worker for `slot` (guards against pid reuse after a reboot), and,
// when `state_dir` is given, one whose work directory lies in it (a worker of this controller's,
// not of another one's on the same host with the same slot).
bool IsOurWorker(pid_t pid, uint32_t slot, const std::string& state_dir = "") {
  if (pid <= 0 || kill(pid, 0) != 0) return false;
  std::ifstream in(absl::StrCat("/proc/", pid, "/cmdline"));
  std::string cmdline((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  for (char& c : cmdline) {
    if (c == '\0') c = ' ';
  }
  return cmdline.find("furnace-worker") != std::string::npos &&
         cmdline.find(absl::StrCat("--slot ", slot, " ")) != std::string::npos &&
         (state_dir.empty() ||
          cmdline.find(absl::StrCat("--work-dir ", state_dir, "/workers/")) != std::string::npos);
}

}  // namespace

std::string DefaultWorkerBinary() {
  std::error_code ec;
  fs::path self = fs::read_symlink("/proc/self/exe", ec);
  if (ec) return "furnace-worker";
  return (self.parent_path() / "furnace-worker").string();
}

LocalLauncher::LocalLauncher(const LocalLauncherOptions& options, Controller& controller)
    : options_(options), controller_(controller), slots_(options.workers) {}

LocalLauncher::~LocalLauncher() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
}

void LocalLauncher::Start() {
  for (const auto& [slot, pid] : controller_.LocalWorkers()) {
    if (!IsOurWorker(pid, slot)) continue;
    if (slot < slots_.size()) {
      slots_[slot].pid = pid;
      slots_[slot].adopted = true;
      spdlog::info("local worker slot {}: adopted running pid {}", slot, pid);
    } else if (IsOurWorker(pid, slot, options_.state_dir)) {
      // Started by an earlier run with more --local-workers: this run neither watches nor stops
      // it, so it goes now (SIGTERM: its agent says it is leaving and stops its ranks).
      spdlog::info("local worker slot {} (pid {}): beyond --local-workers {}, stopping it", slot,
                   pid, slots_.size());
      kill(pid, SIGTERM);
    }
  }
  for (uint32_t slot = 0; slot < slots_.size(); ++slot) {
    if (slots_[slot].pid < 0) slots_[slot].pid = Spawn(slot);
  }
  thread_ = std::thread([this] { Monitor(); });
}

pid_t LocalLauncher::Spawn(uint32_t slot) {
  const fs::path dir = fs::path(options_.state_dir) / "workers" / absl::StrCat("slot-", slot);
  std::error_code ec;
  fs::create_directories(dir, ec);
  // The worker refuses a work dir others may write (worker/agent.h, CheckWorkDir), which a
  // umask of 002 would give this one.
  fs::permissions(dir, fs::perms::owner_all, fs::perm_options::replace, ec);
  const std::string log =
      (fs::path(options_.state_dir) / "logs" / absl::StrCat("worker-", slot, ".log")).string();
  std::vector<std::string> args = {options_.worker_binary,
                                   "--controller",
                                   options_.controller_address,
                                   "--slot",
                                   std::to_string(slot),
                                   "--host",
                                   "127.0.0.1",
                                   "--work-dir",
                                   dir.string(),
                                   "--log-level",
                                   options_.log_level,
                                   "--max-stop-grace",
                                   absl::StrCat(options_.rank_checkpoint_grace_s),
                                   "--shutdown-grace",
                                   absl::StrCat(options_.rank_term_grace_s)};
  args.insert(args.end(), options_.extra_args.begin(), options_.extra_args.end());
  for (auto [flag, root] : {std::pair{"--data-root", &options_.data_root},
                            std::pair{"--checkpoint-root", &options_.checkpoint_root}}) {
    if (!root->empty()) args.insert(args.end(), {flag, *root});
  }
  // Everything the child needs is prepared before fork: between fork and exec only
  // async-signal-safe calls.
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  sigset_t all;
  sigemptyset(&all);
  const pid_t pid = fork();
  if (pid == 0) {
    setsid();  // not in the controller's process group: a Ctrl-C reaches the controller only
    sigprocmask(SIG_SETMASK, &all, nullptr);
    signal(SIGPIPE, SIG_DFL);
    const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) {
      dup2(fd, STDOUT_FILENO);
      dup2(fd, STDERR_FILENO);
      if (fd > STDERR_FILENO) close(fd);
    }
    const int null_fd = open("/dev/null", O_RDONLY);
    if (null_fd >= 0) {
      dup2(null_fd, STDIN_FILENO);
      if (null_fd > STDIN_FILENO) close(null_fd);
    }
    close_range(3, ~0U, 0);  // no controller socket or database leaks into a worker
    execv(argv[0], argv.data());
    _exit(127);
  }
  if (pid < 0) {
    spdlog::error("local worker slot {}: fork failed", slot);
    return -1;
  }
  spdlog::info("local worker slot {}: started pid {} (log {})", slot, pid, log);
  if (absl::Status s = controller_.RecordLocalWorker(slot, pid); !s.ok()) {
    spdlog::error("local worker slot {}: pid not recorded: {}", slot, s.ToString());
  }
  return pid;
}

bool LocalLauncher::Alive(uint32_t slot) {
  Slot& s = slots_[slot];
  if (s.pid <= 0) return false;
  if (s.adopted) return IsOurWorker(s.pid, slot);  // not our child: also guards pid reuse
  int status = 0;
  const pid_t r = waitpid(s.pid, &status, WNOHANG);
  if (r == 0) return true;
  if (r == s.pid) {
    if (WIFSIGNALED(status)) {
      spdlog::warn("local worker slot {} (pid {}) killed by signal {}", slot, s.pid,
                   WTERMSIG(status));
    } else {
      spdlog::warn("local worker slot {} (pid {}) exited with code {}", slot, s.pid,
                   WEXITSTATUS(status));
    }
  }
  return false;
}

void LocalLauncher::Monitor() {
  constexpr double kRespawnDelayS = 1.0;
  while (!stop_) {
    const double now = RealClock().MonotonicSeconds();
    for (uint32_t slot = 0; slot < slots_.size(); ++slot) {
      Slot& s = slots_[slot];
      if (s.pid > 0 && !Alive(slot)) {
        s.pid = -1;
        s.adopted = false;
        s.restart_at = now + kRespawnDelayS;
      }
      if (s.pid < 0 && now >= s.restart_at) {
        s.pid = Spawn(slot);
        // A failed fork is tried again after the same delay, not at every tick.
        if (s.pid < 0) s.restart_at = now + kRespawnDelayS;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

double LocalLauncher::StopTimeoutS() const {
  // The agent's --shutdown-flush (3 s by default) and a margin for its own exit.
  constexpr double kAgentExitS = 8;
  return options_.rank_checkpoint_grace_s + options_.rank_term_grace_s + kAgentExitS;
}

void LocalLauncher::Stop(const std::function<bool()>& hurry) {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
  for (const Slot& s : slots_) {
    if (s.pid > 0) kill(s.pid, SIGTERM);
  }
  const double timeout = StopTimeoutS();
  const double deadline = RealClock().MonotonicSeconds() + timeout;
  bool hurried = false;
  for (uint32_t slot = 0; slot < slots_.size(); ++slot) {
    Slot& s = slots_[slot];
    while (s.pid > 0 && !hurried && RealClock().MonotonicSeconds() < deadline) {
      if (!Alive(slot)) {
        s.pid = -1;
        break;
      }
      hurried = hurry();
      if (!hurried) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    if (s.pid > 0) {
      if (hurried) {
        spdlog::warn("local worker slot {} (pid {}): SIGKILL, asked to stop at once", slot, s.pid);
      } else {
        spdlog::warn("local worker slot {} (pid {}) did not stop in {:.0f} s: SIGKILL", slot, s.pid,
                     timeout);
      }
      kill(s.pid, SIGKILL);
      if (!s.adopted) waitpid(s.pid, nullptr, 0);
      s.pid = -1;
    }
  }
}

}  // namespace furnace::controller
