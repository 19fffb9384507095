// The adaptive memory planner's choice (DESIGN.md "Memory policies", BaGuaLu-2): given the bytes
// a projection says will not fit and the saved tensors that could make room, the cheapest set of
// actions per freed byte. A pure function: the model (runtime/model/gpt_moe.cc) builds the
// candidates from its stash after each MoE layer's token-count exchange, projects the deficits
// with its memory model and applies the plan; this file only decides.
//
// Where an action helps. The projection is a list of points in time order along the micro-batch
// (each module's forward, then the backward in reverse), each with its deficit. A candidate frees
// bytes only at the points strictly between `position` (when it is saved: before that it does not
// exist, at that point it is being made) and `until` (when it is needed again: its own backward
// restores it, or, for another micro-batch's tensor under 1F1B, that micro-batch's backward).
// A deferred candidate (the current MoE layer's own expert buffers, acted on right after its
// forward, or a tensor a later module will save, dropped as it is saved) is placed the same way.
// The plan covers the points in order: for the first point still short, it takes the cheapest
// helpful action per freed byte (ties: more bytes, then the lower id), and counts what that frees
// at every point of the candidate's interval.
//
// Costs, in seconds of compute the step loses:
//   offload:    free while the copies fit in the compute ahead that can hide them
//               (PlannerCosts::hidden_seconds, shared by all the offloads of one plan, both
//               directions counted); beyond it, the copy time that shows.
//   compress:   the cast there and back (cast_seconds_per_byte); frees what the codec saves.
//   recompute:  the rebuild's FLOPs at the measured rate.
// The plan takes, one at a time, the action with the smallest cost per freed byte (ties: more
// bytes, then the lower id); an action taken rules out the ones it conflicts with
// (PlanCandidate::rebuild_inputs), so every plan is one the stash carries out whole.
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace furnace::memory {

enum class PlanAction { kOffload, kCompress, kRecompute };
const char* PlanActionName(PlanAction action);

struct PlanCandidate {
  int64_t id = -1;      // the caller's handle
  uint64_t bytes = 0;   // device bytes it holds now (full precision)
  int position = -1;    // when it is saved (a point's time); -1: before every point
  int until = 1 << 30;  // when it is needed again
  bool deferred = false;
  bool can_offload = false;
  bool can_recompute = false;
  double recompute_seconds = 0;
  bool can_compress = false;
  double compressed_fraction = 1;  // encoded bytes / bytes
  // The candidates (by id) its rebuild reads. A rebuild must read exact values: once it is
  // recomputed, none of them may be compressed, and once one of them is compressed, it may not be
  // recomputed (the stash refuses both, Stash::Compress and Stash::Drop).
  std::vector<int64_t> rebuild_inputs;
};

struct PlannerCosts {
  double link_bytes_per_second = 0;  // the host link, one direction; > 0 for offload to count
  double hidden_seconds = 0;         // copy time the compute ahead can hide
  double cast_seconds_per_byte = 0;  // encode + decode
};

struct PlanChoice {
  int64_t id = -1;
  PlanAction action = PlanAction::kOffload;
  bool deferred = false;
  uint64_t freed = 0;
  double cost_seconds = 0;
};

// What the point at time `position` lacks (bytes > 0).
struct Deficit {
  int position = 0;
  int64_t bytes = 0;
};

struct Plan {
  std::vector<PlanChoice> choices;  // in the order taken
  uint64_t freed = 0;               // bytes the choices free (each at the points after it)
  double cost_seconds = 0;
  bool covered = false;  // every deficit covered
};

Plan CoverDeficits(const std::vector<PlanCandidate>& candidates,
                   const std::vector<Deficit>& deficits, const PlannerCosts& costs);

// The share of PlannerCosts::hidden_seconds the next plan may count on, after a micro-batch in
// which a reload came late (`late`: the copies did not hide behind the compute as planned) or
// none did: halved, else raised by 1/8, within [0, 1]. A link busier than the plans assume (copies
// queued behind each other or behind another micro-batch's) then prices offload at its copy time
// within a few micro-batches, and a quiet one returns to hiding within eight.
double NextHiddenShare(double share, bool late);

// "offload 3 (1.5 MiB), recompute 2 (0.8 MiB)" for the debug log.
std::string PlanSummary(const Plan& plan);

}  // namespace furnace::memory
