#include "runtime/model/moe_block.h"

#include <memory>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "runtime/base/status.h"
#include "runtime/moe/executor.h"
#include "runtime/tensor/device_memory.h"

namespace furnace::model {

namespace {

moe::ScheduleExecutor ExecutorOf(const ModuleContext& ctx, const MoeShape& m) {
  return moe::ScheduleExecutor(
      m.schedule,
      {ctx.groups.tp, {ctx.groups.ep, ctx.groups.esp, &ctx.device()}, ctx.groups.esp_is_tp}, m.E,
      ctx.moe_counters);
}

// Adds the spike's bias to the forced tokens' logits (N, E). The host can address the logits on
// the CPU device (RoutingSpike::Apply as it is); elsewhere the bias (kSpikeBias on the forced
// entries, 0 elsewhere: adding 0 leaves a logit as it is, but for the sign of a zero, which the
// softmax does not see) is uploaded into device memory outside the arena, so the declared bytes
// do not change, and added on the stream.
absl::Status ApplySpike(ModuleContext& ctx, const RoutingSpike& spike, float* logits, int N,
                        int E) {
  device::Device& device = ctx.device();
  if (device::HostAddressable(device)) {
    spike.Apply(logits, N, E);
    return absl::OkStatus();
  }
  const int64_t NE = int64_t{N} * E;
  std::vector<float> bias(NE, 0.0f);
  spike.Apply(bias.data(), N, E);
  ASSIGN_OR_RETURN(tensor::DeviceMemory dev_bias,
                   tensor::DeviceMemory::Allocate(device, F32Bytes(NE), "routing-spike bias"));
  RETURN_IF_ERROR(Upload(ctx, dev_bias.data(), bias.data(), F32Bytes(NE)));
  ctx.ops.add_inplace(logits, dev_bias.as<float>(), NE);
  return absl::OkStatus();  // dev_bias is freed in the stream's order, after the add
}

int64_t Scratch(const moe::DispatchHandle& h, int C) {
  return moe::ScheduleExecutor::ScratchRows(h) * C;
}

}  // namespace

// The router's GEMMs run in fp32 whatever the model's precision (MODEL.md: p = softmax(u @ Wg) in
// fp32, as Megatron and DeepSeek keep their routers): bf16 operands would move near-tied logits
// across each other and change which experts the tokens go to. The table of the same device at
// fp32; the model's own when that is already it.
namespace {
const device::Backend& RouterOps(const ModuleContext& ctx) {
  if (ctx.ops.precision == device::Precision::kFp32) return ctx.ops;
  absl::StatusOr<const device::Backend*> fp32 = device::BackendFor(ctx.device().kind());
  return fp32.ok() ? **fp32 : ctx.ops;
}
}  // namespace

absl::StatusOr<tensor::Buffer> RouterForward(ModuleContext& ctx, const RouterInputs& r,
                                             const float* u) {
  const int64_t NE = int64_t{r.N} * r.E;
  ASSIGN_OR_RETURN(tensor::Buffer logits,
                   AllocF32(ctx, NE, r.prefix + "moe.router_logits", false));  // (N, E)
  ASSIGN_OR_RETURN(tensor::Buffer probs,
                   AllocF32(ctx, NE, r.prefix + "moe.router_probs", false));  // (N, E)
  RouterOps(ctx).matmul_forward(logits.as<float>(), u, r.weight, nullptr, r.N, r.C, r.E);
  if (r.spike.has_value()) RETURN_IF_ERROR(ApplySpike(ctx, *r.spike, logits.as<float>(), r.N, r.E));
  ctx.ops.softmax_forward(probs.as<float>(), logits.as<float>(), r.N, r.E);
  return probs;
}

namespace {

struct TopK {
  tensor::Buffer indices;  // (N, k) int32
  tensor::Buffer gates;    // (N, k)
};

absl::StatusOr<TopK> TopKForward(ModuleContext& ctx, const MoeShape& m, const float* probs, int N,
                                 const std::string& p) {
  TopK t;
  ASSIGN_OR_RETURN(t.indices, AllocI32(ctx, int64_t{N} * m.k, p + "moe.topk_indices"));
  ASSIGN_OR_RETURN(t.gates, AllocF32(ctx, int64_t{N} * m.k, p + "moe.gates", false));
  ctx.ops.topk_forward(t.indices.as<int32_t>(), t.gates.as<float>(), probs, N, m.E, m.k,
                       m.normalize);
  return t;
}

// The dispatch plan of the gated tokens: of the whole micro-batch, or under s1 of this peer's
// slice with the group's capacity and the queue positions of the peers before it (`queued`,
// empty otherwise), so the peers keep exactly the choices one plan over all N tokens keeps.
// `indices` (gated, k) are HOST memory (MoeSaved::host_indices): the plan is built on the host.
device::DispatchPlan PlanOf(const ModuleContext& ctx, const MoeShape& m, const int32_t* indices,
                            int gated, int N, const std::vector<int64_t>& queued) {
  if (queued.empty())
    return ctx.ops.make_dispatch_plan(indices, gated, m.E, m.k, m.capacity_factor);
  return ctx.ops.make_dispatch_plan_slice(indices, gated, m.E, m.k, m.capacity_factor, N,
                                          queued.data());
}

// The expert input (R, C): the routed rows (S_all, C) permuted out of u by the plan, then, when
// rows cross ranks (dispatch != nullptr), through the schedule's ops on the way to the experts.
// Forward, its rebuild and (for the output gradient) backward run the same executor segment.
absl::StatusOr<tensor::Buffer> ExpertInput(ModuleContext& ctx, const MoeShape& m,
                                           const std::string& p, const float* u,
                                           const device::DispatchPlan& plan,
                                           const moe::DispatchHandle* dispatch, int C) {
  const int64_t S = plan.rows();
  ASSIGN_OR_RETURN(
      tensor::Buffer routed,  // (S_all, C)
      AllocF32(ctx, S * C, p + (dispatch == nullptr ? "moe.expert_input" : "moe.routed_input"),
               false));
  ctx.ops.permute_forward(routed.as<float>(), u, plan, C);
  if (dispatch == nullptr) return routed;
  ASSIGN_OR_RETURN(tensor::Buffer ex, AllocF32(ctx, dispatch->R() * C, p + "moe.expert_input",
                                               false));  // (R, C)
  ASSIGN_OR_RETURN(tensor::Buffer scratch,
                   AllocF32(ctx, Scratch(*dispatch, C), p + "moe.dispatch_scratch", false));
  RETURN_IF_ERROR(ExecutorOf(ctx, m).ToExperts(moe::Direction::kForward, *dispatch,
                                               routed.as<float>(), ex.as<float>(), C,
                                               scratch.as<float>()));
  return ex;
}

// The second expert GEMM. Its inputs: hid (R, fl), W2 (El, fl, C), b2 (El, C) or nullptr on the
// ESP ranks that do not add it.
struct ExpertOutputInputs {
  const float* w2 = nullptr;
  const float* b2 = nullptr;
  std::vector<int64_t> offsets;  // (El + 1) row offsets of the local experts
  int El = 0, fl = 0, C = 0;
  int64_t R = 0, S = 0;  // S: the routed rows (S_all)
};

// The combined expert output (S_all, C) in routed order: hid @ W2 + b2 per expert (R, C), then,
// when rows cross ranks, back through the schedule's ops (summed over ESP). Forward and the
// rebuild run this one function.
absl::StatusOr<tensor::Buffer> CombinedOutput(ModuleContext& ctx, const MoeShape& m,
                                              const std::string& p, const float* hid,
                                              const ExpertOutputInputs& in,
                                              const moe::DispatchHandle* dispatch) {
  ASSIGN_OR_RETURN(
      tensor::Buffer eo,  // (R, C)
      AllocF32(ctx, in.R * in.C,
               p + (dispatch == nullptr ? "moe.combined_output" : "moe.expert_output"), false));
  ctx.ops.grouped_matmul_forward(eo.as<float>(), hid, in.w2, in.b2, in.offsets.data(), in.El, in.fl,
                                 in.C);
  if (dispatch == nullptr) return eo;
  ASSIGN_OR_RETURN(tensor::Buffer back, AllocF32(ctx, in.S * in.C, p + "moe.combined_output",
                                                 false));  // (S_all, C)
  ASSIGN_OR_RETURN(tensor::Buffer scratch,
                   AllocF32(ctx, Scratch(*dispatch, in.C), p + "moe.combine_scratch", false));
  RETURN_IF_ERROR(ExecutorOf(ctx, m).FromExperts(moe::Direction::kForward, *dispatch,
                                                 eo.as<float>(), back.as<float>(), in.C,
                                                 scratch.as<float>()));
  return back;
}

// The Switch aux loss over the whole tp group from its gathered statistics (s1), as
// AuxLossForward computes it over one plan's tokens.
double GroupAuxLoss(const MoeShape& m, const moe::GateStats& g, int64_t N) {
  double acc = 0;
  for (int e = 0; e < m.E; ++e) {
    const double frac = static_cast<double>(g.total[e]) / (static_cast<double>(m.k) * N);
    acc += frac * (g.psum[e] / N);
  }
  // alpha as the kernel takes it (fp32), the sum in double as the kernel does.
  return static_cast<float>(static_cast<double>(static_cast<float>(m.alpha)) * m.E * acc);
}

}  // namespace

absl::StatusOr<MoeSaved> MoeBlockForward(ModuleContext& ctx, const Dims& dims, const MoeShape& m,
                                         int layer, const LayerOffsets& off, const float* params,
                                         StashHandle x_in, const RoutingSpike* spike) {
  const int B = dims.B, T = dims.T, C = dims.C, N = dims.N();
  const int E = m.E, K = m.k;
  const int64_t NC = int64_t{N} * C;
  const std::string p = absl::StrCat("layers.", layer, ".");
  const moe::ScheduleExecutor ex = ExecutorOf(ctx, m);
  ASSIGN_OR_RETURN(const float* x, GetF32(ctx, x_in));  // (B, T, C)
  MoeSaved s;
  // The tokens this peer gates: all N, or under s1 its slice [first, first + gated) (mp_split:
  // the layer norm runs on all N tokens, so its gradients stay tp-replicated; the split is of
  // its output).
  ASSIGN_OR_RETURN(const int64_t gated64, ex.SliceCount(N));
  const int G = static_cast<int>(gated64);
  s.gate_first = ex.SliceBegin(N);
  s.gated = G;
  const int64_t g0 = s.gate_first;

  ASSIGN_OR_RETURN(SavedNorm norm, NormForward(ctx, dims, p + "ln2", layer, x_in,
                                               params + off.ln2_w, params + off.ln2_b));
  s.ln_out = norm.out;
  s.ln_mean = norm.mean;
  s.ln_rstd = norm.rstd;
  ASSIGN_OR_RETURN(const float* u_all, GetF32(ctx, s.ln_out));  // (B, T, C)
  const float* u = u_all + g0 * C;                              // (G, C)

  // Router on the gated tokens. Its rebuild calls RouterForward with the same RouterInputs.
  std::optional<RoutingSpike> router_spike;
  if (spike != nullptr) {
    router_spike = *spike;
    router_spike->first_token += g0;
  }
  const RouterInputs router{params + off.router, G, C, E, p, router_spike};
  {
    ASSIGN_OR_RETURN(tensor::Buffer probs, RouterForward(ctx, router, u));  // (G, E)
    RecomputeSpec spec{"router", {s.ln_out}, 2.0 * G * C * E};
    spec.rebuild = [ctx, router, ln_out = s.ln_out,
                    g0]() mutable -> absl::StatusOr<tensor::Buffer> {
      ASSIGN_OR_RETURN(const float* ur, GetF32(ctx, ln_out));
      return RouterForward(ctx, router, ur + g0 * router.C);
    };
    ASSIGN_OR_RETURN(s.probs, SaveF32(ctx, p + "moe.router_probs", layer, std::move(probs), {G, E},
                                      std::move(spec)));
  }
  ASSIGN_OR_RETURN(const float* probs, GetF32(ctx, s.probs));
  ASSIGN_OR_RETURN(TopK topk, TopKForward(ctx, m, probs, G, p));
  const int32_t* indices = topk.indices.as<int32_t>();  // (G, k) device
  const float* g = topk.gates.as<float>();
  // The routing comes to the host (the stream waits): the dispatch plan is built there, and
  // backward and the rebuilds reuse this copy (the indices a rebuild recomputes are the same).
  auto host_indices = std::make_shared<std::vector<int32_t>>(int64_t{G} * K);
  RETURN_IF_ERROR(ToHost(ctx, host_indices->data(), indices, I32Bytes(int64_t{G} * K)));
  s.host_indices = host_indices;
  const int32_t* hidx = host_indices->data();
  {
    RecomputeSpec spec_i{"topk", {s.probs}, 0};
    spec_i.rebuild = [ctx, m, probs = s.probs, G, p]() mutable -> absl::StatusOr<tensor::Buffer> {
      ASSIGN_OR_RETURN(const float* pr, GetF32(ctx, probs));
      ASSIGN_OR_RETURN(TopK t, TopKForward(ctx, m, pr, G, p));
      return std::move(t.indices);
    };
    RecomputeSpec spec_g{"topk", {s.probs}, 0};
    spec_g.rebuild = [ctx, m, probs = s.probs, G, p]() mutable -> absl::StatusOr<tensor::Buffer> {
      ASSIGN_OR_RETURN(const float* pr, GetF32(ctx, probs));
      ASSIGN_OR_RETURN(TopK t, TopKForward(ctx, m, pr, G, p));
      return std::move(t.gates);
    };
    ASSIGN_OR_RETURN(s.indices, SaveI32(ctx, p + "moe.topk_indices", layer, std::move(topk.indices),
                                        {G, K}, std::move(spec_i)));
    ASSIGN_OR_RETURN(s.gates, SaveF32(ctx, p + "moe.gates", layer, std::move(topk.gates), {G, K},
                                      std::move(spec_g)));
  }
  if (G < N) {
    // s1: the aux loss and the capacity cut of the whole group, from every peer's statistics.
    std::vector<int64_t> counts(E, 0);
    for (int64_t i = 0; i < int64_t{G} * K; ++i) ++counts[hidx[i]];
    // The router probabilities too (the stream waits again): their sums are host statistics.
    std::vector<float> host_probs(int64_t{G} * E);
    RETURN_IF_ERROR(ToHost(ctx, host_probs.data(), probs, F32Bytes(int64_t{G} * E)));
    std::vector<double> psum(E, 0.0);
    for (int n = 0; n < G; ++n) {
      for (int e = 0; e < E; ++e) psum[e] += host_probs[int64_t{n} * E + e];
    }
    ASSIGN_OR_RETURN(const moe::GateStats stats, ex.ExchangeGateStats(counts, psum));
    s.aux = GroupAuxLoss(m, stats, N);
    s.group_choices = stats.total;
    s.queued = stats.queued;
  } else {
    s.aux = ctx.ops.aux_loss_forward(probs, indices, N, E, K, static_cast<float>(m.alpha));
  }

  // Dispatch: from here on the sizes depend on routing.
  const device::DispatchPlan plan = PlanOf(ctx, m, hidx, G, N, s.queued);
  const int64_t S = plan.rows();
  s.rows = S;
  if (G < N) {
    // The group's routing for telemetry: choices per expert and what the capacity dropped.
    s.routed = s.group_choices;
    s.dropped = 0;
    for (int e = 0; e < E; ++e) {
      if (plan.capacity > 0) s.dropped += std::max<int64_t>(0, s.routed[e] - plan.capacity);
    }
  } else {
    s.routed = plan.routed;
    s.dropped = int64_t{N} * K - S;
  }
  s.distributed = ex.exchanges();
  const int El = m.El(), fl = m.fl();
  // What the rebuilds of the expert buffers share: the dispatch handle (counts already exchanged)
  // and the local experts' row offsets.
  std::shared_ptr<const moe::DispatchHandle> dispatch;
  if (s.distributed) {
    ASSIGN_OR_RETURN(s.dispatch, ex.Prepare(plan.counts, moe::RoutingDigest(plan.token)));
    dispatch = std::make_shared<const moe::DispatchHandle>(s.dispatch);
  }
  const int64_t R = s.distributed ? s.dispatch.R() : S;
  ExpertOutputInputs eoin;
  eoin.w2 = params + off.w2;
  eoin.b2 = m.adds_b2 ? params + off.b2 : nullptr;
  eoin.offsets = s.distributed ? s.dispatch.expert_offsets : plan.offsets;
  eoin.El = El;
  eoin.fl = fl;
  eoin.C = C;
  eoin.R = R;
  eoin.S = S;
  const int64_t* offsets = eoin.offsets.data();
  const RecomputeCollective collective =
      s.distributed ? RecomputeCollective::kExpertDispatch : RecomputeCollective::kNone;

  // The planner's point: the rows are known, the expert buffers not allocated yet.
  if (ctx.hooks != nullptr) {
    MoeRows rows{S, R, s.distributed ? moe::ScheduleExecutor::ScratchRows(s.dispatch) : 0,
                 s.distributed};
    rows.gated = G;
    RETURN_IF_ERROR(ctx.hooks->BeforeExpertBuffers(layer, rows));
  }
  ASSIGN_OR_RETURN(tensor::Buffer xin,
                   ExpertInput(ctx, m, p, u, plan, dispatch.get(), C));  // (R,C)
  ASSIGN_OR_RETURN(tensor::Buffer pre, AllocF32(ctx, R * fl, p + "moe.expert_pre", false));
  ctx.ops.grouped_matmul_forward(pre.as<float>(), xin.as<float>(), params + off.w1, params + off.b1,
                                 offsets, El, C, fl);  // (R, fl)
  ASSIGN_OR_RETURN(tensor::Buffer hid, AllocF32(ctx, R * fl, p + "moe.expert_hidden", false));
  ctx.ops.gelu_forward(hid.as<float>(), pre.as<float>(), R * fl);  // (R, fl)
  ASSIGN_OR_RETURN(tensor::Buffer eo, CombinedOutput(ctx, m, p, hid.as<float>(), eoin,
                                                     dispatch.get()));                 // (S_all, C)
  ASSIGN_OR_RETURN(tensor::Buffer out, AllocF32(ctx, NC, p + "moe.residual", false));  // (B,T,C)
  float* o = out.as<float>();
  if (G < N) {
    // s1: this peer's tokens, then mp_all_gather: every peer's slice in rank order.
    ASSIGN_OR_RETURN(tensor::Buffer mine,
                     AllocF32(ctx, int64_t{G} * C, p + "moe.residual_slice", false));  // (G, C)
    float* mo = mine.as<float>();
    ctx.ops.unpermute_forward(mo, eo.as<float>(), g, plan, C);
    ctx.ops.add_inplace(mo, x + g0 * C, int64_t{G} * C);
    RETURN_IF_ERROR(ex.MpAllGather(mo, G, o, C));
  } else {
    ctx.ops.unpermute_forward(o, eo.as<float>(), g, plan, C);
    ctx.ops.add_inplace(o, x, NC);
  }

  RecomputeSpec spec_x{
      s.distributed ? "permute+dispatch" : "permute", {s.ln_out, s.indices}, 0, collective};
  spec_x.rebuild = [ctx, m, ln_out = s.ln_out, host_indices, dispatch, G, N, g0, C,
                    queued = s.queued, p]() mutable -> absl::StatusOr<tensor::Buffer> {
    ASSIGN_OR_RETURN(const float* ur, GetF32(ctx, ln_out));
    const device::DispatchPlan pl = PlanOf(ctx, m, host_indices->data(), G, N, queued);
    return ExpertInput(ctx, m, p, ur + g0 * C, pl, dispatch.get(), C);
  };
  ASSIGN_OR_RETURN(s.xin, SaveF32(ctx, p + "moe.expert_input", layer, std::move(xin), {R, C},
                                  std::move(spec_x)));
  RecomputeSpec spec_p{"grouped_matmul", {s.xin}, 2.0 * R * C * fl};
  spec_p.rebuild = [ctx, xh = s.xin, w1 = params + off.w1, b1 = params + off.b1, eoin,
                    p]() mutable -> absl::StatusOr<tensor::Buffer> {
    ASSIGN_OR_RETURN(const float* xr, GetF32(ctx, xh));
    ASSIGN_OR_RETURN(tensor::Buffer out, AllocF32(ctx, eoin.R * eoin.fl, p + "moe.expert_pre",
                                                  false));  // (R, fl)
    ctx.ops.grouped_matmul_forward(out.as<float>(), xr, w1, b1, eoin.offsets.data(), eoin.El,
                                   eoin.C, eoin.fl);
    return out;
  };
  ASSIGN_OR_RETURN(
      s.pre, SaveF32(ctx, p + "moe.expert_pre", layer, std::move(pre), {R, fl}, std::move(spec_p)));
  RecomputeSpec spec_h{"gelu", {s.pre}, 10.0 * R * fl};
  spec_h.rebuild = [ctx, ph = s.pre, n = R * fl, p]() mutable -> absl::StatusOr<tensor::Buffer> {
    ASSIGN_OR_RETURN(const float* pr, GetF32(ctx, ph));
    ASSIGN_OR_RETURN(tensor::Buffer out, AllocF32(ctx, n, p + "moe.expert_hidden", false));
    ctx.ops.gelu_forward(out.as<float>(), pr, n);  // (R, fl)
    return out;
  };
  ASSIGN_OR_RETURN(s.hidden, SaveF32(ctx, p + "moe.expert_hidden", layer, std::move(hid), {R, fl},
                                     std::move(spec_h)));
  RecomputeSpec spec_o{s.distributed ? "grouped_matmul+combine" : "grouped_matmul",
                       {s.hidden},
                       2.0 * R * C * fl,
                       collective};
  spec_o.rebuild = [ctx, m, hh = s.hidden, eoin, dispatch,
                    p]() mutable -> absl::StatusOr<tensor::Buffer> {
    ASSIGN_OR_RETURN(const float* hr, GetF32(ctx, hh));
    return CombinedOutput(ctx, m, p, hr, eoin, dispatch.get());
  };
  ASSIGN_OR_RETURN(s.eo, SaveF32(ctx, p + "moe.combined_output", layer, std::move(eo), {S, C},
                                 std::move(spec_o)));
  ASSIGN_OR_RETURN(s.out, SaveF32(ctx, p + "moe.residual", layer, std::move(out), {B, T, C}));
  return s;
}

absl::Status MoeBlockBackward(ModuleContext& ctx, const Dims& dims, const MoeShape& m,
                              const LayerOffsets& off, const float* params, float* grads,
                              const MoeSaved& s, StashHandle x_in, double aux_scale, float* dres) {
  const int C = dims.C, N = dims.N();
  const int E = m.E, K = m.k;
  const int G = s.gated;
  const int64_t g0 = s.gate_first;
  const int64_t NC = int64_t{N} * C, GC = int64_t{G} * C;
  const moe::ScheduleExecutor ex = ExecutorOf(ctx, m);
  ASSIGN_OR_RETURN(Stash::Lease lease,
                   ctx.stash.Acquire({x_in, s.ln_out, s.ln_mean, s.ln_rstd, s.probs, s.indices,
                                      s.gates, s.xin, s.pre, s.hidden, s.eo}));
  ASSIGN_OR_RETURN(const float* x, GetF32(ctx, x_in));
  ASSIGN_OR_RETURN(const float* u_all, GetF32(ctx, s.ln_out));
  const float* u = u_all + g0 * C;  // (G, C)
  ASSIGN_OR_RETURN(const float* mean, GetF32(ctx, s.ln_mean));
  ASSIGN_OR_RETURN(const float* rstd, GetF32(ctx, s.ln_rstd));
  ASSIGN_OR_RETURN(const float* probs, GetF32(ctx, s.probs));
  ASSIGN_OR_RETURN(const int32_t* indices, GetI32(ctx, s.indices));
  ASSIGN_OR_RETURN(const float* gates, GetF32(ctx, s.gates));
  ASSIGN_OR_RETURN(const float* xin, GetF32(ctx, s.xin));
  ASSIGN_OR_RETURN(const float* pre, GetF32(ctx, s.pre));
  ASSIGN_OR_RETURN(const float* hid, GetF32(ctx, s.hidden));
  ASSIGN_OR_RETURN(const float* eo, GetF32(ctx, s.eo));

  if (s.host_indices == nullptr) {
    return absl::InternalError("moe backward: the forward kept no host copy of the routing");
  }
  const device::DispatchPlan plan = PlanOf(ctx, m, s.host_indices->data(), G, N, s.queued);
  const int64_t S = plan.rows();
  if (S != s.rows) {
    return absl::InternalError(
        absl::StrCat("moe backward: rebuilt dispatch plan has ", S, " rows, forward had ", s.rows));
  }
  const int El = m.El(), fl = m.fl();
  const int64_t* offsets = s.distributed ? s.dispatch.expert_offsets.data() : plan.offsets.data();
  const int64_t R = s.distributed ? s.dispatch.R() : S;

  // mp_split (s1): the output gradient is tp-replicated; this peer's tokens are its slice.
  const float* dout = dres + g0 * C;  // (G, C)
  ASSIGN_OR_RETURN(tensor::Buffer deo, AllocF32(ctx, S * C, "moe.dexpert_output", true));
  ASSIGN_OR_RETURN(tensor::Buffer dgates, AllocF32(ctx, int64_t{G} * K, "moe.dgates", true));
  ctx.ops.unpermute_backward(deo.as<float>(), dgates.as<float>(), dout, eo, gates, plan, C);
  if (s.distributed) {  // the combine's adjoint: the output gradient goes to the experts
    ASSIGN_OR_RETURN(tensor::Buffer exr, AllocF32(ctx, R * C, "moe.dexpert_output", false));
    ASSIGN_OR_RETURN(tensor::Buffer scratch,
                     AllocF32(ctx, Scratch(s.dispatch, C), "moe.combine_scratch", false));
    RETURN_IF_ERROR(ex.ToExperts(moe::Direction::kBackward, s.dispatch, deo.as<float>(),
                                 exr.as<float>(), C, scratch.as<float>()));
    scratch.Reset();
    deo = std::move(exr);
  }
  ASSIGN_OR_RETURN(tensor::Buffer dhid, AllocF32(ctx, R * fl, "moe.dexpert_hidden", true));
  ctx.ops.grouped_matmul_backward(dhid.as<float>(), grads + off.w2, grads + off.b2, deo.as<float>(),
                                  hid, params + off.w2, offsets, El, fl, C);
  deo.Reset();
  ASSIGN_OR_RETURN(tensor::Buffer dpre, AllocF32(ctx, R * fl, "moe.dexpert_pre", true));
  ctx.ops.gelu_backward(dpre.as<float>(), pre, dhid.as<float>(), R * fl);
  dhid.Reset();
  ASSIGN_OR_RETURN(tensor::Buffer dxin, AllocF32(ctx, R * C, "moe.dexpert_input", true));
  ctx.ops.grouped_matmul_backward(dxin.as<float>(), grads + off.w1, grads + off.b1,
                                  dpre.as<float>(), xin, params + off.w1, offsets, El, C, fl);
  dpre.Reset();
  if (s.distributed) {  // the dispatch's adjoint: partial input gradients summed, sent back
    ASSIGN_OR_RETURN(tensor::Buffer back, AllocF32(ctx, S * C, "moe.dexpert_input", false));
    ASSIGN_OR_RETURN(tensor::Buffer scratch,
                     AllocF32(ctx, Scratch(s.dispatch, C), "moe.dispatch_scratch", false));
    RETURN_IF_ERROR(ex.FromExperts(moe::Direction::kBackward, s.dispatch, dxin.as<float>(),
                                   back.as<float>(), C, scratch.as<float>()));
    scratch.Reset();
    dxin = std::move(back);
  }
  ASSIGN_OR_RETURN(tensor::Buffer du, AllocF32(ctx, GC, "ln2.dout", true));  // (G, C)
  ctx.ops.permute_backward(du.as<float>(), dxin.as<float>(), plan, C);
  dxin.Reset();

  ASSIGN_OR_RETURN(tensor::Buffer dprobs, AllocF32(ctx, int64_t{G} * E, "moe.dprobs", true));
  ctx.ops.topk_backward(dprobs.as<float>(), dgates.as<float>(), probs, indices, G, E, K,
                        m.normalize);
  if (G < N) {
    // s1: d aux / d probs of the group's loss: alpha E frac_e / N for every token, with the
    // group's choice fractions and token count (AuxLossBackward's formula over all N tokens):
    // one host row (E) added to every row of dprobs.
    std::vector<float> coef(E);
    for (int e = 0; e < E; ++e) {
      const double frac = static_cast<double>(s.group_choices[e]) / (static_cast<double>(K) * N);
      coef[e] = static_cast<float>(static_cast<double>(static_cast<float>(aux_scale)) *
                                   static_cast<float>(m.alpha) * E * frac / N);
    }
    ctx.ops.add_row(dprobs.as<float>(), coef.data(), G, E);
  } else {
    ctx.ops.aux_loss_backward(dprobs.as<float>(), indices, N, E, K, static_cast<float>(m.alpha),
                              static_cast<float>(aux_scale));
  }
  dgates.Reset();
  ASSIGN_OR_RETURN(tensor::Buffer dlogits, AllocF32(ctx, int64_t{G} * E, "moe.dlogits", true));
  ctx.ops.softmax_backward(dlogits.as<float>(), dprobs.as<float>(), probs, G, E);
  dprobs.Reset();
  RouterOps(ctx).matmul_backward(du.as<float>(), grads + off.router, nullptr, dlogits.as<float>(),
                                 u, params + off.router, G, C, E);
  dlogits.Reset();
  if (G < N) {
    // The adjoint of mp_split: every peer's slice of d u, in rank order (mp_all_gather).
    ASSIGN_OR_RETURN(tensor::Buffer du_all, AllocF32(ctx, NC, "ln2.dout", false));  // (B, T, C)
    RETURN_IF_ERROR(ex.MpAllGather(du.as<float>(), G, du_all.as<float>(), C));
    du = std::move(du_all);
  }
  ctx.ops.layernorm_backward(dres, grads + off.ln2_w, grads + off.ln2_b, du.as<float>(), x,
                             params + off.ln2_w, mean, rstd, N, C);
  du.Reset();
  return ReleaseAll(ctx, {s.ln_out, s.ln_mean, s.ln_rstd, s.probs, s.indices, s.gates, s.xin, s.pre,
                          s.hidden, s.eo, s.out});
}

}  // namespace furnace::model
