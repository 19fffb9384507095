// The alpha-beta cost model of the MoE layer's schedules (research/parm.md 1.4, 2.5): the bytes
// each op of ForwardOps / BackwardOps (schedule.h) moves per rank, its predicted time on a
// CostProfile (alpha + beta * bytes per collective kind and group, alpha + beta * flops for the
// GEMMs, alpha + beta * bytes for local row copies), and the per-layer choice of a schedule.
// Pure arithmetic: no communicator, no clock (calibrate.h measures a profile on real groups).
//
// Rows under BALANCED routing (every expert gets the same share; the model's expected case):
//   S_all = N * k                                     (dropless, capacity_factor == 0)
//   S_all = min(N * k, E * ceil(cf * k * N / E))      (capacity_factor cf > 0)
// and per rank, per schedule (N tokens per rank per micro-batch, replicated over tp):
//   deepspeed  gate on N tokens;    S = S_all rows sent;      A = S received; R = esp * A
//              (sliced experts, the ESP group being the TP group: R = A);
//              order / inverse on S_all rows.
//   s1         gate on N/tp tokens; S = S_all/tp;             A = S;          R = esp * A;
//              order / inverse on S_all/tp rows; mp_all_gather of (N/tp) * C floats.
//   s2         gate on N tokens;    order on S_all rows, row_split keeps S = S_all/tp; A = S;
//              R = esp * A; the combine's fused op all-gathers S_all rows over tp; inverse on
//              S_all rows.
// (Divisions round down; the layouts Furnace accepts divide evenly.)
//
// Bytes are the LOGICAL bytes of the Communicator convention (runtime/comm/communicator.h): an
// all-to-all counts all its sends (the chunk to itself included), an all-gather its own
// contribution, a reduce-scatter its whole input. fp32 rows of C floats:
//   a2a(ep)            S * C * 4 (dispatch) and A * C * 4 (combine; A == S when balanced)
//   ag(esp)            A * C * 4            rs(esp)  R * C * 4
//   ar(esp)            R * C * 4 (sliced experts; R = A)       copy(esp)  nothing
//   mp_all_gather(tp)  (N/tp) * C * 4       row_all_gather(tp)  (S_all/tp) * C * 4
//   fused(a2a, ag g)   the a2a's bytes on ep + the all-gather's bytes on g
//   counts             E * 8 on ep (the a2a of (E/ep) * ep int64) + E * 8 on esp (all-gather;
//                      none with sliced experts: the ESP peers' counts are the same)
//   gate (s1, forward) 2 E * 8 on tp: every peer's choice counts and probability sums
// Backward lists are the adjoints (schedule.h), so the same formulas apply op by op: ag <-> rs,
// copy <-> ar, the splits are free, counts and gate statistics are not exchanged again. An op on a
// group of size 1 is no collective: 0 bytes, 0 s (the executor skips it).
//
// Times (Predict):
//   collective       alpha + beta * bytes with the profile's fit for (kind, group); counts are
//                    two collectives (a2a on ep, all-gather on esp); ar(esp) is a reduce-scatter
//                    of its bytes plus an all-gather of 1/esp of them (the ring all-reduce)
//   expert           2 GEMMs of R x C x (f/esp), 2 flops per multiply-add, each alpha + beta *
//                    flops; backward (input and weight gradients) twice forward
//   gate             one GEMM of N_gate x C x E (2 flops per MAC), plus its elementwise passes
//                    priced as copies (the layer norm over all N tokens reads and writes N x C,
//                    softmax and top-k 3 N_gate x E); backward twice forward; s1's forward adds
//                    the statistics all-gather over tp
//   order, inverse,  local copies of their rows (copy alpha + beta * bytes); mp_split free
//   row_split
//   fused            max(t_a2a, t_ag) + G * max(alpha_a2a, alpha_ag), G = ep pairwise steps
//                    (parm.md 2.5: the pipelined exchange pays a start-up per step)
//
// Thread-safety: everything here is a pure function or a value type.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/moe/schedule.h"

