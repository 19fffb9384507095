#include "runtime/model/mlp_block.h"

#include "absl/strings/str_cat.h"
#include "runtime/base/status.h"

namespace furnace::model {

absl::StatusOr<MlpSaved> MlpBlockForward(ModuleContext& ctx, const Dims& dims, int F, int layer,
                                         const LayerOffsets& off, const float* params,
                                         StashHandle x_in) {
  const int B = dims.B, T = dims.T, C = dims.C, N = dims.N();
  const int64_t NC = int64_t{N} * C, NF = int64_t{N} * F;
  const std::string p = absl::StrCat("layers.", layer, ".");
  ASSIGN_OR_RETURN(const float* x, GetF32(ctx, x_in));  // (B, T, C)
  MlpSaved s;

  ASSIGN_OR_RETURN(SavedNorm norm, NormForward(ctx, dims, p + "ln2", layer, x_in,
                                               params + off.ln2_w, params + off.ln2_b));
  s.ln_out = norm.out;
  s.ln_mean = norm.mean;
  s.ln_rstd = norm.rstd;
  ASSIGN_OR_RETURN(const float* u, GetF32(ctx, s.ln_out));  // (B, T, C)

  ASSIGN_OR_RETURN(tensor::Buffer pre, AllocF32(ctx, NF, p + "mlp.pre", false));  // (B, T, F)
  ctx.ops.matmul_forward(pre.as<float>(), u, params + off.w1, params + off.b1, N, C, F);
  ASSIGN_OR_RETURN(tensor::Buffer hid, AllocF32(ctx, NF, p + "mlp.hidden", false));  // (B, T, F)
  ctx.ops.gelu_forward(hid.as<float>(), pre.as<float>(), NF);
  const float* h = hid.as<float>();
  // Rebuilt from the norm's output by the same GEMM (this rank's columns under tensor
  // parallelism: no collective), so a planner may drop it.
  RecomputeSpec pre_spec{"matmul", {s.ln_out}, 2.0 * NC * F};
  pre_spec.rebuild = [ctx, ln = s.ln_out, w = params + off.w1, b = params + off.b1, N, C, F, NF,
                      tag = p + "mlp.pre"]() mutable -> absl::StatusOr<tensor::Buffer> {
    ASSIGN_OR_RETURN(const float* in, GetF32(ctx, ln));
    ASSIGN_OR_RETURN(tensor::Buffer out, AllocF32(ctx, NF, tag, false));  // (B, T, F)
    ctx.ops.matmul_forward(out.as<float>(), in, w, b, N, C, F);
    return out;
  };
  ASSIGN_OR_RETURN(
      s.pre, SaveF32(ctx, p + "mlp.pre", layer, std::move(pre), {B, T, F}, std::move(pre_spec)));
  RecomputeSpec gelu{"gelu", {s.pre}, 10.0 * NF};
  gelu.rebuild = [ctx, pre = s.pre, NF,
                  tag = p + "mlp.hidden"]() mutable -> absl::StatusOr<tensor::Buffer> {
    ASSIGN_OR_RETURN(const float* in, GetF32(ctx, pre));
    ASSIGN_OR_RETURN(tensor::Buffer out, AllocF32(ctx, NF, tag, false));  // (B, T, F)
    ctx.ops.gelu_forward(out.as<float>(), in, NF);
    return out;
  };
  ASSIGN_OR_RETURN(
      s.hidden, SaveF32(ctx, p + "mlp.hidden", layer, std::move(hid), {B, T, F}, std::move(gelu)));

  ASSIGN_OR_RETURN(tensor::Buffer out, AllocF32(ctx, NC, p + "mlp.residual", false));  // (B,T,C)
  float* o = out.as<float>();
  if (dims.tp == 1) {
    ctx.ops.matmul_forward(o, h, params + off.w2, params + off.b2, N, F, C);
    ctx.ops.add_inplace(o, x, NC);
  } else {  // row-parallel w2 (F is this rank's column block of the hidden width)
    ctx.ops.matmul_forward(o, h, params + off.w2, nullptr, N, F, C);
    RETURN_IF_ERROR(RowParallelFinish(ctx, o, params + off.b2, x, N, C));
  }
  ASSIGN_OR_RETURN(s.out, SaveF32(ctx, p + "mlp.residual", layer, std::move(out), {B, T, C}));
  return s;
}

absl::Status MlpBlockBackward(ModuleContext& ctx, const Dims& dims, int F, const LayerOffsets& off,
                              const float* params, float* grads, const MlpSaved& s,
                              StashHandle x_in, float* dres) {
  const int C = dims.C, N = dims.N();
  const int64_t NC = int64_t{N} * C, NF = int64_t{N} * F;
  ASSIGN_OR_RETURN(Stash::Lease lease,
                   ctx.stash.Acquire({x_in, s.ln_out, s.ln_mean, s.ln_rstd, s.pre, s.hidden}));
  ASSIGN_OR_RETURN(const float* x, GetF32(ctx, x_in));
  ASSIGN_OR_RETURN(const float* u, GetF32(ctx, s.ln_out));
  ASSIGN_OR_RETURN(const float* mean, GetF32(ctx, s.ln_mean));
  ASSIGN_OR_RETURN(const float* rstd, GetF32(ctx, s.ln_rstd));
  ASSIGN_OR_RETURN(const float* pre, GetF32(ctx, s.pre));
  ASSIGN_OR_RETURN(const float* h, GetF32(ctx, s.hidden));

  ASSIGN_OR_RETURN(tensor::Buffer dh, AllocF32(ctx, NF, "mlp.dhidden", true));  // (B, T, F)
  ctx.ops.matmul_backward(dh.as<float>(), grads + off.w2, grads + off.b2, dres, h, params + off.w2,
                          N, F, C);
  ASSIGN_OR_RETURN(tensor::Buffer dpre, AllocF32(ctx, NF, "mlp.dpre", true));  // (B, T, F)
  ctx.ops.gelu_backward(dpre.as<float>(), pre, dh.as<float>(), NF);
  dh.Reset();
  ASSIGN_OR_RETURN(tensor::Buffer du, AllocF32(ctx, NC, "ln2.dout", true));  // (B, T, C)
  ctx.ops.matmul_backward(du.as<float>(), grads + off.w1, grads + off.b1, dpre.as<float>(), u,
                          params + off.w1, N, C, F);
  dpre.Reset();
  RETURN_IF_ERROR(ColumnParallelInputGrad(ctx, du.as<float>(), NC));
  ctx.ops.layernorm_backward(dres, grads + off.ln2_w, grads + off.ln2_b, du.as<float>(), x,
                             params + off.ln2_w, mean, rstd, N, C);
  du.Reset();
  return ReleaseAll(ctx, {s.ln_out, s.ln_mean, s.ln_rstd, s.pre, s.hidden, s.out});
}

}  // namespace furnace::model
