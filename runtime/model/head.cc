#include "runtime/model/head.h"

#include <vector>

#include "runtime/base/status.h"

namespace furnace::model {

absl::StatusOr<HeadSaved> HeadForward(ModuleContext& ctx, const Dims& dims, int V, const float* wte,
                                      const float* lnf_w, const float* lnf_b, StashHandle x_in,
                                      const int32_t* targets, std::vector<float>* logits_out) {
  const int B = dims.B, T = dims.T, C = dims.C, N = dims.N();
  const int64_t NC = int64_t{N} * C, NV = int64_t{N} * V;
  HeadSaved s;

  // The target ids (host) uploaded.
  ASSIGN_OR_RETURN(tensor::Buffer tgt, AllocI32(ctx, N, "head.targets"));  // (B, T)
  RETURN_IF_ERROR(Upload(ctx, tgt.data(), targets, I32Bytes(N)));
  const int32_t* dev_targets = tgt.as<int32_t>();
  ASSIGN_OR_RETURN(s.targets, SaveI32(ctx, "head.targets", -1, std::move(tgt), {B, T}));

  ASSIGN_OR_RETURN(SavedNorm norm, NormForward(ctx, dims, "lnf", -1, x_in, lnf_w, lnf_b));
  s.ln_out = norm.out;
  s.ln_mean = norm.mean;
  s.ln_rstd = norm.rstd;
  ASSIGN_OR_RETURN(const float* y, GetF32(ctx, s.ln_out));  // (B, T, C)

  ASSIGN_OR_RETURN(tensor::Buffer wte_t, AllocF32(ctx, int64_t{C} * V, "head.wte_t", false));
  ctx.ops.transpose(wte_t.as<float>(), wte, V, C);  // (C, V) = wte (V, C) transposed
  ASSIGN_OR_RETURN(tensor::Buffer logits, AllocF32(ctx, NV, "head.logits", false));  // (B, T, V)
  ctx.ops.matmul_forward(logits.as<float>(), y, wte_t.as<float>(), nullptr, N, C, V);
  wte_t.Reset();
  if (logits_out != nullptr) {  // a host transfer (tests and sampling): the stream waits
    logits_out->resize(NV);
    RETURN_IF_ERROR(ToHost(ctx, logits_out->data(), logits.data(), F32Bytes(NV)));
  }

  ASSIGN_OR_RETURN(tensor::Buffer probs, AllocF32(ctx, NV, "head.probs", false));   // (B, T, V)
  ASSIGN_OR_RETURN(tensor::Buffer losses, AllocF32(ctx, N, "head.losses", false));  // (B, T)
  ctx.ops.cross_entropy_forward(losses.as<float>(), probs.as<float>(), logits.as<float>(),
                                dev_targets, N, V);
  // The loss is a host value: the per-token losses come back (the stream waits) and are summed
  // in token order.
  std::vector<float> host_losses(N);
  RETURN_IF_ERROR(ToHost(ctx, host_losses.data(), losses.data(), F32Bytes(N)));
  for (int i = 0; i < N; ++i) s.ce_sum += host_losses[i];
  losses.Reset();
  logits.Reset();
  ASSIGN_OR_RETURN(s.probs, SaveF32(ctx, "head.probs", -1, std::move(probs), {B, T, V},
                                    {"head", {s.ln_out}, 2.0 * NC * V}));
  return s;
}

absl::Status HeadBackward(ModuleContext& ctx, const Dims& dims, int V, const float* wte,
                          const float* lnf_w, float* dwte, float* dlnf_w, float* dlnf_b,
                          const HeadSaved& s, StashHandle x_in, double ce_scale, float* dres) {
  const int C = dims.C, N = dims.N();
  const int64_t NC = int64_t{N} * C, NV = int64_t{N} * V;
  ASSIGN_OR_RETURN(Stash::Lease lease,
                   ctx.stash.Acquire({x_in, s.targets, s.ln_out, s.ln_mean, s.ln_rstd, s.probs}));
  ASSIGN_OR_RETURN(const float* x, GetF32(ctx, x_in));
  ASSIGN_OR_RETURN(const int32_t* targets, GetI32(ctx, s.targets));
  ASSIGN_OR_RETURN(const float* y, GetF32(ctx, s.ln_out));
  ASSIGN_OR_RETURN(const float* mean, GetF32(ctx, s.ln_mean));
  ASSIGN_OR_RETURN(const float* rstd, GetF32(ctx, s.ln_rstd));
  ASSIGN_OR_RETURN(const float* probs, GetF32(ctx, s.probs));

  ASSIGN_OR_RETURN(tensor::Buffer dlogits, AllocF32(ctx, NV, "head.dlogits", true));  // (B, T, V)
  float* dl = dlogits.as<float>();
  ctx.ops.cross_entropy_backward(dl, probs, targets, static_cast<float>(ce_scale), N, V);
  ASSIGN_OR_RETURN(tensor::Buffer dy, AllocF32(ctx, NC, "lnf.dout", false));  // (B, T, C)
  ctx.ops.matmul_forward(dy.as<float>(), dl, wte, nullptr, N, V, C);          // dy = dlogits @ wte
  // dwte (V, C) += dlogits^T @ y: MatmulBackward's weight-gradient GEMM with inp = dlogits.
  ctx.ops.matmul_backward(nullptr, dwte, nullptr, y, dl, wte, N, V, C);
  dlogits.Reset();
  ctx.ops.layernorm_backward(dres, dlnf_w, dlnf_b, dy.as<float>(), x, lnf_w, mean, rstd, N, C);
  dy.Reset();
  return ReleaseAll(ctx, {s.targets, s.ln_out, s.ln_mean, s.ln_rstd, s.probs});
}

}  // namespace furnace::model
