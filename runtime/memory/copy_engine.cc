#include "runtime/memory/copy_engine.h"

#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace furnace::memory {

// Fields written by the copy thread (or Shutdown) under the engine's mutex.
struct CopyTicket::Job {
  CopyDirection direction;
  void* dst;
  const void* src;
  uint64_t bytes;
  CopyEngine::DoneHook on_done;
  bool done = false;
  absl::Status status;
};

const char* CopyDirectionName(CopyDirection direction) {
  return direction == CopyDirection::kDeviceToHost ? "device->host" : "host->device";
}

absl::StatusOr<std::unique_ptr<CopyEngine>> CopyEngine::Create(device::Device& device,
                                                               CopyEngineOptions options) {
  if (!(options.host_link_gbps >= 0) || !std::isfinite(options.host_link_gbps)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "copy engine: host_link_gbps must be finite and >= 0, got ", options.host_link_gbps));
  }
  if (options.clock == nullptr) options.clock = &RealClock();
  if (!options.sleep_until) {
    const Clock* clock = options.clock;
    options.sleep_until = [clock](double until) {
      const double wait = until - clock->MonotonicSeconds();
      if (wait > 0) absl::SleepFor(absl::Seconds(wait));
    };
  }
  absl::StatusOr<std::unique_ptr<device::Stream>> stream = device.CreateStream();
  if (!stream.ok()) return stream.status();
  return std::unique_ptr<CopyEngine>(
      new CopyEngine(device, std::move(options), std::move(*stream)));
}

CopyEngine::CopyEngine(device::Device& device, CopyEngineOptions options,
                       std::unique_ptr<device::Stream> stream)
    : device_(device), options_(std::move(options)), stream_(std::move(stream)) {
  thread_ = std::thread([this] { Run(); });
}

CopyEngine::~CopyEngine() { Shutdown(); }

CopyTicket CopyEngine::Submit(CopyDirection direction, void* dst, const void* src, uint64_t bytes,
                              DoneHook on_done) {
  auto job = std::make_shared<CopyTicket::Job>();
  job->direction = direction;
  job->dst = dst;
  job->src = src;
  job->bytes = bytes;
  job->on_done = std::move(on_done);
  {
    absl::MutexLock lock(&mu_);
    if (!stopping_) {
      queue_.push_back(job);
      return CopyTicket(std::move(job));
    }
  }
  job->on_done = nullptr;  // a refused job's hook is never called
  Finish(job, absl::FailedPreconditionError(absl::StrCat("copy engine: shut down, refusing a ",
                                                         CopyDirectionName(direction), " copy of ",
                                                         bytes, " bytes")));
  return CopyTicket(std::move(job));
}

void CopyEngine::Finish(const std::shared_ptr<CopyTicket::Job>& job, const absl::Status& status) {
  // The hook runs before the ticket reads done, so a waiter sees what the hook did (for the
  // stash: the device bytes of an offloaded tensor already freed).
  if (job->on_done) job->on_done(status);
  absl::MutexLock lock(&mu_);
  job->status = status;
  job->done = true;
}

void CopyEngine::Run() {
  const Clock& clock = *options_.clock;
  for (;;) {
    std::shared_ptr<CopyTicket::Job> job;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](CopyEngine* e)
               ABSL_EXCLUSIVE_LOCKS_REQUIRED(e->mu_) { return e->stopping_ || !e->queue_.empty(); },
          this));
      if (queue_.empty()) return;  // stopping, and Shutdown took the queued jobs
      job = std::move(queue_.front());
      queue_.pop_front();
    }
    const double start = clock.MonotonicSeconds();
    const device::CopyKind kind = job->direction == CopyDirection::kDeviceToHost
                                      ? device::CopyKind::kDeviceToHost
                                      : device::CopyKind::kHostToDevice;
    absl::Status status = device_.Copy(job->dst, job->src, job->bytes, kind, *stream_);
    if (status.ok()) status = device_.SynchronizeStream(*stream_);
    double modelled = 0;
    if (status.ok() && options_.host_link_gbps > 0) {
      modelled = static_cast<double>(job->bytes) / (options_.host_link_gbps * 1e9);
      options_.sleep_until(start + modelled);
    }
    const double busy = clock.MonotonicSeconds() - start;
    if (status.ok()) {
      absl::MutexLock lock(&mu_);
      (job->direction == CopyDirection::kDeviceToHost ? stats_.bytes_to_host
                                                      : stats_.bytes_to_device) += job->bytes;
      ++stats_.jobs;
      stats_.busy_seconds += busy;
      stats_.modelled_seconds += modelled;
    }
    Finish(job, status);
  }
}

absl::Status CopyEngine::Wait(const CopyTicket& ticket) {
  if (!ticket.valid()) return absl::OkStatus();
  CopyTicket::Job* job = ticket.job_.get();
  absl::MutexLock lock(&mu_);
  if (!job->done) ++stats_.blocked_waits;
  mu_.Await(absl::Condition(&job->done));
  return job->status;
}

absl::Status CopyEngine::Wait(const CopyTicket& ticket, double deadline, bool* late) {
  if (late != nullptr) *late = false;
  if (!ticket.valid()) return absl::OkStatus();
  CopyTicket::Job* job = ticket.job_.get();
  const double left = deadline - options_.clock->MonotonicSeconds();
  absl::MutexLock lock(&mu_);
  if (!job->done) ++stats_.blocked_waits;
  const bool in_time =
      left > 0 ? mu_.AwaitWithTimeout(absl::Condition(&job->done), absl::Seconds(left)) : job->done;
  if (!in_time) {
    ++stats_.late_reloads;
    if (late != nullptr) *late = true;
    mu_.Await(absl::Condition(&job->done));
  }
  return job->status;
}

bool CopyEngine::Done(const CopyTicket& ticket) const {
  if (!ticket.valid()) return true;
  absl::MutexLock lock(&mu_);
  return ticket.job_->done;
}

void CopyEngine::Shutdown() {
  std::deque<std::shared_ptr<CopyTicket::Job>> cancelled;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    cancelled.swap(queue_);
  }
  for (const auto& job : cancelled) {
    Finish(job, absl::CancelledError(absl::StrCat("copy engine: shut down before a ",
                                                  CopyDirectionName(job->direction), " copy of ",
                                                  job->bytes, " bytes started")));
  }
  if (thread_.joinable()) thread_.join();
}

CopyEngineStats CopyEngine::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

}  // namespace furnace::memory
