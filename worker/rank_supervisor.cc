#include "worker/rank_supervisor.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "runtime/base/utf8.h"
#include "spdlog/spdlog.h"

namespace furnace::worker {
namespace {

constexpr int kPollIntervalMs = 50;
constexpr size_t kMaxLineBytes = 64 * 1024;
constexpr double kDrainAfterExitS = 1.0;
// A process SIGKILL has not ended by then is stuck in the kernel (rank_supervisor.h).
constexpr double kUnkillableS = 30.0;
// How long the exec of a rank may take (the child's execve, not the rank's start: the exec-error
// pipe closes when the new image replaces the child, before its libraries load). Longer means the
// program's file system hangs (a stale NFS mount): the caller holds the agent's lock meanwhile, and
// the controller calls an agent lost after 10 s without a heartbeat.
constexpr double kExecTimeoutS = 5.0;
enum StreamIndex { kStdout = 0, kStderr = 1, kTelemetry = 2 };

std::string SignalName(int signal) {
  const char* abbrev = sigabbrev_np(signal);
  return abbrev != nullptr ? absl::StrCat("SIG", abbrev) : absl::StrCat("signal ", signal);
}

void CloseFd(int* fd) {
  if (*fd >= 0) ::close(*fd);
  *fd = -1;
}

absl::Status ErrnoStatus(int err, const std::string& what) {
  const std::string message = absl::StrCat(what, ": ", std::strerror(err));
  switch (err) {
    case ENOENT:
      return absl::NotFoundError(message);
    case EACCES:
    case EPERM:
      return absl::PermissionDeniedError(message);
    default:
      return absl::InternalError(message);
  }
}

// The memory.events file of the cgroup (v2) `pid` is in, or "" when there is none to read.
std::string CgroupEventsPath(int pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/cgroup"));
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("0::", 0) == 0) {
      std::string path = absl::StrCat("/sys/fs/cgroup", line.substr(3), "/memory.events");
      if (std::filesystem::exists(path)) return path;
    }
  }
  return "";
}

std::optional<uint64_t> ReadOomKills(const std::string& events_path) {
  if (events_path.empty()) return std::nullopt;
  std::ifstream in(events_path);
  std::string key;
  uint64_t value = 0;
  while (in >> key >> value) {
    if (key == "oom_kill") return value;
  }
  return std::nullopt;
}

// Between fork and exec only async-signal-safe calls: no allocation, no locks, no logging.
[[noreturn]] void ExecChild(pid_t parent, const int (&sources)[4], int error_fd,
                            char* const* argv) {
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent) _exit(127);  // the agent died before prctl took effect
  setpgid(0, 0);
  // Default actions first, then the mask cleared: a signal in between never runs the agent's
  // handler in the child (it would tell the agent to shut down).
  struct sigaction dfl;
  memset(&dfl, 0, sizeof(dfl));
  dfl.sa_handler = SIG_DFL;
  for (int sig = 1; sig < NSIG; ++sig) {
    if (sig != SIGKILL && sig != SIGSTOP) sigaction(sig, &dfl, nullptr);
  }
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
  // Lift every source above the targets first, so no dup2 clobbers a source still needed.
  int high[4];
  for (int i = 0; i < 4; ++i) high[i] = fcntl(sources[i], F_DUPFD, 100);
  int err_high = fcntl(error_fd, F_DUPFD_CLOEXEC, 100);
  for (int i = 0; i < 4; ++i) {
    if (high[i] < 0 || dup2(high[i], i) < 0) {
      int err = errno;
      (void)!write(err_high, &err, sizeof(err));
      _exit(127);
    }
  }
  if (syscall(SYS_close_range, 4u, static_cast<unsigned>(err_high - 1), 0u) != 0 ||
      syscall(SYS_close_range, static_cast<unsigned>(err_high + 1), ~0u, 0u) != 0) {
    for (int fd = 4; fd < 4096; ++fd) {
      if (fd != err_high) close(fd);
    }
  }
  execv(argv[0], argv);
  int err = errno;
  (void)!write(err_high, &err, sizeof(err));
  _exit(127);
}