namespace furnace::moe {

struct LayerShape {
  int64_t N = 0;  // tokens per rank per micro-batch (B * T), replicated over the tp peers
  int C = 0;      // d_model
  int f = 0;      // expert_ffn (each rank holds E/ep experts of hidden width f/esp)
  int E = 0;      // experts
  int k = 0;      // top_k
  double capacity_factor = 0;  // 0 = dropless
  int tp = 1, ep = 1, esp = 1;
  // The ESP group is the TP group (topology::Topology::EspGroupIsTpGroup): deepspeed then slices
  // the experts (schedule.h SlicedExperts): R = A, ar(esp) instead of ag / rs.
  bool esp_is_tp = false;
};

// S_all above: the routed rows of all N tokens under balanced routing.
int64_t RoutedRows(const LayerShape& shape);

// The per-rank row counts of one schedule (see the file comment).
struct ScheduleRows {
  int64_t gate_tokens = 0;  // tokens the gate runs on
  int64_t order_rows = 0;   // rows order / inverse produce / consume
  int64_t S = 0;            // rows this rank sends to the experts
  int64_t A = 0;            // rows it receives over ep
  int64_t R = 0;            // rows its expert shards compute (esp * A; sliced experts: A)
};
ScheduleRows RowsOf(const LayerShape& shape, Schedule s);

struct GroupBytes {
  int64_t tp = 0, ep = 0, esp = 0;
  int64_t total() const { return tp + ep + esp; }
  GroupBytes& operator+=(const GroupBytes& o) {
    tp += o.tp;
    ep += o.ep;
    esp += o.esp;
    return *this;
  }
  bool operator==(const GroupBytes&) const = default;
};

// The logical bytes `op` moves on each group (file comment); local ops move none.
GroupBytes OpBytes(const Op& op, Direction dir, const LayerShape& shape, Schedule s);
// The sum over ForwardOps(s) or BackwardOps(s).
GroupBytes ScheduleBytes(Direction dir, const LayerShape& shape, Schedule s);

// seconds = alpha + beta * x (x: bytes, or flops for GEMMs).
struct AlphaBeta {
  double alpha = 0, beta = 0, r2 = 0;
  int points = 0;  // measurements behind the fit; 0 for a stated default
  double Seconds(double x) const { return alpha + beta * x; }
};
// Least squares over (x, seconds). A negative intercept is clamped to 0 and the slope refitted
// through the origin. r2 = 1 - SS_res / SS_tot (1 when every point lies on the line). One point
// (or all x equal): alpha = 0 and beta = mean(y) / x when x > 0; none: all zero.
AlphaBeta FitAlphaBeta(const std::vector<std::pair<double, double>>& bytes_seconds);

enum class CollectiveKind { kAllToAll = 0, kAllGather = 1, kReduceScatter = 2 };
inline constexpr CollectiveKind kAllCollectiveKinds[] = {
    CollectiveKind::kAllToAll, CollectiveKind::kAllGather, CollectiveKind::kReduceScatter};
const char* CollectiveKindName(CollectiveKind k);  // "all_to_all", "all_gather", "reduce_scatter"
inline constexpr OpGroup kCommGroups[] = {OpGroup::kTp, OpGroup::kEp, OpGroup::kEsp};

struct CostProfile {
  // [kind][group]: group index 0 tp, 1 ep, 2 esp.
  std::array<std::array<AlphaBeta, 3>, 3> collective{};
  AlphaBeta gemm;            // seconds per GEMM: alpha + beta * flops
  AlphaBeta copy;            // seconds per local row copy: alpha + beta * bytes
  std::string source;        // "fitted on <layout>" or "default profile: ..."
  double seconds_spent = 0;  // calibration time (0 for a default profile)

