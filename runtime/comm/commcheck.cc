#include "runtime/comm/commcheck.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <numeric>
#include <utility>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "gloo/allgather.h"
#include "gloo/allreduce.h"
#include "gloo/alltoallv.h"
#include "gloo/broadcast.h"
#include "gloo/math.h"
#include "runtime/base/status.h"
#include "runtime/comm/commcheck_payload.h"
#include "runtime/comm/gloo_error.h"

namespace furnace::comm {
namespace {

using ReduceFn = void (*)(void*, const void*, const void*, size_t);

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

// Runs the collectives of one rank. Owns the payload buffers of the (collective, size) being run.
class Runner {
 public:
  Runner(gloo::Context& ctx, const CommcheckOptions& options)
      // gloo's option structs want a shared_ptr; this one aliases the caller's context without
      // owning it (RunCommcheck's caller keeps it alive for the whole run).
      : ctx_(std::shared_ptr<void>(), &ctx),
        options_(options),
        timeout_(std::chrono::duration_cast<std::chrono::milliseconds>(
            std::chrono::duration<double>(options.timeout_s))) {}

  absl::StatusOr<CommResult> Run(const std::string& collective, uint64_t bytes) {
    const int n = ctx_->size;
    const uint64_t elements = bytes / 4;
    double timed_s = 0;
    uint64_t errors = 0;
    std::string first_error;
    const uint32_t calls = options_.warmup_iters + options_.iters;
    for (uint32_t iter = 0; iter < calls; ++iter) {
      double seconds = 0;
      VerifyResult check;
      const std::string what = absl::StrFormat("commcheck %s %d B iteration %d (rank %d of %d)",
                                               collective, bytes, iter, ctx_->rank, n);
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
  template <typename Fn>
  absl::Status Timed(const std::string& what, double& seconds, Fn&& fn) {
    const auto start = std::chrono::steady_clock::now();
    absl::Status status = GuardGloo(what, std::forward<Fn>(fn));
    seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return status;
  }

  absl::Status Allreduce(const std::string& what, uint64_t elements, uint32_t iter, double& seconds,
                         VerifyResult& check) {
    floats_.resize(elements);
    FillAllreduce(ctx_->rank, iter, floats_);
    RETURN_IF_ERROR(Timed(what, seconds, [&] {
      gloo::AllreduceOptions opts(ctx_);
      opts.setOutput(floats_.data(), floats_.size());
      opts.setReduceFunction(static_cast<ReduceFn>(&gloo::sum<float>));
      opts.setTag(NextTag());
      opts.setTimeout(timeout_);
      gloo::allreduce(opts);
    }));
    check = VerifyAllreduce(ctx_->size, iter, floats_);
    return absl::OkStatus();
  }

  absl::Status Allgather(const std::string& what, uint64_t elements, uint32_t iter, double& seconds,
                         VerifyResult& check) {
    ints_in_.resize(elements);
    ints_out_.assign(elements * ctx_->size, kPoison);
    FillAllgatherInput(ctx_->rank, iter, ints_in_);
    RETURN_IF_ERROR(Timed(what, seconds, [&] {
      gloo::AllgatherOptions opts(ctx_);
      opts.setInput(ints_in_.data(), ints_in_.size());
      opts.setOutput(ints_out_.data(), ints_out_.size());
      opts.setTag(NextTag());
      opts.setTimeout(timeout_);
      gloo::allgather(opts);
    }));
    check = VerifyAllgather(ctx_->size, iter, ints_out_);
    return absl::OkStatus();
  }

  absl::Status Alltoallv(const std::string& what, uint64_t elements, uint32_t iter, double& seconds,
                         VerifyResult& check) {
    const std::vector<int64_t> send_counts = AlltoallvSendCounts(ctx_->rank, ctx_->size, elements);
    const std::vector<int64_t> recv_counts = AlltoallvRecvCounts(ctx_->rank, ctx_->size, elements);
    ints_in_.resize(elements);
    ints_out_.assign(std::accumulate(recv_counts.begin(), recv_counts.end(), int64_t{0}), kPoison);
    FillAlltoallvInput(ctx_->rank, iter, ints_in_);
    RETURN_IF_ERROR(Timed(what, seconds, [&] {
      gloo::AlltoallvOptions opts(ctx_);
      opts.setInput(ints_in_.data(), send_counts);
      opts.setOutput(ints_out_.data(), recv_counts);
      opts.setTag(NextTag());
      opts.setTimeout(timeout_);
      gloo::alltoallv(opts);
    }));
    check = VerifyAlltoallv(ctx_->rank, ctx_->size, elements, iter, ints_out_);
    return absl::OkStatus();
  }

  absl::Status Broadcast(const std::string& what, uint64_t elements, uint32_t iter, double& seconds,
                         VerifyResult& check) {
    const int root = BroadcastRoot(iter, ctx_->size);
    ints_out_.resize(elements);
    FillBroadcast(ctx_->rank, root, iter, ints_out_);
    RETURN_IF_ERROR(Timed(what, seconds, [&] {
      gloo::BroadcastOptions opts(ctx_);
      opts.setOutput(ints_out_.data(), ints_out_.size());
      opts.setRoot(root);
      opts.setTag(NextTag());
      opts.setTimeout(timeout_);
      gloo::broadcast(opts);
    }));
    check = VerifyBroadcast(root, iter, ints_out_);
    return absl::OkStatus();
  }

  // Allgathers (mean time, errors) so every rank reports max time and total errors; sets
  // mean_s to the max and returns the total.
  absl::StatusOr<uint64_t> AgreeOnResult(const std::string& collective, uint64_t bytes,
                                         double& mean_s, uint64_t errors) {
    const int n = ctx_->size;
    double mine[2] = {mean_s, static_cast<double>(errors)};
    std::vector<double> all(2 * n);
    RETURN_IF_ERROR(GuardGloo(
        absl::StrFormat("commcheck %s %d B: agreeing on the result", collective, bytes), [&] {
          gloo::AllgatherOptions opts(ctx_);
          opts.setInput(mine, 2);
          opts.setOutput(all.data(), all.size());
          opts.setTag(NextTag());
          opts.setTimeout(timeout_);
          gloo::allgather(opts);
        }));
    double total_errors = 0;
    for (int r = 0; r < n; ++r) {
      mean_s = std::max(mean_s, all[2 * r]);
      total_errors += all[2 * r + 1];
    }
    return static_cast<uint64_t>(total_errors);
  }

  uint32_t NextTag() { return next_tag_++; }

  std::shared_ptr<gloo::Context> ctx_;
  const CommcheckOptions& options_;
  std::chrono::milliseconds timeout_;
  uint32_t next_tag_ = 1;
  std::vector<float> floats_;
  std::vector<int32_t> ints_in_;
  std::vector<int32_t> ints_out_;
  std::string last_first_error_;
};

absl::Status RunRounds(gloo::Context& ctx, const CommcheckOptions& options,
                       const CommcheckCallback& on_progress) {
  Runner runner(ctx, options);
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

absl::Status RunCommcheck(gloo::Context& ctx, const CommcheckOptions& options,
                          const CommcheckCallback& on_progress) {
  RETURN_IF_ERROR(ValidateOptions(options));
  // Gloo calls are guarded one by one; this catches the rest (allocation failure, a throwing
  // callback) so that nothing escapes.
  try {
    return RunRounds(ctx, options, on_progress);
  } catch (...) {
    return StatusFromException(std::current_exception(), "commcheck");
  }
}

}  // namespace furnace::comm
