// Dispatch plan and the row gathers/scatters around the grouped expert GEMMs. The plan is built in
// two passes over the (token, choice) list in token order: count per expert (`routed`), then hand
// out rows; with a capacity, an expert's first `capacity` assignments in token order keep a row and
// the rest get slot -1, so which tokens drop depends only on the routing, never on the schedule.
#include "kernels/permute.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace furnace::kernels::cpu {

DispatchPlan MakeDispatchPlan(const int32_t* indices, int N, int E, int k, double capacity_factor) {
  return MakeDispatchPlanSlice(indices, N, E, k, capacity_factor, N, nullptr);
}

DispatchPlan MakeDispatchPlanSlice(const int32_t* indices, int N, int E, int k,
                                   double capacity_factor, int64_t group_tokens,
                                   const int64_t* queued) {
  DispatchPlan plan;
  plan.N = N;
  plan.E = E;
  plan.k = k;
  const int64_t total = static_cast<int64_t>(N) * k;
  plan.capacity = ExpertCapacity(capacity_factor, k, group_tokens, E);
  plan.routed.assign(E, 0);
  for (int64_t i = 0; i < total; ++i) ++plan.routed[indices[i]];
  plan.counts.resize(E);
  plan.offsets.assign(E + 1, 0);
  for (int e = 0; e < E; ++e) {
    // The slots left to this slice: the capacity less what the slices before it queued.
    const int64_t ahead = queued == nullptr ? 0 : queued[e];
    const int64_t room = std::max<int64_t>(0, plan.capacity - ahead);
    plan.counts[e] = plan.capacity > 0 ? std::min(plan.routed[e], room) : plan.routed[e];
    plan.offsets[e + 1] = plan.offsets[e] + plan.counts[e];
  }
  plan.slot.assign(total, -1);
  plan.token.resize(plan.offsets[E]);
  std::vector<int64_t> next(plan.offsets.begin(), plan.offsets.end() - 1);
  for (int64_t i = 0; i < total; ++i) {
    const int e = indices[i];
    if (next[e] == plan.offsets[e + 1]) continue;  // expert full: dropped
    plan.slot[i] = next[e];
    plan.token[next[e]] = static_cast<int32_t>(i / k);
    ++next[e];
  }
  return plan;
}

template <typename T>
void PermuteForward(T* out, const T* inp, const DispatchPlan& plan, int C) {
  const int64_t rows = plan.rows();
  for (int64_t s = 0; s < rows; ++s) {
    const T* x = inp + static_cast<int64_t>(plan.token[s]) * C;
    std::copy(x, x + C, out + s * C);
  }
}

template <typename T>
void PermuteBackward(T* dinp, const T* dout, const DispatchPlan& plan, int C) {
  const int64_t rows = plan.rows();
  for (int64_t s = 0; s < rows; ++s) {
    T* dx = dinp + static_cast<int64_t>(plan.token[s]) * C;
    const T* d = dout + s * C;
    for (int c = 0; c < C; ++c) dx[c] += d[c];
  }
}

template <typename T>
void UnpermuteForward(T* out, const T* expert_out, const T* gates, const DispatchPlan& plan,
                      int C) {
  const int k = plan.k;
  for (int n = 0; n < plan.N; ++n) {
    T* o = out + static_cast<int64_t>(n) * C;
    std::fill(o, o + C, T(0));
    for (int j = 0; j < k; ++j) {
      const int64_t s = plan.slot[static_cast<int64_t>(n) * k + j];
      if (s < 0) continue;
      const T g = gates[static_cast<int64_t>(n) * k + j];
      const T* y = expert_out + s * C;
      for (int c = 0; c < C; ++c) o[c] += g * y[c];
    }
  }
}

template <typename T>
void UnpermuteBackward(T* dexpert_out, T* dgates, const T* dout, const T* expert_out,
                       const T* gates, const DispatchPlan& plan, int C) {
  const int k = plan.k;
  for (int n = 0; n < plan.N; ++n) {
    const T* d = dout + static_cast<int64_t>(n) * C;
    for (int j = 0; j < k; ++j) {
      const int64_t i = static_cast<int64_t>(n) * k + j;
      const int64_t s = plan.slot[i];
      if (s < 0) continue;
      const T g = gates[i];
      const T* y = expert_out + s * C;
      T* dy = dexpert_out + s * C;
      T dot = 0;
      for (int c = 0; c < C; ++c) {
        dy[c] += g * d[c];
        dot += d[c] * y[c];
      }
      dgates[i] += dot;
    }
  }
}

#define FURNACE_INSTANTIATE(T)                                                                  \
  template void PermuteForward<T>(T*, const T*, const DispatchPlan&, int);                      \
  template void PermuteBackward<T>(T*, const T*, const DispatchPlan&, int);                     \
  template void UnpermuteForward<T>(T*, const T*, const T*, const DispatchPlan&, int);          \
  template void UnpermuteBackward<T>(T*, T*, const T*, const T*, const T*, const DispatchPlan&, \
                                     int);
FURNACE_INSTANTIATE(float)
FURNACE_INSTANTIATE(double)
#undef FURNACE_INSTANTIATE

}  // namespace furnace::kernels::cpu
