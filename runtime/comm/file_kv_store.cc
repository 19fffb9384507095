#include "runtime/comm/file_kv_store.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <random>
#include <thread>
#include <utility>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace furnace::comm {
namespace {

constexpr size_t kMaxFileName = 240;  // below NAME_MAX (255)

std::string EscapeKey(const std::string& key) {
  std::string out;
  for (unsigned char c : key) {
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
        c == '-') {
      out.push_back(static_cast<char>(c));
    } else {
      out += absl::StrFormat("%%%02X", c);
    }
  }
  // An empty key still needs a file name, distinct from every escaped non-empty key.
  return out.empty() ? "%" : out;
}

// The file's contents, nullopt when it does not exist (yet), or an error.
absl::StatusOr<std::optional<std::string>> ReadIfPresent(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return std::optional<std::string>();
    return absl::UnavailableError(
        absl::StrFormat("file kv store: cannot open %s: %s", path, std::strerror(errno)));
  }
  std::string value;
  char chunk[4096];
  while (true) {
    const ssize_t n = ::read(fd, chunk, sizeof(chunk));
    if (n == 0) break;
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      ::close(fd);
      return absl::UnavailableError(
          absl::StrFormat("file kv store: cannot read %s: %s", path, std::strerror(err)));
    }
    value.append(chunk, static_cast<size_t>(n));
  }
  ::close(fd);
  return std::optional<std::string>(std::move(value));
}

}  // namespace

FileKvStore::FileKvStore(std::string dir) : dir_(std::move(dir)) {}

absl::Status FileKvStore::Set(const std::string& key, const std::string& value) {
  const std::string name = EscapeKey(key);
  if (name.size() > kMaxFileName) {
    return absl::InvalidArgumentError(
        absl::StrFormat("file kv store: key '%s' is too long for a file name", key));
  }
  std::error_code ec;
  std::filesystem::create_directories(dir_, ec);
  if (ec) {
    return absl::UnavailableError(
        absl::StrFormat("file kv store: cannot create %s: %s", dir_, ec.message()));
  }
  // Unique per process and call, so concurrent writers never share a tmp file (a random token
  // too: processes of other PID namespaces, containers sharing the directory, reuse pids); without
  // the key's name, so a name near the limit still leaves the tmp name under NAME_MAX.
  static const uint64_t process_token =
      (uint64_t{std::random_device()()} << 32) ^ std::random_device()();
  static std::atomic<uint64_t> counter{0};
  const std::string tmp =
      absl::StrFormat("%s/.tmp-%d-%016x-%d", dir_, getpid(), process_token, counter++);
  const std::string path = dir_ + "/" + name;
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out.write(value.data(), static_cast<std::streamsize>(value.size()));
    out.close();
    if (!out) {
      std::remove(tmp.c_str());
      return absl::UnavailableError(absl::StrFormat("file kv store: cannot write %s", tmp));
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    std::remove(tmp.c_str());
    return absl::UnavailableError(
        absl::StrFormat("file kv store: rename %s -> %s: %s", tmp, path, std::strerror(err)));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::string>> FileKvStore::Get(const std::vector<std::string>& keys,
                                                          double timeout_s) {
  using Clock = std::chrono::steady_clock;
  const Clock::time_point deadline =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(
                         std::chrono::duration<double>(timeout_s > 0 ? timeout_s : 0.0));
  std::vector<std::optional<std::string>> values(keys.size());
  auto poll = std::chrono::milliseconds(2);
  while (true) {
    bool all = true;
    for (size_t i = 0; i < keys.size(); ++i) {
      if (values[i].has_value()) continue;
      absl::StatusOr<std::optional<std::string>> value =
          ReadIfPresent(dir_ + "/" + EscapeKey(keys[i]));
      if (!value.ok()) return value.status();
      values[i] = *std::move(value);
      all = all && values[i].has_value();
    }
    if (all) break;
    const Clock::time_point now = Clock::now();
    if (now >= deadline) {
      std::vector<std::string> missing;
      for (size_t i = 0; i < keys.size(); ++i) {
        if (!values[i].has_value()) missing.push_back(keys[i]);
      }
      return absl::DeadlineExceededError(
          absl::StrFormat("file kv store %s: keys still missing after %.3f s: [%s]", dir_,
                          timeout_s, absl::StrJoin(missing, ", ")));
    }
    std::this_thread::sleep_for(std::min<Clock::duration>(poll, deadline - now));
    poll = std::min(poll * 2, std::chrono::milliseconds(50));
  }
  std::vector<std::string> out;
  out.reserve(keys.size());
  for (std::optional<std::string>& value : values) out.push_back(*std::move(value));
  return out;
}

}  // namespace furnace::comm
