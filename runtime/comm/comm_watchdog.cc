// CommWatchdog (comm_watchdog.h): one thread polling the outstanding collectives' end marks, the
// oldest one's age, and the transports' asynchronous errors.
#include "runtime/comm/comm_watchdog.h"

#include <chrono>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "runtime/comm/in_flight.h"
#include "runtime/comm/stream_communicator.h"

namespace furnace::comm {
namespace {

std::chrono::steady_clock::duration Duration(double seconds) {
  return std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::duration<double>(seconds));
}

}  // namespace

absl::StatusOr<std::shared_ptr<CommWatchdog>> CommWatchdog::Create(CommWatchdogOptions options) {
  if (!(options.timeout_s > 0) || !(options.poll_interval_s > 0) ||
      !(options.async_error_interval_s > 0)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "comm watchdog: timeout_s %g, poll_interval_s %g and async_error_interval_s %g must all "
        "be > 0",
        options.timeout_s, options.poll_interval_s, options.async_error_interval_s));
  }
  return std::shared_ptr<CommWatchdog>(new CommWatchdog(options));
}

CommWatchdog::CommWatchdog(CommWatchdogOptions options)
    : options_(options), clock_(options.clock != nullptr ? *options.clock : RealClock()) {
  thread_ = std::thread([this] { Main(); });
}

CommWatchdog::~CommWatchdog() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    ClearPendingLocked();
  }
  cv_.notify_all();
  thread_.join();
}

absl::Status CommWatchdog::error() const {
  std::lock_guard<std::mutex> lock(mu_);
  return error_;
}

size_t CommWatchdog::outstanding() const {
  std::lock_guard<std::mutex> lock(mu_);
  return pending_.size();
}

void CommWatchdog::Register(StreamCommunicator* comm) {
  std::lock_guard<std::mutex> lock(mu_);
  comms_.insert(comm);
  // A communicator that joins after the rank has been stopped is stopped too.
  if (!error_.ok()) comm->Fail(error_);
}

void CommWatchdog::Unregister(StreamCommunicator* comm) {
  std::lock_guard<std::mutex> lock(mu_);
  comms_.erase(comm);
  for (auto it = pending_.begin(); it != pending_.end();) {
    if (it->comm == comm) {
      ProcessInFlight().End(it->in_flight_token);
      it = pending_.erase(it);
    } else {
      ++it;
    }
  }
}

void CommWatchdog::Track(StreamCommunicator* comm, CollectiveOp op, const char* name, int peer,
                         int64_t bytes, std::shared_ptr<StreamMark> start,
                         std::shared_ptr<StreamMark> end, bool counted) {
  const uint64_t token =
      ProcessInFlight().Begin(name, comm->name(), comm->size(), peer, /*started=*/false);
  {
    std::lock_guard<std::mutex> lock(mu_);
    pending_.push_back({comm, op, name, peer, bytes, std::move(start), std::move(end),
                        clock_.MonotonicSeconds(), token, /*started=*/false, counted});
  }
  cv_.notify_all();
}

void CommWatchdog::AbortAll(absl::Status status) {
  std::lock_guard<std::mutex> lock(mu_);
  AbortAllLocked(std::move(status));
}

void CommWatchdog::AbortAllLocked(absl::Status status) {
  if (!error_.ok() || status.ok()) return;
  error_ = std::move(status);
  // Every communicator shows the error first: an abort may wait for the device (NCCL's frees).
  for (StreamCommunicator* comm : comms_) comm->RecordError(error_).IgnoreError();
  // All at once, one thread each: an NCCL abort frees device memory, which waits for the device,
  // which may be held by a kernel of another communicator still stuck on a dead peer; aborted one
  // after the other, the first abort would wait for the second forever.
  std::vector<std::thread> aborts;
  // Here: the only one, or (the last resort) those no thread could be had for.
  std::vector<StreamCommunicator*> inline_aborts;
  for (StreamCommunicator* comm : comms_) {
    if (comms_.size() == 1) {
      inline_aborts.push_back(comm);
      continue;
    }
    try {
      aborts.emplace_back([comm] { comm->AbortTransport(); });
    } catch (const std::system_error&) {
      inline_aborts.push_back(comm);
    }
  }
  // After every thread has started, so each of those is already under way meanwhile.
  for (StreamCommunicator* comm : inline_aborts) comm->AbortTransport();
  for (std::thread& t : aborts) t.join();
  // What was outstanding has been dealt with: it no longer holds the rank.
  ClearPendingLocked();
}