// What the kernel says about a process that went silent or did not end: stopped (SIGSTOP, a
// debugger), stuck in uninterruptible I/O, ended but held by a tracer, or nothing unusual ("").
std::string ProcessStateNote(int pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
  std::string stat;
  std::getline(in, stat);
  const size_t paren = stat.rfind(')');
  if (paren == std::string::npos || paren + 2 >= stat.size()) return "";
  switch (stat[paren + 2]) {
    case 'T':
      return "; the process is stopped (state T: SIGSTOP or a job-control signal)";
    case 't':
      return "; the process is stopped by a debugger (state t)";
    case 'D':
      return "; the process is in uninterruptible I/O (state D)";
    case 'Z':
      // Ended, but not reported to its parent: a tracer that is not the parent (a debugger,
      // strace) is told first and has not let it go.
      return "; the process has ended, but a tracer (a debugger, strace) holds it (state Z)";
    default:
      return "";
  }
}

constexpr double kFrozenFactor = 1.5;

}  // namespace

double StartTimeoutS(const furnace::v1::RankTask& task) {
  constexpr double kDefaultStartTimeoutS = 60;
  const double s = task.spec().recovery().start_timeout_s();
  return s > 0 ? s : kDefaultStartTimeoutS;
}

double FrozenTimeoutS(double hang_timeout_s) { return kFrozenFactor * hang_timeout_s; }

absl::StatusOr<std::unique_ptr<RankSupervisor>> RankSupervisor::Start(RankLaunch launch,
                                                                      RankSinks sinks,
                                                                      const Clock& clock) {
  if (launch.argv.empty()) return absl::InvalidArgumentError("rank command is empty");
  std::unique_ptr<RankSupervisor> supervisor(
      new RankSupervisor(std::move(launch), std::move(sinks), clock));
  std::promise<absl::Status> started;
  std::future<absl::Status> result = started.get_future();
  supervisor->thread_ = std::thread(&RankSupervisor::ThreadMain, supervisor.get(), &started);
  absl::Status status = result.get();
  if (!status.ok()) {
    supervisor->thread_.join();
    return status;
  }
  return supervisor;
}

RankSupervisor::RankSupervisor(RankLaunch launch, RankSinks sinks, const Clock& clock)
    : launch_(std::move(launch)), sinks_(std::move(sinks)), clock_(clock) {}

RankSupervisor::~RankSupervisor() {
  if (thread_.joinable()) {
    if (!done_.load()) Stop(0, "the agent dropped the rank");
    thread_.join();
  }
  CloseFd(&log_fd_);
}

void RankSupervisor::Stop(double grace_s, const std::string& reason, double checkpoint_grace_s) {
  std::lock_guard<std::mutex> lock(mu_);
  const double term_at = clock_.MonotonicSeconds() + std::max(0.0, checkpoint_grace_s);
  const double deadline = term_at + std::max(0.0, grace_s);
  if (!stop_requested_) {
    stop_requested_ = true;
    stop_reason_ = reason;
  }
  checkpoint_first_ = checkpoint_first_ || checkpoint_grace_s > 0;
  if (!term_at_s_ || term_at < *term_at_s_) term_at_s_ = term_at;
  if (!stop_deadline_s_ || deadline < *stop_deadline_s_) stop_deadline_s_ = deadline;
}

void RankSupervisor::DetachSinks() {
  std::lock_guard<std::mutex> lock(sinks_mu_);
  sinks_detached_ = true;
}

void RankSupervisor::Wait() {
  {
    std::unique_lock<std::mutex> lock(mu_);
    settled_cv_.wait(lock, [&] { return settled_; });
  }
  if (done_.load() && thread_.joinable()) thread_.join();
}

std::optional<furnace::v1::RankReport> RankSupervisor::exit_report() const {
  std::lock_guard<std::mutex> lock(mu_);
  return report_;
}

void RankSupervisor::ThreadMain(std::promise<absl::Status>* started) {
  absl::Status status = Spawn();
  const bool ok = status.ok();
  started->set_value(std::move(status));  // `started` is gone after this line
  if (ok) Supervise();
}

