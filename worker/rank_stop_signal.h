// SIGUSR1 on a rank process: "stop, and keep the progress". Its agent sends it before SIGTERM
// when a stop is not a failure (StopRank.checkpoint_grace_s: a cancel, a drained worker, the
// controller's graceful stop). A train rank inside its training loop then asks its Trainer for a
// checkpointed stop: every rank of the attempt stops after the same step and writes its
// checkpoint (runtime/train/trainer.h, StopToken). Anywhere else (start-up, the teardown, a
// commcheck) there is no step to keep, and the rank ends as SIGTERM ends it.
//
// Threading: InstallStopSignal, called once first thing in RankMain (before the rank starts a
// thread), blocks SIGUSR1 in the calling thread, so in every thread started after it, and starts
// a thread that takes it with sigwait: no blocking call of the training loop, NCCL or Gloo is
// interrupted (EINTR). The threads the rank's libraries started at load time (OpenBLAS's), which
// no mask set here reaches, run a handler (SA_RESTART) that does the same. Either only stores to
// lock-free atomics, or sends the rank SIGTERM.
#pragma once

#include "runtime/train/trainer.h"

namespace furnace::worker {

void InstallStopSignal();

// Where SIGUSR1 goes while a training loop runs (nullptr: nowhere, the rank ends). The token must
// outlive the process: the signal's thread may act on it just after the loop moved on.
void SetStopSignalTarget(train::StopToken* token);
// After the training loop: SIGUSR1 is ignored. The rank may have stopped on a peer's request
// before its own agent's signal came, and its checkpoint is written: it exits as it is.
void IgnoreStopSignal();

}  // namespace furnace::worker
