// The rank process: `furnace-worker rank --task FILE`, spawned by the agent for one rank of one
// job attempt. It reads its RankTask (binary furnace.v1.RankTask), reports progress as
// TelemetryRecords on fd 3 (worker/telemetry_pipe.h; every record is progress for the agent's hang
// watchdog) and logs to stdout/stderr, which the agent captures line by line.
//
// It makes the rank's device once (resources.device, rank_device.h), runs the health check on it
// (health_check.h), then the kind: "commcheck" rendezvouses through the controller's KV store
// (worker/grpc_kv_store.h), connects the world group on the device (NCCL between GPUs, Gloo
// between CPU ranks) and runs runtime/comm's RunCommcheck; "train" runs train_rank.h. Other kinds
// exit with RANK_EXIT_UNKNOWN_KIND.
//
// Fault injection (spec.fault, for tests and chaos drills) fires on fault.rank, in attempt 1 only
// unless fault.every_attempt, when the completed-round count reaches fault.at_step: "crash" raises
// SIGSEGV, "hang" stops reporting and sleeps until killed, "exit" exits with fault.exit_code.
//
// Exit codes: worker/rank_exit.h (0 success, 1 error, 2 unknown kind, 3 out of memory), or the
// fault's code. The last telemetry record carries the reason in `message`.
#pragma once

#include <string>

namespace furnace::worker {

// Runs the rank to completion on the calling thread and returns the process exit code.
int RankMain(const std::string& task_path);

}  // namespace furnace::worker
