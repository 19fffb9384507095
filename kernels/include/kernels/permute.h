// Token permutation by expert (dropless by default) and the weighted combine back.
//
// A DispatchPlan says where each (token, choice) goes: slot[n*k + j] is its row in the permuted
// buffer (rows grouped by expert, in token order within an expert), or -1 when dropped by
// capacity. Capacity (MODEL.md): ceil(capacity_factor * k * N / E) computed in double when
// capacity_factor > 0; tokens beyond it are dropped in token order; 0 = dropless.
#pragma once
#include <cmath>
#include <cstdint>
#include <vector>

namespace furnace::kernels::cpu {

// An expert's capacity for `tokens` tokens routed top-k over E experts: the one rounding every
// user shares (the dispatch plan below, the cost model's routed rows, the memory bounds), as the
// products grouped otherwise round differently in double (e.g. cf 0.65, k 3, 120 tokens, E 2:
// 118 here, 117 as cf * (k * tokens) / E). 0 (dropless) when capacity_factor <= 0. At most
// `tokens`, all an expert can be sent (a token picks an expert once): a factor of E / k or more
// drops nothing, and a huge one stays in range.
inline int64_t ExpertCapacity(double capacity_factor, int k, int64_t tokens, int E) {
  if (capacity_factor <= 0 || E <= 0) return 0;
  const double capacity =
      std::ceil(capacity_factor * static_cast<double>(k) * static_cast<double>(tokens) / E);
  return capacity >= static_cast<double>(tokens) ? tokens : static_cast<int64_t>(capacity);
}

struct DispatchPlan {
  int N = 0, E = 0, k = 0;
  int64_t capacity = 0;          // 0 = dropless
  std::vector<int64_t> counts;   // (E) rows kept per expert
  std::vector<int64_t> offsets;  // (E + 1) prefix sums of counts
  std::vector<int64_t> slot;     // (N * k) row in the permuted buffer or -1
  std::vector<int32_t> token;    // (S) source token of each permuted row
  std::vector<int64_t> routed;   // (E) assignments before dropping (for telemetry)
  int64_t rows() const { return offsets.empty() ? 0 : offsets.back(); }
};

DispatchPlan MakeDispatchPlan(const int32_t* indices, int N, int E, int k, double capacity_factor);
// The plan of one slice of a routing group of `group_tokens` tokens whose slices are routed
// separately (the MoE schedule s1): the capacity is the group's, and expert e's queue already
// holds queued[e] choices of the slices before this one (nullptr: none), so the slices together
// keep exactly the choices one plan over the whole group keeps (the first `capacity` in token
// order). MakeDispatchPlan is the slice that is the whole group.
DispatchPlan MakeDispatchPlanSlice(const int32_t* indices, int N, int E, int k,
                                   double capacity_factor, int64_t group_tokens,
                                   const int64_t* queued);

template <typename T>
void PermuteForward(T* out, const T* inp, const DispatchPlan& plan,
                    int C);  // (S,C) = rows of (N,C)
template <typename T>
void PermuteBackward(T* dinp, const T* dout, const DispatchPlan& plan,
                     int C);  // dinp (N,C) accumulated

// out[n] = sum_j gates[n,j] * expert_out[slot[n,j]] over kept choices; out (N, C) overwritten.
template <typename T>
void UnpermuteForward(T* out, const T* expert_out, const T* gates, const DispatchPlan& plan, int C);
// dexpert_out (S, C) accumulated; dgates (N, k) accumulated (0 for dropped choices).
template <typename T>
void UnpermuteBackward(T* dexpert_out, T* dgates, const T* dout, const T* expert_out,
                       const T* gates, const DispatchPlan& plan, int C);
}  // namespace furnace::kernels::cpu
