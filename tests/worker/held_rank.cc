// A rank whose end its supervisor cannot see, for the tests of a rank SIGKILL does not end
// (worker/rank_supervisor.h, kUnkillableS): what a rank stuck in the kernel (state D, a hung GPU
// driver or mount) looks like from outside, made without root or a broken device.
//
// The rank forks a holder that leaves the rank's process group (the supervisor's SIGKILL to the
// group misses it) and ptrace-seizes the rank. A traced process's end is reported to its tracer
// first: once the rank is killed it stays a zombie its parent's waitid does not report, until the
// holder exits (its tracee is then released to the parent). The holder exits when the file named
// by argv[1] exists, or after 60 s, so nothing outlives a failed test for long.
//
// Prints "held" once traced, or "untraceable: <why>" and exits 2 where ptrace is refused (a
// container without CAP_SYS_PTRACE, Yama). Ignores SIGTERM, so a stop ends it only by SIGKILL.
// Further arguments (the agent's task file) are ignored.
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/ptrace.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s RELEASE_FILE [ignored...]\n", argv[0]);
    return 1;
  }
  const char* release = argv[1];
  signal(SIGTERM, SIG_IGN);
  int ready[2];
  if (pipe(ready) != 0) return 1;
  const pid_t rank = getpid();
  // Yama's ptrace_scope 1 (Ubuntu's default) lets a process trace only its descendants unless the
  // tracee names its tracer: the holder is the rank's child, tracing its parent.
  prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);
  const pid_t holder = fork();
  if (holder < 0) return 1;
  if (holder == 0) {
    setsid();
    close(ready[0]);
    const int error = ptrace(PTRACE_SEIZE, rank, nullptr, nullptr) == 0 ? 0 : errno;
    // The rank's pipes (stdout, stderr, telemetry) must end with the rank, not with the holder.
    const int null = open("/dev/null", O_RDWR);
    for (int fd = 0; fd <= 3; ++fd) dup2(null, fd);
    if (write(ready[1], &error, sizeof(error)) != sizeof(error) || error != 0) _exit(1);
    close(ready[1]);
    for (int i = 0; i < 6000 && access(release, F_OK) != 0; ++i) usleep(10'000);
    _exit(0);
  }
  close(ready[1]);
  int error = 0;
  if (read(ready[0], &error, sizeof(error)) != sizeof(error)) error = ECHILD;
  if (error != 0) {
    std::printf("untraceable: %s\n", std::strerror(error));
    return 2;
  }
  std::printf("held\n");
  std::fflush(stdout);
  for (;;) pause();
}
