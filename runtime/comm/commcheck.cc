#include "runtime/comm/commcheck.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "runtime/base/status.h"
#include "runtime/comm/commcheck_payload.h"
#include "runtime/comm/gloo_error.h"
#include "runtime/device/current_stream.h"

namespace furnace::comm {
namespace {

bool KnownCollective(const std::string& name) {
  return name == "allreduce" || name == "allgather" || name == "alltoall" || name == "broadcast";
}

absl::Status ValidateOptions(const CommcheckOptions& options) {
  if (options.min_bytes < 4 || options.min_bytes > options.max_bytes) {
    return absl::InvalidArgumentError(
        absl::StrFormat("commcheck: need 4 <= min_bytes <= max_bytes, got %d..%d",
                        options.min_bytes, options.max_bytes));
  }
  if (options.step_factor < 2) {
    return absl::InvalidArgumentError("commcheck: step_factor must be >= 2");
  }
  if (options.iters < 1) return absl::InvalidArgumentError("commcheck: iters must be >= 1");
  if (!(options.timeout_s > 0)) {
    return absl::InvalidArgumentError("commcheck: timeout_s must be > 0");
  }
  for (const std::string& name : options.collectives) {
    if (!KnownCollective(name)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "commcheck: unknown collective '%s' (known: allreduce, allgather, alltoall, broadcast)",
          name));
    }
  }
  return absl::OkStatus();
}

std::vector<uint64_t> Sizes(const CommcheckOptions& options) {
  std::vector<uint64_t> sizes;
  for (uint64_t bytes = options.min_bytes; bytes <= options.max_bytes;) {
    sizes.push_back(bytes);
    if (bytes > options.max_bytes / options.step_factor) break;
    bytes *= options.step_factor;
  }
  return sizes;
}

double BusFactor(const std::string& collective, int n) {
  if (collective == "allreduce") return 2.0 * (n - 1) / n;
  if (collective == "broadcast") return 1.0;
  return static_cast<double>(n - 1) / n;  // allgather, alltoall
}

