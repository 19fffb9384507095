#include "runtime/memory/copy_engine.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "runtime/base/status.h"

namespace furnace::memory {

// Fields written by the engine's thread (or Shutdown, or Submit) under the engine's mutex, except
// the events, which are set before the job is shared, and copy_enqueued, which Enqueue sets while
// it launches the job (at Submit under launch_mu_, or on the engine's thread) and only the
// engine's thread reads, after that launch.
struct CopyTicket::Job {
  CopyDirection direction;
  void* dst;
  const void* src;
  uint64_t bytes;
  CopyEngine::DoneHook on_done;
  std::unique_ptr<device::Event> producer;  // recorded on the producer stream at Submit, or null
  std::unique_ptr<device::Event> copied;    // recorded on the copy stream after the copy
  bool launched = false;
  // Set by Enqueue: the copy is on its stream (even if recording its event then failed).
  bool copy_enqueued = false;
  absl::Status launch_status;
  double launched_at = 0;
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
  ASSIGN_OR_RETURN(std::unique_ptr<device::Stream> to_host, device.CreateStream());
  ASSIGN_OR_RETURN(std::unique_ptr<device::Stream> to_device, device.CreateStream());
  return std::unique_ptr<CopyEngine>(
      new CopyEngine(device, std::move(options), std::move(to_host), std::move(to_device)));
}

CopyEngine::CopyEngine(device::Device& device, CopyEngineOptions options,
                       std::unique_ptr<device::Stream> to_host,
                       std::unique_ptr<device::Stream> to_device)
    : device_(device),
      options_(std::move(options)),
      to_host_(std::move(to_host)),
      to_device_(std::move(to_device)),
      launch_at_submit_(!device::HostAddressable(device)) {
  for (int d = 0; d < 2; ++d) threads_[d] = std::thread([this, d] { Run(d); });
}

CopyEngine::~CopyEngine() { Shutdown(); }

CopyTicket CopyEngine::Submit(CopyDirection direction, void* dst, const void* src, uint64_t bytes,
                              DoneHook on_done, device::Stream* producer) {
  auto job = std::make_shared<CopyTicket::Job>();
  job->direction = direction;
  job->dst = dst;
  job->src = src;
  job->bytes = bytes;
  job->on_done = std::move(on_done);
  absl::Status events = [&]() -> absl::Status {
    ASSIGN_OR_RETURN(job->copied, device_.CreateEvent());
    if (producer == nullptr) return absl::OkStatus();
    ASSIGN_OR_RETURN(job->producer, device_.CreateEvent());
    return device_.RecordEvent(*job->producer, *producer);
  }();
  if (events.ok() && launch_at_submit_) {
    absl::MutexLock launch(&launch_mu_);
    bool stopping;
    {
      absl::MutexLock lock(&mu_);
      stopping = stopping_;
    }
    if (!stopping) {
      Launch(job);
      return CopyTicket(std::move(job));
    }
  } else if (events.ok()) {
    absl::MutexLock lock(&mu_);
    if (!stopping_) {
      queue_[static_cast<int>(direction)].push_back(job);
      return CopyTicket(std::move(job));
    }
  }
  if (!events.ok()) {
    // Refused: the hook is never called, as for a refusal at shutdown (the caller may hold the
    // lock its hook takes, and finds the refusal with Done()).
    job->on_done = nullptr;
    Finish(job, absl::Status(events.code(),
                             absl::StrCat("copy engine: ", CopyDirectionName(direction),
                                          " copy of ", bytes, " bytes: ", events.message())));
    return CopyTicket(std::move(job));
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

void CopyEngine::Launch(const std::shared_ptr<CopyTicket::Job>& job) {
  absl::Status status = Enqueue(*job);
  const double now = options_.clock->MonotonicSeconds();
  absl::MutexLock lock(&mu_);
  job->launch_status = std::move(status);
  job->launched_at = now;
  job->launched = true;
  launched_[static_cast<int>(job->direction)].push_back(job);
}

absl::Status CopyEngine::Enqueue(CopyTicket::Job& job) {
  device::Stream& copy_stream = stream(job.direction);
  if (job.producer != nullptr) RETURN_IF_ERROR(device_.WaitEvent(copy_stream, *job.producer));
  const device::CopyKind kind = job.direction == CopyDirection::kDeviceToHost
                                    ? device::CopyKind::kDeviceToHost
                                    : device::CopyKind::kHostToDevice;
  RETURN_IF_ERROR(device_.Copy(job.dst, job.src, job.bytes, kind, copy_stream));
  job.copy_enqueued = true;
  return device_.RecordEvent(*job.copied, copy_stream);
}

void CopyEngine::Complete(const std::shared_ptr<CopyTicket::Job>& job, double& last_completion) {
  const Clock& clock = *options_.clock;
  absl::Status status;
  double start;
  bool copy_enqueued;
  {
    absl::MutexLock lock(&mu_);
    status = job->launch_status;
    copy_enqueued = job->copy_enqueued;
    start = std::max(job->launched_at, last_completion);
  }
  if (status.ok()) {
    status = device_.SynchronizeEvent(*job->copied);
  } else if (copy_enqueued) {
    // The copy is on its stream but no event says when it is done: wait for the stream (here, off
    // the thread that submitted), or the hook would free or hand out again buffers the copy still
    // reads or writes.
    device_.SynchronizeStream(stream(job->direction)).IgnoreError();
  }
  double modelled = 0;
  if (status.ok() && options_.host_link_gbps > 0) {
    modelled = static_cast<double>(job->bytes) / (options_.host_link_gbps * 1e9);
    options_.sleep_until(start + modelled);
  }
  last_completion = clock.MonotonicSeconds();
  if (status.ok()) {
    absl::MutexLock lock(&mu_);
    (job->direction == CopyDirection::kDeviceToHost ? stats_.bytes_to_host
                                                    : stats_.bytes_to_device) += job->bytes;
    ++stats_.jobs;
    stats_.busy_seconds += last_completion - start;
    stats_.modelled_seconds += modelled;
  }
  Finish(job, status);
}

void CopyEngine::Run(int direction) {
  const Clock& clock = *options_.clock;
  double last_completion = clock.MonotonicSeconds();
  std::deque<std::shared_ptr<CopyTicket::Job>>& queue = queue_[direction];
  std::deque<std::shared_ptr<CopyTicket::Job>>& launched = launched_[direction];
  struct Mine {
    CopyEngine* engine;
    int direction;
  } mine{this, direction};
  for (;;) {
    std::deque<std::shared_ptr<CopyTicket::Job>> to_launch;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](Mine* m) ABSL_NO_THREAD_SAFETY_ANALYSIS {  // (mu_ is held by Await)
            CopyEngine* e = m->engine;
            return e->stopping_ || !e->queue_[m->direction].empty() ||
                   !e->launched_[m->direction].empty();
          },
          &mine));
      // Stopping: Shutdown took the queued jobs; the launched ones still complete.
      if (queue.empty() && launched.empty()) return;
      to_launch.swap(queue);
    }
    // The CPU device's jobs (a discrete device's were launched at Submit).
    for (const std::shared_ptr<CopyTicket::Job>& job : to_launch) Launch(job);
    std::shared_ptr<CopyTicket::Job> head;
    {
      absl::MutexLock lock(&mu_);
      head = std::move(launched.front());
      launched.pop_front();
    }
    Complete(head, last_completion);
  }
}

