// CopyEngine: moves stashed tensors between device memory and the host pool off the compute
// thread, so an offload or a reload overlaps compute (DESIGN.md "Memory policies").
//
// One implementation, written against device::Device, so it is the same code on the CPU device,
// the emulated discrete device and CUDA: a copy stream per direction, and per job an event
// recorded on its copy stream after the copy. A launch enqueues the job (the copy stream first
// waits for the job's producer event, when the job has one); each direction's thread completes
// that direction's oldest launched job: it waits for the job's event (SynchronizeEvent), applies
// the link pacing, and runs the completion hook, so hooks run off the compute thread and the jobs
// of a direction complete in submission order. The two directions are independent, as a GPU's
// PCIe link and copy engines are (full duplex): a reload never waits behind an offload. On a
// discrete device Submit launches the job itself (enqueueing blocks nothing), so a job is on its
// stream at once, however long its direction's thread waits on an older one. On the CPU device a
// launch is the copy itself (synchronous), so each direction's thread launches its queued jobs:
// one copy thread per direction, in FIFO order.
//
// Ordering with the compute stream (the stream/event contract of device.h):
//  - Offload: Submit(..., producer = the compute stream) records an event on that stream at the
//    call, and the copy waits for it, so a buffer the compute stream is still writing is copied
//    after the write. Without a producer the copy orders only after what the host has finished.
//  - Reload: OrderBefore(ticket, compute stream) makes the compute stream wait for the copy's
//    event before the consumer enqueued after it; the host does not wait for the copy (on the CPU
//    device it waits until the engine's thread has launched the job). Wait(ticket) is the
//    host-side wait.
//
// Host-link pacing: on the CPU a "transfer" is a memcpy in the same RAM and would look free, while
// on an H200 a byte over PCIe costs about as much as 18,000 FLOPs at peak. With host_link_gbps > 0
// each job costs what its bytes would over that link, each way: the job starts at its launch or
// when the previous job of its direction completed, whichever is later, and completes no earlier
// than start + bytes / rate (its direction's thread sleeps until then), so a CPU run keeps a GPU's
// compute-to-link ratio.
// stats().modelled_seconds sums bytes / rate; busy_seconds sums each job's start-to-completion
// time (copy plus the pacing sleep). 0 = unpaced.
//
// Late reloads: Wait(ticket, deadline) counts the job as late when it is not done by `deadline`
// (a MonotonicSeconds reading of the engine's clock); a consumer passes "now" to ask "is the reload
// there when I need it?". OrderBefore(ticket, stream, &late) asks the same without waiting. The
// count feeds the memory planner.
//
// Ownership: the engine owns its threads, queues, copy streams and events, never the bytes: src and
// dst of a job must stay valid until its ticket is done (the stash keeps both buffers until then).
// The device and the clock must outlive the engine; a producer stream must outlive the Submit call.
// Thread-safety: every method may be called from any thread (Submit with a producer from the
// thread that drives that stream). Completion hooks run on the engine's threads (or, for jobs
// cancelled by Shutdown, on the calling thread) with no engine lock held; they must not Wait on
// the engine. A job refused at Submit (shut down, or its events could not be made) never calls
// its hook: its ticket is done at once with the error.
// Shutdown (also the destructor): launched jobs finish (a copy on a stream cannot be recalled);
// queued jobs complete with Cancelled (their hooks see that status); later Submits return a ticket
// already done with FailedPrecondition and never call their hook (so a caller may Submit under its
// own lock and find the refusal with Done()). Shutdown is called from one thread at a time.
// Errors of a copy (the device's status for the wait, copy, record or synchronize) are the job's
// status.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "runtime/base/clock.h"
#include "runtime/device/device.h"

namespace furnace::memory {

enum class CopyDirection { kDeviceToHost, kHostToDevice };
const char* CopyDirectionName(CopyDirection direction);

struct CopyEngineOptions {
  double host_link_gbps = 0;  // gigabytes (1e9 B) per second each way (full duplex); 0: unpaced
  // The clock pacing and deadlines read; nullptr: RealClock().
  const Clock* clock = nullptr;
  // Blocks a copy thread until `monotonic_s` on `clock` (each direction's thread calls it). Empty:
  // sleeps the real difference. Tests pass one that advances a FakeClock, so the modelled time is
  // exact.
  std::function<void(double monotonic_s)> sleep_until;
};

struct CopyEngineStats {
  uint64_t bytes_to_host = 0;
  uint64_t bytes_to_device = 0;
  int64_t jobs = 0;             // completed copies (not the cancelled ones)
  double busy_seconds = 0;      // sum of each job's start-to-completion time, pacing included
  double modelled_seconds = 0;  // sum of bytes / rate (0 when unpaced)
  int64_t late_reloads = 0;     // Waits whose job was not done by their deadline
  int64_t blocked_waits = 0;    // Waits (with or without a deadline) that found their job not done
};

class CopyEngine;

// A job's completion, to wait on. Copyable; an empty ticket is "no job".
class CopyTicket {
 public:
  CopyTicket() = default;
  bool valid() const { return job_ != nullptr; }

