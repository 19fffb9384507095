#include "worker/rank_watchdog.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace furnace::worker {
namespace {

constexpr double kDefaultHangS = 60;  // the spec's defaults, for a task that carries none
constexpr double kDefaultStartS = 60;

std::string Collective(const furnace::v1::InFlightCollective& c) {
  std::string out = absl::StrFormat("%s on group %s (%d rank%s", c.op(), c.group(), c.group_size(),
                                    c.group_size() == 1 ? "" : "s");
  if (c.peer() >= 0) absl::StrAppend(&out, ", peer ", c.peer());
  absl::StrAppend(&out, ")");
  return out;
}

}  // namespace

WatchdogTimeouts WatchdogTimeoutsFor(const furnace::v1::RecoverySpec& recovery) {
  const double hang = recovery.hang_timeout_s() > 0 ? recovery.hang_timeout_s() : kDefaultHangS;
  const double start = recovery.start_timeout_s() > 0 ? recovery.start_timeout_s() : kDefaultStartS;
  WatchdogTimeouts t;
  t.startup_s = start + hang;
  t.step_s = hang;
  t.checkpoint_s = hang;
  t.eval_s = hang;
  t.heartbeat_s = std::min(1.0, hang / 4);
  return t;
}

double DataScanAllowanceS(uint64_t sequential_bytes, int64_t scattered_reads) {
  return static_cast<double>(sequential_bytes) / kDataScanBytesPerS +
         static_cast<double>(scattered_reads) * kScatteredReadS;
}

double EvalTimeoutS(const WatchdogTimeouts& timeouts, int64_t batches, int64_t dp,
                    int64_t micro_batches) {
  dp = std::max<int64_t>(1, dp);
  micro_batches = std::max<int64_t>(1, micro_batches);
  const int64_t per_rank = (std::max<int64_t>(0, batches) + dp - 1) / dp;
  const int64_t steps = std::max<int64_t>(1, (per_rank + micro_batches - 1) / micro_batches);
  return timeouts.step_s * static_cast<double>(steps);
}

RankWatchdog::RankWatchdog(WatchdogTimeouts timeouts, const Clock& clock,
                           const comm::InFlightCollectives& in_flight)
    : timeouts_(timeouts), clock_(clock), in_flight_(in_flight) {}

void RankWatchdog::Enter(Phase phase, uint64_t step, const std::string& detail, double timeout_s) {
  std::lock_guard<std::mutex> lock(mu_);
  phase_ = phase;
  step_ = step;
  detail_ = detail;
  since_s_ = clock_.MonotonicSeconds();
  timeout_s_ = timeout_s;
}

void RankWatchdog::EnterStartup(const std::string& detail) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (phase_ == Phase::kStartup) {
      detail_ = detail;
      return;
    }
  }
  Enter(Phase::kStartup, 0, detail, timeouts_.startup_s);
}

void RankWatchdog::EnterStep(uint64_t step) { Enter(Phase::kStep, step, "", timeouts_.step_s); }

void RankWatchdog::EnterCheckpoint(uint64_t after_step, bool final) {
  double extra_s;
  {
    std::lock_guard<std::mutex> lock(mu_);
    extra_s = checkpoint_extra_s_;
  }
  Enter(Phase::kCheckpoint, after_step, final ? "the final one" : "",
        timeouts_.checkpoint_s + extra_s);
}

void RankWatchdog::AllowForCheckpointBytes(uint64_t bytes) {
  // Whole tenths of a second (a timeout read as 8.1 s, not 8.00115 s); none for a small shard.
  const double extra_s = std::round(static_cast<double>(bytes) / kDataScanBytesPerS * 10) / 10;
  if (extra_s < 0.1) return;
  std::lock_guard<std::mutex> lock(mu_);
  checkpoint_extra_s_ = extra_s;
  checkpoint_bytes_ = bytes;
  if (phase_ == Phase::kStartup) timeout_s_ += checkpoint_extra_s_;
}

void RankWatchdog::AppendCheckpointAllowanceLocked(std::string& limit) const {
  if (checkpoint_extra_s_ <= 0) return;
  absl::StrAppend(
      &limit, absl::StrFormat(" + %.1f s for the largest checkpoint shard (%.2f GB)",
                              checkpoint_extra_s_, static_cast<double>(checkpoint_bytes_) / 1e9));
}

void RankWatchdog::EnterEval(uint64_t after_step) {
  Enter(Phase::kEval, after_step, "", timeouts_.eval_s);
}

void RankWatchdog::EnterFinishing(const std::string& outcome) {
  uint64_t step;
  {
    std::lock_guard<std::mutex> lock(mu_);
    step = step_;
  }
  Enter(Phase::kFinishing, step, outcome, timeouts_.step_s);
}

