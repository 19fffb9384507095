// CopyEngine: moves stashed tensors between device memory and the host pool off the compute
// thread, so an offload or a reload overlaps compute (DESIGN.md "Memory policies").
//
// This build has the CPU implementation: one copy thread that takes device->host and host->device
// jobs in FIFO order and copies with Device::Copy. A CUDA implementation (a copy stream, one event
// recorded per job, cudaLaunchHostFunc or an event poll for the completion hook) is NOT built
// here: there is no GPU path yet. The interface is the one such an implementation would satisfy:
// Submit enqueues and returns at once, a ticket is an event to wait on, completion hooks run off
// the compute thread, and jobs complete in submission order.
//
// Host-link pacing: on the CPU a "transfer" is a memcpy in the same RAM and would look free, while
// on an H200 a byte over PCIe costs about as much as 18,000 FLOPs at peak. With host_link_gbps > 0
// each job costs what its bytes would over that link: the copy thread sleeps until
// start + bytes / rate (start: when it took the job), so a CPU run keeps a GPU's compute-to-link
// ratio. stats().modelled_seconds sums bytes / rate; busy_seconds is the copy thread's measured
// time (memcpy plus the pacing sleep). 0 = unpaced.
//
// Late reloads: Wait(ticket, deadline) counts the job as late when it is not done by `deadline`
// (a MonotonicSeconds reading of the engine's clock); a consumer passes "now" to ask "is the reload
// there when I need it?". The count feeds the memory planner.
//
// Ownership: the engine owns its thread and queue, never the bytes: src and dst of a job must stay
// valid until its ticket is done (the stash keeps both buffers until then). The device and the
// clock must outlive the engine.
// Thread-safety: every method may be called from any thread. Completion hooks run on the copy
// thread (or, for jobs cancelled by Shutdown, on the thread calling Shutdown) with no engine lock
// held; they must not Wait on the engine.
// Shutdown (also the destructor): the job being copied finishes; queued jobs complete with
// Cancelled (their hooks see that status); later Submits return a ticket already done with
// FailedPrecondition and never call their hook (so a caller may Submit under its own lock and
// find the refusal with Done()). Shutdown is called from one thread at a time.
// Errors of a copy (Device::Copy's status) are the job's status.
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
  double host_link_gbps = 0;  // gigabytes (1e9 B) per second each way; 0: unpaced
  // The clock pacing and deadlines read; nullptr: RealClock().
  const Clock* clock = nullptr;
  // Blocks the copy thread until `monotonic_s` on `clock`. Empty: sleeps the real difference.
  // Tests pass one that advances a FakeClock, so the modelled time is exact.
  std::function<void(double monotonic_s)> sleep_until;
};

struct CopyEngineStats {
  uint64_t bytes_to_host = 0;
  uint64_t bytes_to_device = 0;
  int64_t jobs = 0;             // completed copies (not the cancelled ones)
  double busy_seconds = 0;      // copy thread time spent on jobs, pacing included
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

  // Enqueues a copy of `bytes` from src to dst; returns at once.
  CopyTicket Submit(CopyDirection direction, void* dst, const void* src, uint64_t bytes,
                    DoneHook on_done = nullptr);
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

 private:
  CopyEngine(device::Device& device, CopyEngineOptions options,
             std::unique_ptr<device::Stream> stream);
  void Run();
  void Finish(const std::shared_ptr<CopyTicket::Job>& job, const absl::Status& status);

  device::Device& device_;
  const CopyEngineOptions options_;
  std::unique_ptr<device::Stream> stream_;  // the copy thread's only
  mutable absl::Mutex mu_;
  std::deque<std::shared_ptr<CopyTicket::Job>> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  CopyEngineStats stats_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace furnace::memory