 private:
  friend class CopyEngine;
  struct Job;
  explicit CopyTicket(std::shared_ptr<Job> job) : job_(std::move(job)) {}
  std::shared_ptr<Job> job_;
};

class CopyEngine {
 public:
  // Called once with the job's status when it completes or is cancelled.
  using DoneHook = std::function<void(const absl::Status&)>;

  // InvalidArgument for a negative or non-finite host_link_gbps; the device's CreateStream error.
  static absl::StatusOr<std::unique_ptr<CopyEngine>> Create(device::Device& device,
                                                            CopyEngineOptions options = {});
  ~CopyEngine();
  CopyEngine(const CopyEngine&) = delete;
  CopyEngine& operator=(const CopyEngine&) = delete;

  // Enqueues a copy of `bytes` from src to dst; returns at once. With `producer`, an event is
  // recorded on that stream now and the copy runs after it (the offload of a buffer the producer
  // is still writing); the device's error for that is the job's status.
  CopyTicket Submit(CopyDirection direction, void* dst, const void* src, uint64_t bytes,
                    DoneHook on_done = nullptr, device::Stream* producer = nullptr);
  // Makes `consumer` wait (on the device) for the job's copy: work enqueued on `consumer` after
  // this call runs after the copy (the reload before its consumer). Blocks the host only until the
  // job is launched. The job's status when it failed or was cancelled; OK for an empty ticket.
  // With `late`: the job counts as a late reload (stats().late_reloads, *late) when it is not done
  // at the call (the consumer's stream will wait for it), the stream-ordered counterpart of
  // Wait(ticket, now, late).
  absl::Status OrderBefore(const CopyTicket& ticket, device::Stream& consumer,
                           bool* late = nullptr);
  // Blocks until the job is done; its status. An empty ticket: OK at once.
  absl::Status Wait(const CopyTicket& ticket);
  // As Wait, and counts a late reload (and sets *late) when the job is not done by `deadline`.
  absl::Status Wait(const CopyTicket& ticket, double deadline, bool* late = nullptr);
  bool Done(const CopyTicket& ticket) const;

  void Shutdown();
  CopyEngineStats stats() const;
  double host_link_gbps() const { return options_.host_link_gbps; }
  const Clock& clock() const { return *options_.clock; }
  device::Device& device() const { return device_; }
  // The copy stream of a direction (to pause it in tests, or to order other work after it).
  device::Stream& stream(CopyDirection direction) const {
    return direction == CopyDirection::kDeviceToHost ? *to_host_ : *to_device_;
  }

 private:
  CopyEngine(device::Device& device, CopyEngineOptions options,
             std::unique_ptr<device::Stream> to_host, std::unique_ptr<device::Stream> to_device);
  // The thread of one direction: launches its queued jobs (CPU device) and completes them.
  void Run(int direction);
  // Enqueues the job's copy (and its event) and queues it for completion, with the outcome.
  void Launch(const std::shared_ptr<CopyTicket::Job>& job);
  // The device calls of a launch: the wait for the producer, the copy, the event.
  absl::Status Enqueue(CopyTicket::Job& job);
  void Complete(const std::shared_ptr<CopyTicket::Job>& job, double& last_completion);
  void Finish(const std::shared_ptr<CopyTicket::Job>& job, const absl::Status& status);

  device::Device& device_;
  const CopyEngineOptions options_;
  std::unique_ptr<device::Stream> to_host_;    // device->host copies
  std::unique_ptr<device::Stream> to_device_;  // host->device copies
  const bool launch_at_submit_;  // a discrete device: enqueueing a copy does not do it
  // Held across a launch at Submit: jobs reach each copy stream in submission order.
  absl::Mutex launch_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  mutable absl::Mutex mu_;
  // Per direction (index: CopyDirection): not yet launched; launched and not yet completed, oldest
  // first (that direction's thread completes them in this order).
  std::deque<std::shared_ptr<CopyTicket::Job>> queue_[2] ABSL_GUARDED_BY(mu_);
  std::deque<std::shared_ptr<CopyTicket::Job>> launched_[2] ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  CopyEngineStats stats_ ABSL_GUARDED_BY(mu_);
  std::thread threads_[2];
};

}  // namespace furnace::memory