void CommWatchdog::ClearPendingLocked() {
  for (Pending& p : pending_) ProcessInFlight().End(p.in_flight_token);
  pending_.clear();
}

absl::Status CommWatchdog::CheckPendingLocked() {
  const double now = clock_.MonotonicSeconds();
  for (auto it = pending_.begin(); it != pending_.end();) {
    absl::StatusOr<bool> passed = it->end->Passed();
    if (!passed.ok()) {
      return absl::Status(passed.status().code(),
                          absl::StrCat(it->name, " on ", it->comm->name(),
                                       ": the device failed while it was outstanding: ",
                                       passed.status().message()));
    }
    if (!*passed) {
      // Not done: has its stream reached it (waiting on its peers), or is it still queued behind
      // this rank's own device work?
      if (!it->started) {
        absl::StatusOr<bool> started = it->start->Passed();
        if (started.ok() && *started) {
          it->started = true;
          ProcessInFlight().MarkStarted(it->in_flight_token);
        }
      }
      ++it;
      continue;
    }
    if (it->counted) {
      absl::StatusOr<double> seconds = it->end->SecondsSince(*it->start);
      it->comm->AddStreamTime(it->op, it->bytes, seconds.ok() ? *seconds : 0.0);
    }
    ProcessInFlight().End(it->in_flight_token);
    it = pending_.erase(it);
  }
  // In enqueue order: the first left is the oldest, the one the others wait behind.
  if (pending_.empty()) return absl::OkStatus();
  const Pending& oldest = pending_.front();
  const double age = now - oldest.since_s;
  if (age < options_.timeout_s) return absl::OkStatus();
  const int n = oldest.comm->size();
  // Not started: the stream never reached it, this rank's own device work before it did not
  // finish (a stuck kernel), which its peers, waiting in the collective, cannot tell apart.
  return absl::DeadlineExceededError(absl::StrFormat(
      "%s%s on %s (%d rank%s) not %s on its stream after %.1f s (collective timeout %g s): "
      "every communicator of this rank is aborted",
      oldest.name, oldest.peer >= 0 ? absl::StrCat(" with peer ", oldest.peer) : "",
      oldest.comm->name(), n, n == 1 ? "" : "s",
      oldest.started ? "complete"
                     : "started (queued behind this rank's own device work, which has not "
                       "finished)",
      age, options_.timeout_s));
}

absl::Status CommWatchdog::CheckTransportsLocked() {
  for (StreamCommunicator* comm : comms_) {
    const absl::Status status = comm->transport().AsyncError();
    if (status.ok()) continue;
    return absl::Status(status.code(),
                        absl::StrCat("group ", comm->name(), " failed (", status.message(),
                                     "): every communicator of this rank is aborted"));
  }
  return absl::OkStatus();
}

void CommWatchdog::Main() {
  auto next_async = std::chrono::steady_clock::now();
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    const auto wait = pending_.empty() ? Duration(options_.async_error_interval_s)
                                       : Duration(options_.poll_interval_s);
    cv_.wait_for(lock, wait);
    if (stop_) break;
    if (!error_.ok()) {
      ClearPendingLocked();  // tracked by a call that was under way when the rank was stopped
      continue;
    }
    absl::Status status = CheckPendingLocked();
    if (status.ok() && std::chrono::steady_clock::now() >= next_async) {
      status = CheckTransportsLocked();
      next_async = std::chrono::steady_clock::now() + Duration(options_.async_error_interval_s);
    }
    if (!status.ok()) AbortAllLocked(std::move(status));
  }
}

}  // namespace furnace::comm
