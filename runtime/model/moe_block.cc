#include "runtime/model/moe_block.h"

#include "absl/strings/str_cat.h"
#include "runtime/base/status.h"

namespace furnace::model {

namespace {

bool Distributed(const ModuleContext& ctx) {
  return (ctx.groups.ep != nullptr && ctx.groups.ep->size() > 1) ||
         (ctx.groups.esp != nullptr && ctx.groups.esp->size() > 1);
}

moe::ExpertDispatcher DispatcherOf(const ModuleContext& ctx, int E) {
  return moe::ExpertDispatcher({ctx.groups.ep, ctx.groups.esp}, E);
}

int64_t Scratch(const moe::DispatchHandle& h, int C) {
  return moe::ExpertDispatcher::ScratchRows(h) * C;
}

}  // namespace

absl::StatusOr<MoeSaved> MoeBlockForward(ModuleContext& ctx, const Dims& dims, const MoeShape& m,
                                         int layer, const LayerOffsets& off, const float* params,
                                         StashHandle x_in) {
  const int B = dims.B, T = dims.T, C = dims.C, N = dims.N();
  const int E = m.E, K = m.k;
  const int64_t NC = int64_t{N} * C;
  const std::string p = absl::StrCat("layers.", layer, ".");
  ASSIGN_OR_RETURN(const float* x, GetF32(ctx, x_in));  // (B, T, C)
  MoeSaved s;

  ASSIGN_OR_RETURN(SavedNorm norm, NormForward(ctx, dims, p + "ln2", layer, x_in,
                                               params + off.ln2_w, params + off.ln2_b));
  s.ln_out = norm.out;
  s.ln_mean = norm.mean;
  s.ln_rstd = norm.rstd;
  ASSIGN_OR_RETURN(const float* u, GetF32(ctx, s.ln_out));  // (B, T, C)

  // Router.
  {
    ASSIGN_OR_RETURN(tensor::Buffer logits,
                     AllocF32(ctx, int64_t{N} * E, p + "moe.router_logits", false));  // (N, E)
    ctx.ops.matmul_forward(logits.as<float>(), u, params + off.router, nullptr, N, C, E);
    ASSIGN_OR_RETURN(tensor::Buffer probs,
                     AllocF32(ctx, int64_t{N} * E, p + "moe.router_probs", false));  // (N, E)
    ctx.ops.softmax_forward(probs.as<float>(), logits.as<float>(), N, E);
    logits.Reset();
    ASSIGN_OR_RETURN(s.probs, SaveF32(ctx, p + "moe.router_probs", layer, std::move(probs), {N, E},
                                      {"router", {s.ln_out}, 2.0 * NC * E}));
  }
  ASSIGN_OR_RETURN(const float* probs, GetF32(ctx, s.probs));
  ASSIGN_OR_RETURN(tensor::Buffer idx, AllocI32(ctx, int64_t{N} * K, p + "moe.topk_indices"));
  ASSIGN_OR_RETURN(tensor::Buffer gates,
                   AllocF32(ctx, int64_t{N} * K, p + "moe.gates", false));  // (N, k)
  ctx.ops.topk_forward(idx.as<int32_t>(), gates.as<float>(), probs, N, E, K, m.normalize);
  const int32_t* indices = idx.as<int32_t>();
  const float* g = gates.as<float>();
  ASSIGN_OR_RETURN(s.indices, SaveI32(ctx, p + "moe.topk_indices", layer, std::move(idx), {N, K},
                                      {"topk", {s.probs}, 0}));
  ASSIGN_OR_RETURN(s.gates, SaveF32(ctx, p + "moe.gates", layer, std::move(gates), {N, K},
                                    {"topk", {s.probs}, 0}));
  s.aux = ctx.ops.aux_loss_forward(probs, indices, N, E, K, static_cast<float>(m.alpha));

  // Dispatch: from here on the sizes depend on routing.
  const device::DispatchPlan plan = ctx.ops.make_dispatch_plan(indices, N, E, K, m.capacity_factor);
  s.routed = plan.routed;
  s.rows = plan.rows();
  s.dropped = int64_t{N} * K - s.rows;
  s.distributed = Distributed(ctx);
  const int64_t S = s.rows;
  const int El = m.El(), fl = m.fl();

  ASSIGN_OR_RETURN(tensor::Buffer xin, AllocF32(ctx, S * C, p + "moe.expert_input", false));
  ctx.ops.permute_forward(xin.as<float>(), u, plan, C);  // (S, C)
  const int64_t* offsets = plan.offsets.data();
  int64_t R = S;
  if (s.distributed) {
    const moe::ExpertDispatcher dispatcher = DispatcherOf(ctx, E);
    ASSIGN_OR_RETURN(s.dispatch, dispatcher.Prepare(plan.counts));
    R = s.dispatch.R();
    offsets = s.dispatch.expert_offsets.data();
    ASSIGN_OR_RETURN(tensor::Buffer ex, AllocF32(ctx, R * C, p + "moe.expert_input", false));
    ASSIGN_OR_RETURN(tensor::Buffer scratch,
                     AllocF32(ctx, Scratch(s.dispatch, C), p + "moe.dispatch_scratch", false));
    RETURN_IF_ERROR(dispatcher.ToExperts(s.dispatch, xin.as<float>(), ex.as<float>(), C,
                                         scratch.as<float>()));  // (R, C)
    scratch.Reset();
    xin = std::move(ex);
  }
  ASSIGN_OR_RETURN(tensor::Buffer pre, AllocF32(ctx, R * fl, p + "moe.expert_pre", false));
  ctx.ops.grouped_matmul_forward(pre.as<float>(), xin.as<float>(), params + off.w1, params + off.b1,
                                 offsets, El, C, fl);  // (R, fl)
  ASSIGN_OR_RETURN(tensor::Buffer hid, AllocF32(ctx, R * fl, p + "moe.expert_hidden", false));
  ctx.ops.gelu_forward(hid.as<float>(), pre.as<float>(), R * fl);  // (R, fl)
  ASSIGN_OR_RETURN(tensor::Buffer eo, AllocF32(ctx, R * C, p + "moe.expert_output", false));
  ctx.ops.grouped_matmul_forward(eo.as<float>(), hid.as<float>(), params + off.w2,  // (R, C)
                                 m.adds_b2 ? params + off.b2 : nullptr, offsets, El, fl, C);
  if (s.distributed) {
    const moe::ExpertDispatcher dispatcher = DispatcherOf(ctx, E);
    ASSIGN_OR_RETURN(tensor::Buffer back, AllocF32(ctx, S * C, p + "moe.expert_output", false));
    ASSIGN_OR_RETURN(tensor::Buffer scratch,
                     AllocF32(ctx, Scratch(s.dispatch, C), p + "moe.combine_scratch", false));
    RETURN_IF_ERROR(dispatcher.FromExperts(s.dispatch, eo.as<float>(), back.as<float>(), C,
                                           scratch.as<float>()));  // (S, C)
    scratch.Reset();
    eo = std::move(back);
  }
  ASSIGN_OR_RETURN(tensor::Buffer out, AllocF32(ctx, NC, p + "moe.residual", false));  // (B,T,C)
  float* o = out.as<float>();
  ctx.ops.unpermute_forward(o, eo.as<float>(), g, plan, C);
  for (int64_t i = 0; i < NC; ++i) o[i] += x[i];

  ASSIGN_OR_RETURN(s.xin, SaveF32(ctx, p + "moe.expert_input", layer, std::move(xin), {R, C},
                                  {"permute", {s.ln_out, s.indices}, 0}));
  ASSIGN_OR_RETURN(s.pre, SaveF32(ctx, p + "moe.expert_pre", layer, std::move(pre), {R, fl},
                                  {"grouped_matmul", {s.xin}, 2.0 * R * C * fl}));
  ASSIGN_OR_RETURN(s.hidden, SaveF32(ctx, p + "moe.expert_hidden", layer, std::move(hid), {R, fl},
                                     {"gelu", {s.pre}, 10.0 * R * fl}));
  ASSIGN_OR_RETURN(s.eo, SaveF32(ctx, p + "moe.expert_output", layer, std::move(eo), {S, C},
                                 {"grouped_matmul", {s.hidden}, 2.0 * R * C * fl}));
  ASSIGN_OR_RETURN(s.out, SaveF32(ctx, p + "moe.residual", layer, std::move(out), {B, T, C}));
  return s;
}

absl::Status MoeBlockBackward(ModuleContext& ctx, const Dims& dims, const MoeShape& m,
                              const LayerOffsets& off, const float* params, float* grads,
                              const MoeSaved& s, StashHandle x_in, double aux_scale, float* dres) {
  const int C = dims.C, N = dims.N();
  const int E = m.E, K = m.k;
  const int64_t NC = int64_t{N} * C;
  RETURN_IF_ERROR(ctx.stash.Acquire({x_in, s.ln_out, s.ln_mean, s.ln_rstd, s.probs, s.indices,
                                     s.gates, s.xin, s.pre, s.hidden, s.eo}));
  ASSIGN_OR_RETURN(const float* x, GetF32(ctx, x_in));
  ASSIGN_OR_RETURN(const float* u, GetF32(ctx, s.ln_out));
  ASSIGN_OR_RETURN(const float* mean, GetF32(ctx, s.ln_mean));
  ASSIGN_OR_RETURN(const float* rstd, GetF32(ctx, s.ln_rstd));
  ASSIGN_OR_RETURN(const float* probs, GetF32(ctx, s.probs));
  ASSIGN_OR_RETURN(const int32_t* indices, GetI32(ctx, s.indices));
  ASSIGN_OR_RETURN(const float* gates, GetF32(ctx, s.gates));
  ASSIGN_OR_RETURN(const float* xin, GetF32(ctx, s.xin));
  ASSIGN_OR_RETURN(const float* pre, GetF32(ctx, s.pre));
  ASSIGN_OR_RETURN(const float* hid, GetF32(ctx, s.hidden));
  ASSIGN_OR_RETURN(const float* eo, GetF32(ctx, s.eo));

  const device::DispatchPlan plan = ctx.ops.make_dispatch_plan(indices, N, E, K, m.capacity_factor);
  const int64_t S = plan.rows();
  if (S != s.rows) {
    return absl::InternalError(
        absl::StrCat("moe backward: rebuilt dispatch plan has ", S, " rows, forward had ", s.rows));
  }
  const int El = m.El(), fl = m.fl();
  const int64_t* offsets = s.distributed ? s.dispatch.expert_offsets.data() : plan.offsets.data();
  const int64_t R = s.distributed ? s.dispatch.R() : S;

  ASSIGN_OR_RETURN(tensor::Buffer deo, AllocF32(ctx, S * C, "moe.dexpert_output", true));
  ASSIGN_OR_RETURN(tensor::Buffer dgates, AllocF32(ctx, int64_t{N} * K, "moe.dgates", true));
  ctx.ops.unpermute_backward(deo.as<float>(), dgates.as<float>(), dres, eo, gates, plan, C);
  if (s.distributed) {  // the combine's adjoint: the output gradient goes to the experts
    ASSIGN_OR_RETURN(tensor::Buffer ex, AllocF32(ctx, R * C, "moe.dexpert_output", false));
    ASSIGN_OR_RETURN(tensor::Buffer scratch,
                     AllocF32(ctx, Scratch(s.dispatch, C), "moe.combine_scratch", false));
    RETURN_IF_ERROR(DispatcherOf(ctx, E).ToExperts(s.dispatch, deo.as<float>(), ex.as<float>(), C,
                                                   scratch.as<float>()));
    scratch.Reset();
    deo = std::move(ex);
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
    RETURN_IF_ERROR(DispatcherOf(ctx, E).FromExperts(s.dispatch, dxin.as<float>(), back.as<float>(),
                                                     C, scratch.as<float>()));
    scratch.Reset();
    dxin = std::move(back);
  }
  ASSIGN_OR_RETURN(tensor::Buffer du, AllocF32(ctx, NC, "ln2.dout", true));  // (B, T, C)
  ctx.ops.permute_backward(du.as<float>(), dxin.as<float>(), plan, C);
  dxin.Reset();

  ASSIGN_OR_RETURN(tensor::Buffer dprobs, AllocF32(ctx, int64_t{N} * E, "moe.dprobs", true));
  ctx.ops.topk_backward(dprobs.as<float>(), dgates.as<float>(), probs, indices, N, E, K,
                        m.normalize);
  ctx.ops.aux_loss_backward(dprobs.as<float>(), indices, N, E, K, static_cast<float>(m.alpha),
                            static_cast<float>(aux_scale));
  dgates.Reset();
  ASSIGN_OR_RETURN(tensor::Buffer dlogits, AllocF32(ctx, int64_t{N} * E, "moe.dlogits", true));
  ctx.ops.softmax_backward(dlogits.as<float>(), dprobs.as<float>(), probs, N, E);
  dprobs.Reset();
  ctx.ops.matmul_backward(du.as<float>(), grads + off.router, nullptr, dlogits.as<float>(), u,
                          params + off.router, N, C, E);
  dlogits.Reset();
  ctx.ops.layernorm_backward(dres, grads + off.ln2_w, grads + off.ln2_b, du.as<float>(), x,
                             params + off.ln2_w, mean, rstd, N, C);
  du.Reset();
  return ReleaseAll(ctx, {s.ln_out, s.ln_mean, s.ln_rstd, s.probs, s.indices, s.gates, s.xin, s.pre,
                          s.hidden, s.eo, s.out});
}

int64_t MoeSavedBytes(const Dims& d, const MoeShape& m, int64_t S) {
  const int64_t N = d.N(), NC = N * d.C;
  return F32Bytes(NC) + 2 * F32Bytes(N) + F32Bytes(N * m.E) + I32Bytes(N * m.k) +
         F32Bytes(N * m.k) + 2 * F32Bytes(S * d.C) + 2 * F32Bytes(S * m.f) + F32Bytes(NC);
}

int64_t MoeForwardPeakBytes(const Dims& d, const MoeShape& m, int64_t S) {
  const int64_t N = d.N(), NC = N * d.C;
  BytesTimeline t;
  t.Alloc(F32Bytes(NC) + 2 * F32Bytes(N));         // ln2 out, mean, rstd
  t.Alloc(F32Bytes(N * m.E));                      // router logits
  t.Alloc(F32Bytes(N * m.E));                      // router probs
  t.Free(F32Bytes(N * m.E));                       // router logits
  t.Alloc(I32Bytes(N * m.k) + F32Bytes(N * m.k));  // indices, gates
  t.Alloc(F32Bytes(S * d.C));                      // expert input
  t.Alloc(2 * F32Bytes(S * m.f));                  // expert pre, hidden
  t.Alloc(F32Bytes(S * d.C));                      // expert output
  t.Alloc(F32Bytes(NC));                           // residual
  return t.peak();
}

int64_t MoeBackwardPeakBytes(const Dims& d, const MoeShape& m, int64_t S) {
  const int64_t N = d.N(), NC = N * d.C;
  BytesTimeline t;
  t.Alloc(F32Bytes(S * d.C));  // dexpert_output
  t.Alloc(F32Bytes(N * m.k));  // dgates
  t.Alloc(F32Bytes(S * m.f));  // dexpert_hidden
  t.Free(F32Bytes(S * d.C));   // dexpert_output
  t.Alloc(F32Bytes(S * m.f));  // dexpert_pre
  t.Free(F32Bytes(S * m.f));   // dexpert_hidden
  t.Alloc(F32Bytes(S * d.C));  // dexpert_input
  t.Free(F32Bytes(S * m.f));   // dexpert_pre
  t.Alloc(F32Bytes(NC));       // ln2.dout
  t.Free(F32Bytes(S * d.C));   // dexpert_input
  t.Alloc(F32Bytes(N * m.E));  // dprobs
  t.Free(F32Bytes(N * m.k));   // dgates
  t.Alloc(F32Bytes(N * m.E));  // dlogits
  return t.peak();
}

}  // namespace furnace::model
