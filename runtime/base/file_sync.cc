#include "runtime/base/file_sync.h"

#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <vector>

#include "absl/strings/str_cat.h"

namespace furnace {

absl::Status SyncDirectory(const std::string& dir) {
  const std::string d = dir.empty() ? "." : dir;
  const int fd = ::open(d.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0)
    return absl::InternalError(absl::StrCat("open directory ", d, ": ", std::strerror(errno)));
  const int rc = ::fsync(fd);
  const int error = errno;
  ::close(fd);
  if (rc != 0)
    return absl::InternalError(absl::StrCat("fsync directory ", d, ": ", std::strerror(error)));
  return absl::OkStatus();
}

namespace {

// The process's umask, read without changing it (umask(2) can only set it, which would race with
// other threads creating files): /proc/self/status says it (Linux 4.7 on); 022 where it does not.
mode_t ProcessUmask() {
  static const mode_t mask = [] {
    std::FILE* f = std::fopen("/proc/self/status", "r");
    mode_t found = 022;
    if (f == nullptr) return found;
    char line[256];
    while (std::fgets(line, sizeof line, f) != nullptr) {
      unsigned value = 0;
      if (std::sscanf(line, "Umask: %o", &value) == 1) {
        found = static_cast<mode_t>(value & 0777);
        break;
      }
    }
    std::fclose(f);
    return found;
  }();
  return mask;
}

}  // namespace

namespace {

// The temporary files not yet renamed or removed, for the signal handler to remove. Changed under
// a mutex; the handler takes none (it may interrupt a holder) and reads the slots whose state says
// their path is whole.
struct TempSlot {
  std::atomic<int> state{0};  // 0 free; 1 its path being written; 2 holds a path
  char path[PATH_MAX];
};
constexpr int kTempSlots = 64;
TempSlot temp_slots[kTempSlots];
std::mutex temp_slots_mu;
int next_temp_slot = 0;  // slots are taken in turn: one freed is reused last (the handler may be
                         // reading it as it is freed)

void NoteTemp(const std::string& tmp_path) {
  if (tmp_path.size() >= PATH_MAX) return;
  std::lock_guard<std::mutex> lock(temp_slots_mu);
  for (int i = 0; i < kTempSlots; ++i) {
    TempSlot& slot = temp_slots[(next_temp_slot + i) % kTempSlots];
    if (slot.state.load(std::memory_order_relaxed) != 0) continue;
    next_temp_slot = (next_temp_slot + i + 1) % kTempSlots;
    slot.state.store(1, std::memory_order_relaxed);
    std::memcpy(slot.path, tmp_path.c_str(), tmp_path.size() + 1);
    slot.state.store(2, std::memory_order_release);
    return;
  }
}

void ForgetTemp(const std::string& tmp_path) {
  std::lock_guard<std::mutex> lock(temp_slots_mu);
  for (TempSlot& slot : temp_slots) {
    if (slot.state.load(std::memory_order_relaxed) == 2 &&
        std::strcmp(slot.path, tmp_path.c_str()) == 0) {
      slot.state.store(0, std::memory_order_release);
      return;
    }
  }
}

void RemoveTempsAndDie(int signal) {
  // Async-signal-safe: atomic loads, unlink, sigaction, raise.
  for (TempSlot& slot : temp_slots) {
    if (slot.state.load(std::memory_order_acquire) == 2) ::unlink(slot.path);
  }
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  ::sigemptyset(&dfl.sa_mask);
  ::sigaction(signal, &dfl, nullptr);
  ::raise(signal);
}

}  // namespace

void RemoveTemp(const std::string& tmp_path) {
  std::remove(tmp_path.c_str());
  ForgetTemp(tmp_path);
}

void RemoveTempFilesOnSignal() {
  struct sigaction action {};
  action.sa_handler = RemoveTempsAndDie;
  ::sigemptyset(&action.sa_mask);
  for (int signal : {SIGINT, SIGTERM, SIGHUP}) {
    // A signal the program was started ignoring stays ignored (nohup; a background job of a
    // shell without job control ignores SIGINT): the handler would end it.
    struct sigaction old {};
    if (::sigaction(signal, nullptr, &old) == 0 && old.sa_handler == SIG_IGN) continue;
    ::sigaction(signal, &action, nullptr);
  }
}

absl::StatusOr<std::FILE*> CreateTempBeside(const std::string& path, std::string* tmp_path) {
  std::string name = path + ".tmp.XXXXXX";
  std::vector<char> buf(name.begin(), name.end());
  buf.push_back('\0');
  const int fd = ::mkstemp(buf.data());
  if (fd < 0) {
    return absl::InternalError(
        absl::StrCat("cannot create a temporary file beside ", path, ": ", std::strerror(errno)));
  }
  name.assign(buf.data());
  NoteTemp(name);  // from its creation: a signal from here on removes it
  // As a plain create would have it (mkstemp makes 0600, which would hide a token file from the
  // daemons that read it; a umask of 077 keeps it private).
  ::fchmod(fd, 0666 & ~ProcessUmask());
  std::FILE* file = ::fdopen(fd, "wb");
  if (file == nullptr) {
    const int error = errno;
    ::close(fd);
    RemoveTemp(name);
    return absl::InternalError(absl::StrCat("cannot open ", name, ": ", std::strerror(error)));
  }
  *tmp_path = std::move(name);
  return file;
}

absl::Status RenameDurably(const std::string& tmp_path, const std::string& path) {
  if (std::rename(tmp_path.c_str(), path.c_str()) != 0) {
    const int error = errno;
    RemoveTemp(tmp_path);
    return absl::InternalError(
        absl::StrCat("rename ", tmp_path, " to ", path, ": ", std::strerror(error)));
  }
  ForgetTemp(tmp_path);
  return SyncDirectory(std::filesystem::path(path).parent_path().string());
}

absl::Status WriteFileAtomically(const std::string& path, absl::string_view contents,
                                 std::optional<mode_t> mode) {
  std::string tmp;
  absl::StatusOr<std::FILE*> file = CreateTempBeside(path, &tmp);
  if (!file.ok()) return file.status();
  const int fd = ::fileno(*file);
  // The step that failed and its own errno (a full disk usually shows at the flush; a network
  // file system may report a failed write only at the close).
  const char* failed = nullptr;
  if (mode.has_value() && ::fchmod(fd, *mode) != 0) {
    failed = "chmod";
  } else if (std::fwrite(contents.data(), 1, contents.size(), *file) != contents.size()) {
    failed = "write";
  } else if (std::fflush(*file) != 0) {
    failed = "write (flush)";
  } else if (::fsync(fd) != 0) {
    failed = "fsync";
  }
  int error = failed != nullptr ? errno : 0;
  if (std::fclose(*file) != 0 && failed == nullptr) {
    failed = "close";
    error = errno;
  }
  if (failed != nullptr) {
    RemoveTemp(tmp);
    return absl::InternalError(absl::StrCat(failed, " ", tmp, ": ", std::strerror(error)));
  }
  return RenameDurably(tmp, path);
}

}  // namespace furnace