// Device memory of the run, grown on demand and freed at the end (stream-ordered, device.h).
class Buffer {
 public:
  explicit Buffer(device::Device& device) : device_(device) {}
  ~Buffer() {
    if (data_ != nullptr) device_.Free(data_);
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  absl::StatusOr<void*> Reserve(size_t bytes) {
    if (bytes > bytes_ || data_ == nullptr) {
      if (data_ != nullptr) device_.Free(data_);
      data_ = nullptr;
      bytes_ = 0;
      ASSIGN_OR_RETURN(data_, device_.Allocate(std::max<size_t>(bytes, 4)));
      bytes_ = std::max<size_t>(bytes, 4);
    }
    return data_;
  }

 private:
  device::Device& device_;
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

// Runs the collectives of one rank. Owns the payload buffers of the (collective, size) being run:
// host vectors for filling and checking, device buffers for the collective.
class Runner {
 public:
  Runner(Communicator& group, device::Device& device, const CommcheckOptions& options)
      : group_(group),
        device_(device),
        stream_(device::CurrentStreamOf(device)),
        options_(options),
        in_(device),
        out_(device) {}

  absl::StatusOr<CommResult> Run(const std::string& collective, uint64_t bytes) {
    const int n = group_.size();
    const uint64_t elements = bytes / 4;
    double timed_s = 0;
    uint64_t errors = 0;
    std::string first_error;
    const uint32_t calls = options_.warmup_iters + options_.iters;
    for (uint32_t iter = 0; iter < calls; ++iter) {
      double seconds = 0;
      VerifyResult check;
      const std::string what = absl::StrFormat("commcheck %s %d B iteration %d (rank %d of %d)",
                                               collective, bytes, iter, group_.rank(), n);
      absl::Status status;
      if (collective == "allreduce") {
        status = Allreduce(what, elements, iter, seconds, check);
      } else if (collective == "allgather") {
        status = Allgather(what, elements, iter, seconds, check);
      } else if (collective == "alltoall") {
        status = Alltoallv(what, elements, iter, seconds, check);
      } else {
        status = Broadcast(what, elements, iter, seconds, check);
      }
      RETURN_IF_ERROR(status);
      if (iter >= options_.warmup_iters) timed_s += seconds;
      if (check.errors > 0 && errors == 0) first_error = check.first_error;
      errors += check.errors;
    }
    double mean_s = timed_s / options_.iters;
    ASSIGN_OR_RETURN(errors, AgreeOnResult(collective, bytes, mean_s, errors));
    if (errors > 0 && !first_error.empty()) last_first_error_ = first_error;

    CommResult result;
    result.collective = collective;
    result.bytes = bytes;
    result.world_size = n;
    result.time_s = mean_s;
    const double size = collective == "allgather" ? static_cast<double>(bytes) * n : bytes;
    result.algbw_gbps = mean_s > 0 ? size / mean_s / 1e9 : 0;
    result.busbw_gbps = result.algbw_gbps * BusFactor(collective, n);
    result.errors = errors;
    result.verified = errors == 0;
    return result;
  }

  // The first mismatch this rank saw in the latest unverified result (empty if only peers saw one).
  const std::string& last_first_error() const { return last_first_error_; }

 private:
  // `host` into `buffer` on the stream (the collective after it is ordered on the same stream).
  // On the CPU device the host vector is the buffer: no copy, so the ranks reach each call as
  // they did on Gloo alone (copies outside the timed call still skew the ranks' arrival at it on
  // a loaded host, which the time then includes).
  template <typename T>
  absl::StatusOr<void*> Upload(const std::string& what, Buffer& buffer,
                               const std::vector<T>& host) {
    if (device::HostAddressable(device_)) return const_cast<T*>(host.data());
    const size_t bytes = host.size() * sizeof(T);
    absl::StatusOr<void*> d = buffer.Reserve(bytes);
    if (!d.ok()) return Annotated(what, "device buffer", d.status());
    RETURN_IF_ERROR(
        Annotated(what, "upload",
                  device_.Copy(*d, host.data(), bytes, device::CopyKind::kHostToDevice, stream_)));
    return *d;
  }

  // `host.size()` elements of device memory `d` back into `host`, once the stream has got there.
  template <typename T>
  absl::Status Download(const std::string& what, const void* d, std::vector<T>& host) {
    if (d == host.data()) return absl::OkStatus();  // the CPU device: the result is in place
    RETURN_IF_ERROR(Annotated(what, "download",
                              device_.Copy(host.data(), d, host.size() * sizeof(T),
                                           device::CopyKind::kDeviceToHost, stream_)));
    return Annotated(what, "download", device_.SynchronizeStream(stream_));
  }

  // `collective()` timed until the stream has passed it: its completion, on any transport.
  template <typename Fn>
  absl::Status Timed(const std::string& what, double& seconds, Fn&& collective) {
    RETURN_IF_ERROR(Annotated(what, "before the call", device_.SynchronizeStream(stream_)));
    const auto start = std::chrono::steady_clock::now();
    absl::Status status = collective();
    if (status.ok()) status = device_.SynchronizeStream(stream_);
    // A stream collective that failed (a peer gone, the watchdog's abort) still lets the stream
    // go on: the group's sticky error says so, not a count of wrong elements.
    if (status.ok()) status = group_.AsyncError();
    seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (status.ok()) return status;
    return absl::Status(status.code(), absl::StrCat(what, ": ", status.message()));
  }

  static absl::Status Annotated(const std::string& what, const char* step, absl::Status status) {
    if (status.ok()) return status;
    return absl::Status(status.code(), absl::StrCat(what, ": ", step, ": ", status.message()));
  }

  absl::Status Allreduce(const std::string& what, uint64_t elements, uint32_t iter, double& seconds,
                         VerifyResult& check) {
    floats_.resize(elements);
    FillAllreduce(group_.rank(), iter, floats_);
    ASSIGN_OR_RETURN(void* d, Upload(what, in_, floats_));
    RETURN_IF_ERROR(Timed(what, seconds, [&] {
      return group_.AllReduce(static_cast<float*>(d), static_cast<int64_t>(elements));
    }));
    RETURN_IF_ERROR(Download(what, d, floats_));
    check = VerifyAllreduce(group_.size(), iter, floats_);
    return absl::OkStatus();
  }

  absl::Status Allgather(const std::string& what, uint64_t elements, uint32_t iter, double& seconds,
                         VerifyResult& check) {
    ints_in_.resize(elements);
    ints_out_.assign(elements * group_.size(), kPoison);
    FillAllgatherInput(group_.rank(), iter, ints_in_);
    ASSIGN_OR_RETURN(void* d_in, Upload(what, in_, ints_in_));
    ASSIGN_OR_RETURN(void* d_out, Upload(what, out_, ints_out_));
    RETURN_IF_ERROR(Timed(what, seconds, [&] {
      return group_.AllGather(d_in, d_out, static_cast<int64_t>(elements * 4));
    }));
    RETURN_IF_ERROR(Download(what, d_out, ints_out_));
    check = VerifyAllgather(group_.size(), iter, ints_out_);
    return absl::OkStatus();
  }

  absl::Status Alltoallv(const std::string& what, uint64_t elements, uint32_t iter, double& seconds,
                         VerifyResult& check) {
    const int rank = group_.rank(), n = group_.size();
    std::vector<int64_t> send = AlltoallvSendCounts(rank, n, elements);
    std::vector<int64_t> recv = AlltoallvRecvCounts(rank, n, elements);
    ints_in_.resize(elements);
    ints_out_.assign(std::accumulate(recv.begin(), recv.end(), int64_t{0}), kPoison);
    FillAlltoallvInput(rank, iter, ints_in_);
    for (int64_t& c : send) c *= 4;  // elements to bytes
    for (int64_t& c : recv) c *= 4;
    ASSIGN_OR_RETURN(void* d_in, Upload(what, in_, ints_in_));
    ASSIGN_OR_RETURN(void* d_out, Upload(what, out_, ints_out_));
    RETURN_IF_ERROR(
        Timed(what, seconds, [&] { return group_.AllToAllV(d_in, send, d_out, recv); }));
    RETURN_IF_ERROR(Download(what, d_out, ints_out_));
    check = VerifyAlltoallv(rank, n, elements, iter, ints_out_);
    return absl::OkStatus();
  }

  absl::Status Broadcast(const std::string& what, uint64_t elements, uint32_t iter, double& seconds,
                         VerifyResult& check) {
    const int root = BroadcastRoot(iter, group_.size());
    ints_out_.resize(elements);
    FillBroadcast(group_.rank(), root, iter, ints_out_);
    ASSIGN_OR_RETURN(void* d, Upload(what, out_, ints_out_));
    RETURN_IF_ERROR(Timed(what, seconds, [&] {
      return group_.Broadcast(d, static_cast<int64_t>(elements * 4), root);
    }));
    RETURN_IF_ERROR(Download(what, d, ints_out_));
    check = VerifyBroadcast(root, iter, ints_out_);
    return absl::OkStatus();
  }

  // Allgathers (mean time, errors) so every rank reports max time and total errors; sets
  // mean_s to the max and returns the total.
  absl::StatusOr<uint64_t> AgreeOnResult(const std::string& collective, uint64_t bytes,
                                         double& mean_s, uint64_t errors) {
    const int n = group_.size();
    const std::string what =
        absl::StrFormat("commcheck %s %d B: agreeing on the result", collective, bytes);
    const std::vector<double> mine = {mean_s, static_cast<double>(errors)};
    std::vector<double> all(2 * n);
    ASSIGN_OR_RETURN(void* d_in, Upload(what, in_, mine));  // the payload's buffers are free
    ASSIGN_OR_RETURN(void* d_out, Upload(what, out_, all));
    double ignored = 0;
    RETURN_IF_ERROR(Timed(what, ignored, [&] {
      return group_.AllGather(d_in, d_out, static_cast<int64_t>(2 * sizeof(double)));
    }));
    RETURN_IF_ERROR(Download(what, d_out, all));
    double total_errors = 0;
    for (int r = 0; r < n; ++r) {
      mean_s = std::max(mean_s, all[2 * r]);
      total_errors += all[2 * r + 1];
    }
    return static_cast<uint64_t>(total_errors);
  }

  Communicator& group_;
  device::Device& device_;
  device::Stream& stream_;
  const CommcheckOptions& options_;
  Buffer in_, out_;
  std::vector<float> floats_;
  std::vector<int32_t> ints_in_;
  std::vector<int32_t> ints_out_;
  std::string last_first_error_;
};

absl::Status RunRounds(Communicator& group, device::Device& device, const CommcheckOptions& options,
                       const CommcheckCallback& on_progress) {
  Runner runner(group, device, options);
  const std::vector<uint64_t> sizes = Sizes(options);
  for (uint32_t round = 0; round < options.rounds; ++round) {
    for (uint64_t bytes : sizes) {
      for (const std::string& collective : options.collectives) {
        ASSIGN_OR_RETURN(CommResult result, runner.Run(collective, bytes));
        if (on_progress) RETURN_IF_ERROR(on_progress(round, &result, /*round_done=*/false));
        if (!result.verified) {
          const std::string& local = runner.last_first_error();
          return absl::DataLossError(absl::StrFormat(
              "commcheck %s %d B (world %d, round %d): %d mismatched elements over all ranks%s",
              collective, bytes, result.world_size, round, result.errors,
              local.empty() ? std::string(" (none on this rank)") : "; first here: " + local));
        }
      }
    }
    if (on_progress) RETURN_IF_ERROR(on_progress(round, nullptr, /*round_done=*/true));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status RunCommcheck(Communicator& group, device::Device& device,
                          const CommcheckOptions& options, const CommcheckCallback& on_progress) {
  RETURN_IF_ERROR(ValidateOptions(options));
  // Catches what no Status reports (allocation failure, a throwing callback), so that nothing
  // escapes.
  try {
    return RunRounds(group, device, options, on_progress);
  } catch (...) {
    return StatusFromException(std::current_exception(), "commcheck");
  }
}

}  // namespace furnace::comm
