#include "runtime/model/attention_block.h"

#include "absl/strings/str_cat.h"
#include "runtime/base/status.h"

namespace furnace::model {

absl::StatusOr<AttentionSaved> AttentionBlockForward(ModuleContext& ctx, const Dims& dims,
                                                     int layer, const LayerOffsets& off,
                                                     const float* params, StashHandle x_in) {
  // Tensor parallelism: this rank's NH/tp heads (Cl = C/tp columns of q, k and v), then a
  // row-parallel projection summed over the TP group.
  const int B = dims.B, T = dims.T, C = dims.C, N = dims.N();
  const int Cl = dims.local_C(), NHl = dims.local_NH();
  const int64_t NC = int64_t{N} * C, NCl = int64_t{N} * Cl;
  const std::string p = absl::StrCat("layers.", layer, ".");
  ASSIGN_OR_RETURN(const float* x, GetF32(ctx, x_in));  // (B, T, C)
  AttentionSaved s;

  ASSIGN_OR_RETURN(SavedNorm norm, NormForward(ctx, dims, p + "ln1", layer, x_in,
                                               params + off.ln1_w, params + off.ln1_b));
  s.ln_out = norm.out;
  s.ln_mean = norm.mean;
  s.ln_rstd = norm.rstd;
  ASSIGN_OR_RETURN(const float* a, GetF32(ctx, s.ln_out));  // (B, T, C)

  ASSIGN_OR_RETURN(tensor::Buffer qkv, AllocF32(ctx, 3 * NCl, p + "attn.qkv", false));  // (B,T,3Cl)
  ctx.ops.matmul_forward(qkv.as<float>(), a, params + off.wqkv, params + off.bqkv, N, C, 3 * Cl);
  const float* q = qkv.as<float>();
  // Rebuilt from the norm's output by the same GEMM (bit for bit; under tensor parallelism this
  // rank's columns from the whole input: no collective), so a planner may drop it.
  RecomputeSpec qkv_spec{"matmul", {s.ln_out}, 2.0 * NC * 3 * Cl};
  qkv_spec.rebuild = [ctx, ln = s.ln_out, w = params + off.wqkv, b = params + off.bqkv, N, C, Cl,
                      tag = p + "attn.qkv"]() mutable -> absl::StatusOr<tensor::Buffer> {
    ASSIGN_OR_RETURN(const float* in, GetF32(ctx, ln));
    ASSIGN_OR_RETURN(tensor::Buffer out, AllocF32(ctx, int64_t{N} * 3 * Cl, tag, false));
    ctx.ops.matmul_forward(out.as<float>(), in, w, b, N, C, 3 * Cl);
    return out;
  };
  ASSIGN_OR_RETURN(s.qkv, SaveF32(ctx, p + "attn.qkv", layer, std::move(qkv), {B, T, 3 * Cl},
                                  std::move(qkv_spec)));

  // att: the probabilities (B, NHl, T, T), or under recompute_probs each row's statistics
  // (B, NHl, T, 2), from which backward rebuilds them.
  const bool rebuild = dims.recompute_probs;
  const std::string att_name = p + (rebuild ? "attn.stats" : "attn.probs");
  const int64_t att_bytes = rebuild ? AttentionRowStatsBytes(dims) : AttentionProbsBytes(dims);
  ASSIGN_OR_RETURN(tensor::Buffer att, AllocF32(ctx, att_bytes / 4, att_name, false));
  ASSIGN_OR_RETURN(tensor::Buffer y, AllocF32(ctx, NCl, p + "attn.y", false));  // (B, T, Cl)
  if (rebuild) {
    ctx.ops.attention_forward_row_stats(y.as<float>(), att.as<float>(), q, B, T, Cl, NHl);
  } else {
    ctx.ops.attention_forward(y.as<float>(), att.as<float>(), q, B, T, Cl, NHl);
  }
  const float* yv = y.as<float>();
  const int hs = C / dims.NH;
  const double att_flops = 4.0 * B * NHl * T * T * hs;
  // The probabilities can be rebuilt from qkv alone (the forward's scores and softmax, bit for
  // bit: attention_probs), so a planner may drop them; the row statistics are not worth it.
  RecomputeSpec att_spec{"attention", {s.qkv}, 2.0 * B * NHl * T * T * hs};
  if (!rebuild) {
    att_spec.rebuild = [ctx, qkv = s.qkv, B, T, Cl, NHl, floats = att_bytes / 4,
                        tag = att_name]() mutable -> absl::StatusOr<tensor::Buffer> {
      ASSIGN_OR_RETURN(const float* in, GetF32(ctx, qkv));
      ASSIGN_OR_RETURN(tensor::Buffer out, AllocF32(ctx, floats, tag, false));  // (B,NHl,T,T)
      ctx.ops.attention_probs(out.as<float>(), in, B, T, Cl, NHl);
      return out;
    };
  }
  ASSIGN_OR_RETURN(s.att, SaveF32(ctx, att_name, layer, std::move(att),
                                  {B, NHl, T, rebuild ? 2 : T}, std::move(att_spec)));
  // Under recompute_probs the attention's output is rebuilt as it was made: the same forward from
  // qkv (bit for bit), its row statistics into scratch. (With the probabilities stored, that
  // forward would need their (B, NHl, T, T) again as scratch: not rebuilt.)
  RecomputeSpec y_spec{"attention", {s.qkv}, att_flops};
  if (rebuild) {
    y_spec.rebuild = [ctx, qkv = s.qkv, B, T, Cl, NHl, NCl, stats_floats = att_bytes / 4, p,
                      tag = p + "attn.y"]() mutable -> absl::StatusOr<tensor::Buffer> {
      ASSIGN_OR_RETURN(const float* in, GetF32(ctx, qkv));
      ASSIGN_OR_RETURN(tensor::Buffer out, AllocF32(ctx, NCl, tag, false));  // (B, T, Cl)
      ASSIGN_OR_RETURN(tensor::Buffer stats,
                       AllocF32(ctx, stats_floats, p + "attn.stats", false));  // scratch
      ctx.ops.attention_forward_row_stats(out.as<float>(), stats.as<float>(), in, B, T, Cl, NHl);
      return out;
    };
  }
  ASSIGN_OR_RETURN(s.y,
                   SaveF32(ctx, p + "attn.y", layer, std::move(y), {B, T, Cl}, std::move(y_spec)));

  ASSIGN_OR_RETURN(tensor::Buffer out, AllocF32(ctx, NC, p + "attn.residual", false));  // (B,T,C)
  float* o = out.as<float>();
  if (dims.tp == 1) {
    ctx.ops.matmul_forward(o, yv, params + off.wo, params + off.bo, N, C, C);
    ctx.ops.add_inplace(o, x, NC);
  } else {
    ctx.ops.matmul_forward(o, yv, params + off.wo, nullptr, N, Cl, C);
    RETURN_IF_ERROR(RowParallelFinish(ctx, o, params + off.bo, x, N, C));
  }
  ASSIGN_OR_RETURN(s.out, SaveF32(ctx, p + "attn.residual", layer, std::move(out), {B, T, C}));
  return s;
}

absl::Status AttentionBlockBackward(ModuleContext& ctx, const Dims& dims, const LayerOffsets& off,
                                    const float* params, float* grads, const AttentionSaved& s,
                                    StashHandle x_in, float* dres) {
  const int B = dims.B, T = dims.T, C = dims.C, N = dims.N();
  const int Cl = dims.local_C(), NHl = dims.local_NH();
  const int64_t NC = int64_t{N} * C, NCl = int64_t{N} * Cl;
  ASSIGN_OR_RETURN(Stash::Lease lease,
                   ctx.stash.Acquire({x_in, s.ln_out, s.ln_mean, s.ln_rstd, s.qkv, s.att, s.y}));
  ASSIGN_OR_RETURN(const float* x, GetF32(ctx, x_in));
  ASSIGN_OR_RETURN(const float* a, GetF32(ctx, s.ln_out));
  ASSIGN_OR_RETURN(const float* mean, GetF32(ctx, s.ln_mean));
  ASSIGN_OR_RETURN(const float* rstd, GetF32(ctx, s.ln_rstd));
  ASSIGN_OR_RETURN(const float* qkv, GetF32(ctx, s.qkv));
  ASSIGN_OR_RETURN(const float* att, GetF32(ctx, s.att));
  ASSIGN_OR_RETURN(const float* y, GetF32(ctx, s.y));

  ASSIGN_OR_RETURN(tensor::Buffer dy, AllocF32(ctx, NCl, "attn.dy", true));  // (B, T, Cl)
  ctx.ops.matmul_backward(dy.as<float>(), grads + off.wo, grads + off.bo, dres, y, params + off.wo,
                          N, Cl, C);
  ASSIGN_OR_RETURN(tensor::Buffer dqkv, AllocF32(ctx, 3 * NCl, "attn.dqkv", true));  // (B,T,3Cl)
  if (dims.recompute_probs) {
    ctx.ops.attention_backward_row_stats(dqkv.as<float>(), dy.as<float>(), qkv, att, B, T, Cl, NHl);
  } else {
    ctx.ops.attention_backward(dqkv.as<float>(), dy.as<float>(), qkv, att, B, T, Cl, NHl);
  }
  dy.Reset();
  ASSIGN_OR_RETURN(tensor::Buffer da, AllocF32(ctx, NC, "ln1.dout", true));  // (B, T, C)
  ctx.ops.matmul_backward(da.as<float>(), grads + off.wqkv, grads + off.bqkv, dqkv.as<float>(), a,
                          params + off.wqkv, N, C, 3 * Cl);
  dqkv.Reset();
  RETURN_IF_ERROR(ColumnParallelInputGrad(ctx, da.as<float>(), NC));
  ctx.ops.layernorm_backward(dres, grads + off.ln1_w, grads + off.ln1_b, da.as<float>(), x,
                             params + off.ln1_w, mean, rstd, N, C);
  da.Reset();
  return ReleaseAll(ctx, {s.ln_out, s.ln_mean, s.ln_rstd, s.qkv, s.att, s.y, s.out});
}

}  // namespace furnace::model