absl::Status CopyEngine::OrderBefore(const CopyTicket& ticket, device::Stream& consumer,
                                     bool* late) {
  if (late != nullptr) *late = false;
  if (!ticket.valid()) return absl::OkStatus();
  CopyTicket::Job* job = ticket.job_.get();
  {
    absl::MutexLock lock(&mu_);
    if (late != nullptr && !job->done) {
      ++stats_.late_reloads;
      *late = true;
    }
    mu_.Await(absl::Condition(
        +[](CopyTicket::Job* j) { return j->launched || j->done; }, job));
    if (job->done) return job->status;  // complete (or refused, or cancelled): nothing to wait
    if (!job->launch_status.ok()) return job->launch_status;
  }
  return device_.WaitEvent(consumer, *job->copied);
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
    // After any launch under way at Submit: it is then in launched_, which still completes.
    absl::MutexLock launch(&launch_mu_);
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    for (auto& queue : queue_) {
      for (auto& job : queue) cancelled.push_back(std::move(job));
      queue.clear();
    }
  }
  for (const auto& job : cancelled) {
    Finish(job, absl::CancelledError(absl::StrCat("copy engine: shut down before a ",
                                                  CopyDirectionName(job->direction), " copy of ",
                                                  job->bytes, " bytes started")));
  }
  for (std::thread& t : threads_) {
    if (t.joinable()) t.join();
  }
}

CopyEngineStats CopyEngine::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

}  // namespace furnace::memory
