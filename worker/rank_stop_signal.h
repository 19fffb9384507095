// SIGUSR1 on a rank process: "stop, and keep the progress". Its agent sends it before SIGTERM
// when a stop is not a failure (StopRank.checkpoint_grace_s: a cancel, a drained worker, the
// controller's graceful stop). A train rank inside its training loop then asks its Trainer for a
// checkpointed stop: every rank of the attempt stops after the same step and writes its
// checkpoint (runtime/train/trainer.h, StopToken). Anywhere else (start-up, the teardown, a
// commcheck) there is no step to keep, and the rank ends as SIGTERM ends it.
//
// Threading: a signal handler (SA_RESTART), since the rank's libraries start threads of their own
// (OpenBLAS at load time) that no mask set here would reach; it only stores to lock-free atomics,
// or sends the rank SIGTERM. InstallStopSignal is called once, first thing in RankMain.
#pragma once

#include "runtime/train/trainer.h"

namespace furnace::worker {

void InstallStopSignal();

// Where SIGUSR1 goes while a training loop runs (borrowed; nullptr: nowhere, the rank ends).
void SetStopSignalTarget(train::StopToken* token);
// After the training loop: SIGUSR1 is ignored. The rank may have stopped on a peer's request
// before its own agent's signal came, and its checkpoint is written: it exits as it is.
void IgnoreStopSignal();

}  // namespace furnace::worker
