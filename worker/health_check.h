// The health check every attempt with more than one rank runs before its real work (train or
// commcheck), bounded by recovery.health_check_s (0 turns it off). The controller's side, which
// turns a failure into an excluded worker, is controller/service/restart_ladder.cc.
//
// Why arrival keys: a collective that times out fails on every rank alike and names nobody. So
// each rank first writes "health/arrived/<rank>" into the attempt's rendezvous store (the
// controller's) and waits for every other rank's key (an indexed wait: a count on the wire, not N
// key names, so thousands of ranks arrive in O(N) bytes in all), at most the longer of
// recovery.start_timeout_s and recovery.health_check_s from its own arrival: reaching the check is
// start-up, and on a loaded host the ranks' start-up skew can be seconds. The controller, told by
// any rank that the check failed, reads which keys are missing and blames exactly those ranks'
// workers.
// Ranks that all arrived then run the commcheck collectives (allreduce, allgather, alltoall,
// broadcast at 4 KiB and 64 KiB, one checked call each, every call bounded by the same time) on a
// group of their own on the rank's device (keys under "health/group/": NCCL between GPUs, Gloo
// between CPU ranks), so a broken link, GPU or corrupting peer fails the check before any
// training step.
#pragma once

#include "absl/status/status.h"
#include "furnace/v1/agent.pb.h"
#include "runtime/device/device.h"
#include "worker/rank_progress.h"

namespace furnace::worker {

// OK when this rank passed (or the check is off: recovery.health_check_s 0, or one rank). Any
// error is the check's failure with the reason in words; the rank then exits with
// RANK_EXIT_HEALTH_CHECK. Under fault.mode health_check the targeted rank never arrives: it
// stays here, alive and reporting progress (a rank that cannot reach the rendezvous), until it is
// stopped.
// `device`: the rank's (rank_device.h), its compute stream current on this thread.
absl::Status RunHealthCheck(const furnace::v1::RankTask& task, Progress& progress,
                            device::Device& device);

}  // namespace furnace::worker