absl::Status RankSupervisor::Spawn() {
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(launch_.log_path).parent_path(), ec);
  log_fd_ = ::open(launch_.log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (log_fd_ < 0) return ErrnoStatus(errno, absl::StrCat("cannot open ", launch_.log_path));

  int pipes[3][2] = {{-1, -1}, {-1, -1}, {-1, -1}};
  int exec_error[2] = {-1, -1};
  int devnull = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  // Closes everything opened so far; for the error paths before the fork.
  auto fail = [&](int err, const std::string& what) {
    for (auto& p : pipes) {
      CloseFd(&p[0]);
      CloseFd(&p[1]);
    }
    CloseFd(&exec_error[0]);
    CloseFd(&exec_error[1]);
    CloseFd(&devnull);
    CloseFd(&log_fd_);
    return ErrnoStatus(err, what);
  };
  if (devnull < 0) return fail(errno, "cannot open /dev/null");
  for (auto& p : pipes) {
    if (pipe2(p, O_CLOEXEC) != 0) return fail(errno, "pipe2");
  }
  if (pipe2(exec_error, O_CLOEXEC) != 0) return fail(errno, "pipe2");

  std::vector<char*> argv;
  for (const std::string& arg : launch_.argv) argv.push_back(const_cast<char*>(arg.c_str()));
  argv.push_back(nullptr);
  const int sources[4] = {devnull, pipes[kStdout][1], pipes[kStderr][1], pipes[kTelemetry][1]};

  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid == 0) ExecChild(parent, sources, exec_error[1], argv.data());
  const int fork_errno = errno;
  ::close(devnull);
  ::close(exec_error[1]);
  for (int i = 0; i < 3; ++i) {
    ::close(pipes[i][1]);
    streams_[i].fd = pipes[i][0];
  }
  if (pid < 0) {
    ::close(exec_error[0]);
    for (Stream& s : streams_) CloseFd(&s.fd);
    CloseFd(&log_fd_);
    return ErrnoStatus(fork_errno, "fork");
  }
  // Set the group from this side too, so signals to -pid work even before the child runs.
  setpgid(pid, pid);
  int child_errno = 0;
  ssize_t n = -1;
  // The real clock, whatever the supervisor's: this bounds a system call, not the rank.
  const auto exec_deadline = std::chrono::steady_clock::now() +
                             std::chrono::milliseconds(static_cast<int>(kExecTimeoutS * 1000));
  bool exec_hung = false;
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                          exec_deadline - std::chrono::steady_clock::now())
                          .count();
    if (left <= 0) {
      exec_hung = true;
      break;
    }
    pollfd pfd{exec_error[0], POLLIN, 0};
    const int ready = ::poll(&pfd, 1, static_cast<int>(left));
    if (ready < 0 && errno == EINTR) continue;
    if (ready == 0) continue;  // the deadline is checked above
    do {
      n = ::read(exec_error[0], &child_errno, sizeof(child_errno));
    } while (n < 0 && errno == EINTR);
    break;
  }
  ::close(exec_error[0]);
  if (exec_hung) {
    // SIGKILL is delivered once the exec leaves the kernel; reaped if that happens soon, otherwise
    // the process is left to the kernel (a zombie of this agent until it exits).
    ::kill(-pid, SIGKILL);
    ::kill(pid, SIGKILL);
    int status;
    for (int i = 0; i < 20 && waitpid(pid, &status, WNOHANG) == 0; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    for (Stream& s : streams_) CloseFd(&s.fd);
    CloseFd(&log_fd_);
    return absl::DeadlineExceededError(absl::StrFormat(
        "the exec of %s did not complete within %.0f s (its file system may hang: a stale NFS "
        "mount?); the process (pid %d) was killed",
        launch_.argv[0], kExecTimeoutS, pid));
  }
  if (n == static_cast<ssize_t>(sizeof(child_errno))) {
    int status;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    for (Stream& s : streams_) CloseFd(&s.fd);
    CloseFd(&log_fd_);
    return ErrnoStatus(child_errno, absl::StrCat("cannot execute ", launch_.argv[0]));
  }
  for (Stream& s : streams_) fcntl(s.fd, F_SETFL, fcntl(s.fd, F_GETFL) | O_NONBLOCK);
  pid_ = pid;
  cgroup_events_path_ = CgroupEventsPath(pid);
  oom_kills_at_start_ = ReadOomKills(cgroup_events_path_);
  return absl::OkStatus();
}

std::optional<double> RankSupervisor::SilentSeconds() const {
  if (!watchdog_heard_.load(std::memory_order_relaxed) || done_.load()) return std::nullopt;
  return std::max(
      0.0, clock_.MonotonicSeconds() - last_record_shared_s_.load(std::memory_order_relaxed));
}

void RankSupervisor::KillGroup(int signal) {
  if (::kill(-pid_, signal) != 0 && errno == ESRCH) ::kill(pid_, signal);
  // The clock of the early report of a rank SIGKILL cannot end (rank_supervisor.h), whichever
  // path killed it: a stop past its grace, the silence watchdog, or the rank's own watchdog.
  if (signal == SIGKILL && !killed_at_s_) killed_at_s_ = clock_.MonotonicSeconds();
}

