#include "worker/rank_log_retention.h"

#include <sys/stat.h>

#include <algorithm>
#include <filesystem>

#include "spdlog/spdlog.h"

namespace furnace::worker {
namespace {

namespace fs = std::filesystem;

// The newest modification time (unix seconds) of `dir` and everything under it; false when it
// could not be read whole (then it is left alone).
bool NewestChange(const fs::path& dir, double* newest) {
  struct stat st {};
  if (::lstat(dir.c_str(), &st) != 0) return false;
  *newest = static_cast<double>(st.st_mtim.tv_sec) + st.st_mtim.tv_nsec * 1e-9;
  std::error_code ec;
  fs::recursive_directory_iterator it(dir, fs::directory_options::none, ec), end;
  if (ec) return false;
  for (; it != end; it.increment(ec)) {
    if (ec) return false;
    if (::lstat(it->path().c_str(), &st) != 0) return false;
    *newest = std::max(*newest, static_cast<double>(st.st_mtim.tv_sec) + st.st_mtim.tv_nsec * 1e-9);
  }
  return !ec;
}

}  // namespace

RankLogSweep SweepRankLogs(const std::string& logs_dir, double keep_s, double now_unix,
                           const std::function<bool(const std::string&)>& active,
                           std::mutex* guard) {
  RankLogSweep sweep;
  if (keep_s <= 0) return sweep;
  std::error_code ec;
  for (const fs::directory_entry& entry : fs::directory_iterator(logs_dir, ec)) {
    std::error_code is_dir;
    if (!entry.is_directory(is_dir) || entry.is_symlink(is_dir)) continue;
    double newest = 0;
    if (!NewestChange(entry.path(), &newest)) {
      spdlog::warn("rank logs {}: cannot read it; kept", entry.path().string());
      continue;
    }
    if (now_unix - newest <= keep_s) continue;
    std::unique_lock<std::mutex> lock;
    if (guard != nullptr) lock = std::unique_lock<std::mutex>(*guard);
    if (active(entry.path().filename().string())) {
      ++sweep.kept_active;
      continue;
    }
    std::error_code rm;
    fs::remove_all(entry.path(), rm);
    if (rm) {
      spdlog::warn("rank logs {}: cannot remove it: {}", entry.path().string(), rm.message());
      continue;
    }
    ++sweep.removed;
  }
  return sweep;
}

}  // namespace furnace::worker
