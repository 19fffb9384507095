// checkpoint.every auto: the checkpoint interval from Young/Daly. A checkpoint every T seconds
// costs C/T of the time in stalls, and a failure every M seconds (the MTBF) loses on average T/2 of
// work since the last checkpoint; the sum C/T + T/(2M) is smallest at T = sqrt(2 C M). Here C is
// the measured checkpoint stall per checkpoint (what a checkpoint holds a step: the whole write
// when synchronous, the snapshot and any wait under checkpoint.async), M comes from the controller
// (the job's observed MTBF, or a prior before its first failure), and T becomes steps with the
// measured step time.
//
// Every rank must checkpoint at the same steps (a checkpoint is a collective), so every rank
// decides from the same numbers: after each step the ranks agree on the inputs (the largest stall
// and step time of any rank, AgreeIntervalInputs over the world group) and feed them to Update;
// the same sequence of agreed inputs gives every rank the same intervals.
//
// Before any stall is known (the first attempt, nothing measured) the interval is one step: the
// first checkpoint comes after the attempt's first step and measures C. A new interval replaces
// the one in force only when it differs by more than kIntervalHysteresis (relative), so jitter in
// the step time does not move it (nor fill the log) at every step.
#pragma once

#include <cstdint>
#include <deque>

#include "absl/status/statusor.h"
#include "runtime/comm/communicator.h"

namespace furnace::train {

inline constexpr double kIntervalHysteresis = 0.2;

struct IntervalInputs {
  double stall_seconds = 0;  // C per checkpoint; 0: not measured yet
  double step_seconds = 0;   // the step time; 0: not measured yet
  double mtbf_seconds = 0;   // M; must be > 0 for an interval
};

struct IntervalChoice {
  int64_t steps = 0;   // 0: none (an input is missing)
  double seconds = 0;  // sqrt(2 C M), before rounding to steps
};

// Young/Daly: sqrt(2 C M) seconds, rounded to whole steps of `step_seconds`, clamped to
// [1, max_steps]. steps 0 when C, the step time or M is not > 0.
IntervalChoice YoungDalyInterval(const IntervalInputs& in, int64_t max_steps);

// The interval of one rank's training loop. Not thread-safe (the loop's thread).
class AutoCheckpointInterval {
 public:
  // `hint`: M, and the stall and step time earlier attempts measured (0 when unknown).
  // `max_steps`: the longest interval (the run's length).
  AutoCheckpointInterval(const IntervalInputs& hint, int64_t max_steps);

  // This rank's measurements: each step's time, each checkpoint's stall.
  void ObserveStep(double step_seconds);
  void ObserveStall(double stall_seconds);
  // What this rank proposes for agreement: the mean of its recent steps and stalls (the hint's
  // where it has measured none), and M.
  IntervalInputs Local() const;
  // Re-evaluates from inputs every rank agreed on; true when the interval in force changed.
  bool Update(const IntervalInputs& agreed);

  // Whether a checkpoint is due `since` steps after the last one (or the attempt's start).
  bool Due(int64_t since) const { return current_.steps > 0 && since >= current_.steps; }
  const IntervalChoice& current() const { return current_; }
  const IntervalInputs& inputs() const { return inputs_; }  // the last agreed inputs

 private:
  static constexpr size_t kStepWindow = 32;
  static constexpr size_t kStallWindow = 4;
  IntervalInputs hint_;
  int64_t max_steps_;
  std::deque<double> steps_, stalls_;
  IntervalInputs inputs_;
  IntervalChoice current_;
};

// The inputs every rank of `world` uses: the largest stall and step time of any rank (the slowest
// rank sets both the pace and the stall) and the largest M (all ranks get the same one). Without a
// group (one process), `mine`.
absl::StatusOr<IntervalInputs> AgreeIntervalInputs(comm::Communicator* world,
                                                   const IntervalInputs& mine);

}  // namespace furnace::train