void RankSupervisor::Supervise() {
  last_record_s_ = clock_.MonotonicSeconds();
  bool exited = false;
  std::optional<double> drain_until;
  while (true) {
    pollfd fds[3];
    int index[3];
    nfds_t n = 0;
    for (int i = 0; i < 3; ++i) {
      if (streams_[i].fd >= 0) {
        fds[n] = {streams_[i].fd, POLLIN, 0};
        index[n++] = i;
      }
    }
    if (exited && (n == 0 || clock_.MonotonicSeconds() >= *drain_until)) break;
    ::poll(fds, n, kPollIntervalMs);
    for (nfds_t k = 0; k < n; ++k) {
      if (fds[k].revents != 0) ReadStream(index[k]);
    }
    if (exited) continue;

    // Notice the exit without reaping, so the group id stays reserved while we clean up.
    siginfo_t info;
    memset(&info, 0, sizeof(info));
    if (waitid(P_PID, pid_, &info, WEXITED | WNOHANG | WNOWAIT) == 0 && info.si_pid == pid_) {
      exited = true;
      {
        std::lock_guard<std::mutex> lock(mu_);
        stopped_before_exit_ = stop_requested_;
      }
      if (failed_unix_ == 0) failed_unix_ = clock_.UnixSeconds();
      KillGroup(SIGKILL);  // whatever the rank left behind in its group
      drain_until = clock_.MonotonicSeconds() + kDrainAfterExitS;
      continue;
    }

    const double now = clock_.MonotonicSeconds();
    bool stop_requested, checkpoint_first;
    std::optional<double> kill_at, term_at;
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_requested = stop_requested_;
      checkpoint_first = checkpoint_first_;
      kill_at = stop_deadline_s_;
      term_at = term_at_s_;
    }
    if (stop_requested && checkpoint_first && !usr1_sent_ && !term_sent_) {
      usr1_sent_ = true;
      ::kill(pid_, SIGUSR1);  // the rank alone: its group's other processes have no use for it
    }
    if (stop_requested && !term_sent_ && (!term_at || now >= *term_at)) {
      term_sent_ = true;
      KillGroup(SIGTERM);
    }
    if (kill_at && now >= *kill_at) KillGroup(SIGKILL);
    if (killed_at_s_ && !reported_ && now - *killed_at_s_ >= kUnkillableS) {
      // Still not ended: report it now (the job recovers), and keep waiting to reap it.
      {
        std::lock_guard<std::mutex> lock(mu_);
        stopped_before_exit_ = stop_requested_;
      }
      furnace::v1::RankReport report = Classify(SIGKILL);  // "killed by signal 9"
      report.set_reason(absl::StrFormat(
          "%s; it did not end %.0f s after SIGKILL and keeps its slot until the kernel lets it "
          "go (pid %d)%s",
          report.reason(), now - *killed_at_s_, pid_, ProcessStateNote(pid_)));
      {
        std::lock_guard<std::mutex> lock(mu_);
        report_ = report;
      }
      reported_ = true;
      stuck_.store(true);
      spdlog::error("rank {} of job {}: {}", launch_.rank, launch_.job_id, report.reason());
      CallSinks([&](const RankSinks& sinks) {
        if (sinks.on_exit) sinks.on_exit(report);
      });
      Settle();
    }
    const double silence_limit = has_watchdog_ ? FrozenTimeoutS(launch_.hang_timeout_s)
                                 : !any_record_
                                     ? std::max(launch_.hang_timeout_s, launch_.start_timeout_s)
                                     : launch_.hang_timeout_s;
    if (!hung_ && !stop_requested && launch_.hang_timeout_s > 0 &&
        now - last_record_s_ > silence_limit) {
      hung_ = true;
      hang_for_s_ = now - last_record_s_;
      failed_unix_ = clock_.UnixSeconds() - hang_for_s_;
      hang_reason_ = ProcessStateNote(pid_);  // read before the kill changes it
      KillGroup(SIGKILL);
    }
  }
  for (int i = 0; i < 2; ++i) {
    if (!streams_[i].partial.empty()) EmitLine(std::exchange(streams_[i].partial, ""));
  }
  for (Stream& s : streams_) CloseFd(&s.fd);

  int status = 0;
  while (waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
  }
  CloseFd(&log_fd_);
  if (!reported_) {
    furnace::v1::RankReport report = Classify(status);
    {
      std::lock_guard<std::mutex> lock(mu_);
      report_ = report;
    }
    CallSinks([&](const RankSinks& sinks) {
      if (sinks.on_exit) sinks.on_exit(report);
    });
  }
  stuck_.store(false);
  done_.store(true);
  Settle();
}