  // `group` must be tp, ep or esp.
  AlphaBeta& at(CollectiveKind kind, OpGroup group);
  const AlphaBeta& at(CollectiveKind kind, OpGroup group) const;

  // {"source", "seconds_spent", "gemm", "copy", "collectives": {"tp": {"all_to_all": {"alpha",
  // "beta", "r2", "points"}, ...}, ...}}; doubles printed exactly, so FromJson(ToJson()) == *this.
  std::string ToJson() const;
  // InvalidArgument naming what is missing or malformed.
  static absl::StatusOr<CostProfile> FromJson(std::string_view text);
};

// Stated assumptions, not measurements:
//   intra-node link  alpha 5 us,  100 GB/s   (beta 1e-11 s/B; NVLink-class)
//   inter-node link  alpha 20 us, 12.5 GB/s  (beta 8e-11 s/B; 100 Gb/s NIC)
//   GEMM             alpha 10 us, 100 TFLOP/s (beta 1e-14 s/flop)
//   row copy         alpha 5 us,  1 TB/s      (beta 1e-12 s/B)
// Every collective kind of a group gets its link's numbers.
CostProfile DefaultProfile(bool tp_intra, bool ep_intra, bool esp_intra);

struct OpCost {
  Op op;
  GroupBytes bytes;
  double seconds = 0;
};

struct Prediction {
  Schedule schedule = Schedule::kDeepspeed;
  bool sliced = false;  // SlicedExperts: the lists are ForwardOps(schedule, sliced), ...
  double forward_s = 0, backward_s = 0;
  std::vector<OpCost> forward_ops, backward_ops;
  GroupBytes forward_bytes, backward_bytes;  // bytes per group
  double total_s() const { return forward_s + backward_s; }
};
Prediction Predict(const CostProfile& profile, const LayerShape& shape, Schedule s);

// One schedule per layer for both directions (backward needs what its forward saved): the lowest
// forward + backward time, deepspeed winning ties (then s1). tp == 1: deepspeed, reason
// "tp = 1: nothing to pause". s1 only where the N tokens split over tp (otherwise the cheapest of
// the others, the reason saying so). A Parm schedule replaces deepspeed only when predicted at
// least kParmMargin faster (the reason says so otherwise): on the benchmark's small shapes the
// model's error is of that order, and a smaller predicted gain was as often a measured loss
// (bench/parm/REPORT.md). `all` holds the three predictions in kAllSchedules order.
inline constexpr double kParmMargin = 0.10;
struct Choice {
  Schedule schedule = Schedule::kDeepspeed;
  std::string reason;  // "s2: 1.84 ms fwd+bwd vs s1 2.10 ms, deepspeed 3.02 ms"
  std::vector<Prediction> all;
  // After a trial (trial.h, MeasureSchedules): the median fwd+bwd seconds of each schedule, in
  // kAllSchedules order, 0 for one not tried; empty when no trial ran.
  std::vector<double> measured_s;
};
Choice ChooseSchedule(const CostProfile& profile, const LayerShape& shape);

// moe.schedule auto's trial (trial.h): the candidates predicted within `window` of the best;
// timed rounds until they took `seconds` (all candidates, slowest rank), at least `reps` and at
// most `max_reps`; a schedule replaces deepspeed, or one predicted faster, only when measured
// `margin` faster.
struct TrialOptions {
  int reps = 3;
  int max_reps = 11;
  double seconds = 1.0;
  double window = 1.5;
  double margin = 0.05;
};
// The schedules the trial runs for `predicted` (ChooseSchedule's) on `shape`, in kAllSchedules
// order: deepspeed, and every schedule predicted within options.window of the best (s1 only where
// the tokens split over tp); just deepspeed when there is nothing to try (tp 1 among others).
std::vector<Schedule> TrialCandidates(const Choice& predicted, const LayerShape& shape,
                                      const TrialOptions& options = {});

}  // namespace furnace::moe