void RankWatchdog::Disarm() {
  std::lock_guard<std::mutex> lock(mu_);
  phase_ = Phase::kNone;
}

furnace::v1::RankWatchdogRecord RankWatchdog::Check() {
  furnace::v1::RankWatchdogRecord record;
  std::lock_guard<std::mutex> lock(mu_);
  if (phase_ == Phase::kNone || reported_) return record;
  const double now = clock_.MonotonicSeconds();
  const double in_phase = now - since_s_;
  record.set_step(step_);
  record.set_detail(detail_);
  record.set_phase_s(in_phase);
  record.set_timeout_s(timeout_s_);
  // What the phase is called, where a hang in it is, and which setting bounds it.
  std::string name, where, limit = "recovery.hang_timeout_s";
  switch (phase_) {
    case Phase::kStartup:
      name = "start-up";
      where = absl::StrCat("start-up (", detail_, ")");
      limit = "recovery.start_timeout_s + recovery.hang_timeout_s";
      AppendCheckpointAllowanceLocked(limit);
      break;
    case Phase::kStep:
      name = "step";
      where = absl::StrCat("step ", step_);
      break;
    case Phase::kEval:
      name = "evaluation";
      where = absl::StrCat("the held-out evaluation after step ", step_);
      limit = "recovery.hang_timeout_s for each parallel.micro_batches held-out batches of a rank";
      break;
    case Phase::kFinishing:
      name = "finishing";
      where = absl::StrCat("finishing (after: ", detail_, ")");
      break;
    default:
      name = "checkpoint";
      where = detail_.empty()
                  ? absl::StrCat("the checkpoint after step ", step_)
                  : absl::StrCat("the checkpoint after step ", step_, " (", detail_, ")");
      AppendCheckpointAllowanceLocked(limit);
      break;
  }
  record.set_phase(name);
  if (const std::optional<comm::InFlightCall> call = in_flight_.Oldest()) {
    furnace::v1::InFlightCollective* c = record.mutable_collective();
    c->set_op(call->op);
    c->set_group(call->group);
    c->set_group_size(static_cast<uint32_t>(call->group_size));
    c->set_peer(call->peer);
    c->set_for_s(std::max(0.0, now - call->since_s));
    c->set_queued(!call->started);
  }
  record.set_collectives_in_flight(static_cast<uint32_t>(in_flight_.count()));
  if (in_phase <= timeout_s_) {
    record.set_kind(furnace::v1::RankWatchdogRecord::KIND_HEARTBEAT);
    return record;
  }
  reported_ = true;
  record.set_kind(furnace::v1::RankWatchdogRecord::KIND_HUNG);
  std::string what;
  if (record.has_collective() && record.collective().queued()) {
    // Its stream never reached the collective: this rank's own device work before it is stuck,
    // and its peers are the ones waiting.
    what = absl::StrFormat(
        ": %s queued behind this rank's own device work for %.1f s (not started on its stream: "
        "a kernel or copy before it has not finished)",
        Collective(record.collective()), record.collective().for_s());
  } else if (record.has_collective()) {
    what = absl::StrFormat(": %s for %.1f s", Collective(record.collective()),
                           record.collective().for_s());
    if (record.collectives_in_flight() > 1) {
      absl::StrAppend(&what, " (", record.collectives_in_flight() - 1, " more in flight)");
    }
  } else {
    what = ": not in a collective (its own compute, I/O or a lock)";
  }
  // (The timeout as given, 0.6 or 120: not rounded to whole seconds.)
  record.set_reason(absl::StrFormat("hung in %s%s; the %s had run %.1f s, timeout %s s (%s)", where,
                                    what, record.phase(), in_phase, absl::StrCat(timeout_s_),
                                    limit));
  return record;
}

WatchdogThread::WatchdogThread(RankWatchdog& watchdog,
                               std::function<void(const furnace::v1::RankWatchdogRecord&)> emit)
    : watchdog_(watchdog), emit_(std::move(emit)), thread_(&WatchdogThread::Main, this) {}

WatchdogThread::~WatchdogThread() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void WatchdogThread::Main() {
  const auto interval = std::chrono::duration<double>(watchdog_.timeouts().heartbeat_s);
  std::unique_lock<std::mutex> lock(mu_);
  // The first check at once: its heartbeat tells the agent from the start that this rank has a
  // watchdog (so the agent gives a silent rank the frozen timeout, 1.5 x hang_timeout_s, and the
  // watchdog of a rank blocked on it reports first), even if the rank is stopped within the first
  // interval.
  do {
    lock.unlock();
    const furnace::v1::RankWatchdogRecord record = watchdog_.Check();
    if (record.kind() != furnace::v1::RankWatchdogRecord::KIND_UNSPECIFIED) emit_(record);
    lock.lock();
  } while (!cv_.wait_for(lock, interval, [&] { return stop_; }));
}

}  // namespace furnace::worker