void RankSupervisor::Settle() {
  std::lock_guard<std::mutex> lock(mu_);
  settled_ = true;
  settled_cv_.notify_all();
}

void RankSupervisor::ReadStream(int i) {
  Stream& stream = streams_[i];
  char buffer[16384];
  // Bounded, so a rank that writes faster than we read cannot starve the watchdog.
  for (int reads = 0; reads < 64 && stream.fd >= 0; ++reads) {
    const ssize_t n = ::read(stream.fd, buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      if (errno != EAGAIN && errno != EWOULDBLOCK) CloseFd(&stream.fd);
      return;
    }
    if (n == 0) {  // EOF: every writer is gone
      if (!stream.partial.empty()) EmitLine(std::exchange(stream.partial, ""));
      CloseFd(&stream.fd);
      return;
    }
    const std::string_view chunk(buffer, static_cast<size_t>(n));
    if (i == kTelemetry) {
      if (telemetry_corrupt_) continue;  // keep draining so the rank never blocks on the pipe
      decoder_.Feed(chunk);
      furnace::v1::TelemetryRecord record;
      while (true) {
        absl::StatusOr<bool> next = decoder_.Next(&record);
        if (!next.ok()) {
          telemetry_corrupt_ = true;
          EmitLine(absl::StrCat("[furnace-worker] ", next.status().message(),
                                "; ignoring the rest of the rank's telemetry"));
          break;
        }
        if (!*next) break;
        last_record_s_ = clock_.MonotonicSeconds();
        last_record_shared_s_.store(last_record_s_, std::memory_order_relaxed);
        any_record_ = true;
        if (record.has_watchdog()) {
          has_watchdog_ = true;
          watchdog_heard_.store(true, std::memory_order_relaxed);
          OnWatchdogRecord(record.watchdog());
          record = furnace::v1::TelemetryRecord();
          continue;
        }
        record.set_job_id(launch_.job_id);
        record.set_attempt(launch_.attempt);
        record.set_rank(launch_.rank);
        last_step_ = record.step();
        // The rank's latest word (a final "why I exit"); a later record without one clears it,
        // so an exit is not explained by something said earlier (e.g. the restore account).
        last_message_ = record.message();
        CallSinks([&](const RankSinks& sinks) {
          if (sinks.on_telemetry) sinks.on_telemetry(std::move(record));
        });
        record = furnace::v1::TelemetryRecord();
      }
      continue;
    }
    size_t start = 0;
    while (start < chunk.size()) {
      const size_t newline = chunk.find('\n', start);
      if (newline == std::string_view::npos) {
        stream.partial.append(chunk.substr(start));
        if (stream.partial.size() >= kMaxLineBytes) EmitLine(std::exchange(stream.partial, ""));
        break;
      }
      stream.partial.append(chunk.substr(start, newline - start));
      EmitLine(std::exchange(stream.partial, ""));
      start = newline + 1;
    }
  }
}

void RankSupervisor::OnWatchdogRecord(const furnace::v1::RankWatchdogRecord& watchdog) {
  if (watchdog.kind() != furnace::v1::RankWatchdogRecord::KIND_HUNG || hung_) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_requested_) return;  // being stopped anyway: its end is a stop, not a hang
  }
  hung_ = true;
  hang_from_rank_ = true;
  // Waiting on its peers: in a collective its stream has reached (one still queued behind the
  // rank's own device work means this rank is the one stuck).
  hang_in_collective_ = watchdog.has_collective() && !watchdog.collective().queued();
  hang_reason_ = watchdog.reason();
  failed_unix_ = clock_.UnixSeconds() - watchdog.phase_s();
  EmitLine(
      absl::StrCat("[furnace-worker] the rank's watchdog: ", watchdog.reason(), "; killing it"));
  KillGroup(SIGKILL);
}

void RankSupervisor::EmitLine(std::string_view line) {
  if (log_fd_ >= 0) {
    std::string with_newline(line);
    with_newline.push_back('\n');
    size_t written = 0;
    while (written < with_newline.size()) {
      const ssize_t n =
          ::write(log_fd_, with_newline.data() + written, with_newline.size() - written);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;  // a full disk loses local log lines, never the rank
      written += static_cast<size_t>(n);
    }
  }
  CallSinks([&](const RankSinks& sinks) {
    if (!sinks.on_log) return;
    furnace::v1::LogLine log;
    log.set_job_id(launch_.job_id);
    log.set_attempt(launch_.attempt);
    log.set_rank(launch_.rank);
    // The local log keeps the rank's bytes; the controller's copy must be valid UTF-8 (protobuf
    // refuses the whole batch otherwise, and the agent drops it), each invalid byte a '?'.
    log.set_text(FirstInvalidUtf8(line) ? SanitizeUtf8(line, std::numeric_limits<size_t>::max())
                                        : std::string(line));
    sinks.on_log(std::move(log));
  });
}

furnace::v1::RankReport RankSupervisor::Classify(int wait_status) {
  furnace::v1::RankReport report;
  report.set_job_id(launch_.job_id);
  report.set_attempt(launch_.attempt);
  report.set_rank(launch_.rank);
  report.set_event(furnace::v1::RANK_EXITED);
  report.set_pid(pid_);
  report.set_unix_time(clock_.UnixSeconds());

  std::string how;
  int code = -1;
  int signal = 0;
  if (WIFEXITED(wait_status)) {
    code = WEXITSTATUS(wait_status);
    report.set_exit_code(code);
    how = absl::StrCat("exited with code ", code);
  } else if (WIFSIGNALED(wait_status)) {
    signal = WTERMSIG(wait_status);
    report.set_signal(signal);
    how = absl::StrCat("killed by signal ", signal, " (", SignalName(signal), ")");
  }
  const std::string said = last_message_.empty() ? "" : absl::StrCat(": ", last_message_);

  std::string stop_reason;
  bool stop_requested;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_requested = stopped_before_exit_;
    stop_reason = stop_reason_;
  }
  if (hung_ && hang_from_rank_) {
    report.set_exit_kind(furnace::v1::EXIT_KIND_HANG);
    report.set_reason(hang_reason_);
    report.set_hang_in_collective(hang_in_collective_);
  } else if (hung_) {
    report.set_exit_kind(furnace::v1::EXIT_KIND_HANG);
    const std::string last =
        last_step_ ? absl::StrCat("last step ", *last_step_) : std::string("no progress record");
    report.set_reason(has_watchdog_
                          ? absl::StrFormat("hung: no sign of life for %.1f s, not even its "
                                            "watchdog's heartbeat (%s)%s",
                                            hang_for_s_, last, hang_reason_)
                          : absl::StrFormat("hung: no progress for %.1f s (%s)%s", hang_for_s_,
                                            last, hang_reason_));
  } else if (stop_requested || code == kRankExitStopped) {
    // Exit 82: stopped after its checkpoint, asked by its agent or with its peers, whose request
    // it learned before its own agent's (rank_stop_signal.h); it says which step.
    report.set_exit_kind(furnace::v1::EXIT_KIND_STOPPED);
    if (stop_reason.empty() && !stop_requested) stop_reason = "with the peers of its attempt";
    report.set_reason(absl::StrCat("stopped", stop_reason.empty() ? "" : ": ", stop_reason, " (",
                                   how, code == kRankExitStopped ? said : "", ")"));
  } else if (code == 0) {
    report.set_exit_kind(furnace::v1::EXIT_KIND_SUCCESS);
    report.set_reason(how);
  } else if (code == kRankExitOutOfMemory) {
    report.set_exit_kind(furnace::v1::EXIT_KIND_OOM);
    report.set_reason(absl::StrCat(how, " (out of memory)", said));
  } else if (code > 0) {
    report.set_exit_kind(furnace::v1::EXIT_KIND_CODE);
    report.set_reason(absl::StrCat(how, said));
  } else {
    const std::optional<uint64_t> oom_kills = ReadOomKills(cgroup_events_path_);
    if (signal == SIGKILL && oom_kills && oom_kills_at_start_ &&
        *oom_kills > *oom_kills_at_start_) {
      report.set_exit_kind(furnace::v1::EXIT_KIND_OOM);
      report.set_reason(absl::StrCat(how,
                                     ", likely by the kernel OOM killer (the cgroup's "
                                     "oom_kill count rose)"));
    } else {
      report.set_exit_kind(furnace::v1::EXIT_KIND_SIGNAL);
      report.set_reason(absl::StrCat(how, said));
    }
  }
  if (report.exit_kind() != furnace::v1::EXIT_KIND_SUCCESS &&
      report.exit_kind() != furnace::v1::EXIT_KIND_STOPPED) {
    report.set_failed_unix(failed_unix_ > 0 ? failed_unix_ : report.unix_time());
  }
  return report;
}

}  // namespace furnace::worker
