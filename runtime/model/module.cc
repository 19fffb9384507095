#include "runtime/model/module.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "runtime/base/status.h"

namespace furnace::model {
namespace {

absl::StatusOr<tensor::TensorView> GetTyped(ModuleContext& ctx, StashHandle handle,
                                            tensor::DType dtype) {
  ASSIGN_OR_RETURN(tensor::TensorView view, ctx.stash.Get(handle));
  if (view.dtype != dtype) {
    return absl::InternalError(absl::StrCat("stash entry ", handle.id, " is ",
                                            tensor::DTypeName(view.dtype), ", want ",
                                            tensor::DTypeName(dtype)));
  }
  return view;
}

}  // namespace

namespace {

// An allocation the arena refuses is tried once more after the stash's copies in flight land:
// an offloaded tensor frees its device bytes only when its copy to the host completes, so whether
// it fits must not depend on how fast the copy thread is. If it still does not fit, a planner
// (ctx.hooks) may make room (the emergency offload) before the step is given up.
absl::StatusOr<tensor::Buffer> Allocate(ModuleContext& ctx, int64_t bytes, std::string tag) {
  absl::StatusOr<tensor::Buffer> buffer = ctx.arena.Allocate(bytes, tag);
  if (!absl::IsResourceExhausted(buffer.status())) return buffer;
  ctx.stash.WaitForCopies();
  buffer = ctx.arena.Allocate(bytes, tag);
  if (!absl::IsResourceExhausted(buffer.status()) || ctx.hooks == nullptr) return buffer;
  if (!ctx.hooks->MakeRoom(static_cast<uint64_t>(bytes))) return buffer;
  return ctx.arena.Allocate(bytes, std::move(tag));
}

}  // namespace

absl::StatusOr<tensor::Buffer> AllocF32(ModuleContext& ctx, int64_t n, std::string tag, bool zero) {
  ASSIGN_OR_RETURN(tensor::Buffer buffer, Allocate(ctx, F32Bytes(n), std::move(tag)));
  if (zero && n > 0) RETURN_IF_ERROR(tensor::Fill(ctx.device(), buffer.data(), 0, buffer.bytes()));
  return buffer;
}

absl::Status Upload(ModuleContext& ctx, void* dst, const void* src, int64_t bytes) {
  if (ctx.uploads != nullptr) return ctx.uploads->Upload(dst, src, static_cast<size_t>(bytes));
  return tensor::CopyToDevice(ctx.device(), dst, src, static_cast<size_t>(bytes));
}

absl::Status ToHost(ModuleContext& ctx, void* dst, const void* src, int64_t bytes) {
  return tensor::CopyToHost(ctx.device(), dst, src, static_cast<size_t>(bytes));
}

absl::StatusOr<tensor::Buffer> AllocI32(ModuleContext& ctx, int64_t n, std::string tag) {
  return Allocate(ctx, I32Bytes(n), std::move(tag));
}

absl::StatusOr<StashHandle> SaveF32(ModuleContext& ctx, std::string producer, int layer,
                                    tensor::Buffer&& buffer, std::vector<int64_t> shape,
                                    RecomputeSpec recompute) {
  return ctx.stash.Save(std::move(producer), layer, std::move(buffer), std::move(shape),
                        tensor::DType::kF32, std::move(recompute));
}

absl::StatusOr<StashHandle> SaveI32(ModuleContext& ctx, std::string producer, int layer,
                                    tensor::Buffer&& buffer, std::vector<int64_t> shape,
                                    RecomputeSpec recompute) {
  return ctx.stash.Save(std::move(producer), layer, std::move(buffer), std::move(shape),
                        tensor::DType::kI32, std::move(recompute));
}

absl::StatusOr<float*> GetF32(ModuleContext& ctx, StashHandle handle) {
  ASSIGN_OR_RETURN(tensor::TensorView view, GetTyped(ctx, handle, tensor::DType::kF32));
  return view.as<float>();
}

absl::StatusOr<int32_t*> GetI32(ModuleContext& ctx, StashHandle handle) {
  ASSIGN_OR_RETURN(tensor::TensorView view, GetTyped(ctx, handle, tensor::DType::kI32));
  return view.as<int32_t>();
}

absl::Status ReleaseAll(ModuleContext& ctx, const std::vector<StashHandle>& handles) {
  for (StashHandle h : handles) {
    if (h.valid()) RETURN_IF_ERROR(ctx.stash.Release(h));
  }
  return absl::OkStatus();
}

absl::StatusOr<SavedNorm> NormForward(ModuleContext& ctx, const Dims& dims,
                                      const std::string& prefix, int layer, StashHandle x_in,
                                      const float* w, const float* b) {
  const int B = dims.B, T = dims.T, C = dims.C, N = dims.N();
  const int64_t NC = int64_t{N} * C;
  ASSIGN_OR_RETURN(const float* x, GetF32(ctx, x_in));                               // (B, T, C)
  ASSIGN_OR_RETURN(tensor::Buffer ln, AllocF32(ctx, NC, prefix + ".out", false));    // (B, T, C)
  ASSIGN_OR_RETURN(tensor::Buffer mean, AllocF32(ctx, N, prefix + ".mean", false));  // (B, T)
  ASSIGN_OR_RETURN(tensor::Buffer rstd, AllocF32(ctx, N, prefix + ".rstd", false));  // (B, T)
  ctx.ops.layernorm_forward(ln.as<float>(), mean.as<float>(), rstd.as<float>(), x, w, b, N, C,
                            kLayerNormEps);
  SavedNorm s;
  ASSIGN_OR_RETURN(s.mean, SaveF32(ctx, prefix + ".mean", layer, std::move(mean), {B, T}));
  ASSIGN_OR_RETURN(s.rstd, SaveF32(ctx, prefix + ".rstd", layer, std::move(rstd), {B, T}));
  RecomputeSpec spec{"layernorm", {x_in}, 8.0 * NC};
  spec.rebuild = [ctx, x_in, w, b, N, NC, C, prefix]() mutable -> absl::StatusOr<tensor::Buffer> {
    ASSIGN_OR_RETURN(const float* xr, GetF32(ctx, x_in));
    ASSIGN_OR_RETURN(tensor::Buffer out, AllocF32(ctx, NC, prefix + ".out", false));
    ASSIGN_OR_RETURN(tensor::Buffer m, AllocF32(ctx, N, prefix + ".mean", false));  // scratch
    ASSIGN_OR_RETURN(tensor::Buffer r, AllocF32(ctx, N, prefix + ".rstd", false));  // scratch
    ctx.ops.layernorm_forward(out.as<float>(), m.as<float>(), r.as<float>(), xr, w, b, N, C,
                              kLayerNormEps);
    return out;
  };
  ASSIGN_OR_RETURN(s.out,
                   SaveF32(ctx, prefix + ".out", layer, std::move(ln), {B, T, C}, std::move(spec)));
  return s;
}

absl::Status RowParallelFinish(ModuleContext& ctx, float* out, const float* bias, const float* x,
                               int64_t N, int C) {
  if (ctx.tp_size() > 1) RETURN_IF_ERROR(ctx.groups.tp->AllReduce(out, N * C));
  ctx.ops.bias_residual(out, bias, x, N, C);
  return absl::OkStatus();
}

absl::Status ColumnParallelInputGrad(ModuleContext& ctx, float* din, int64_t n) {
  if (ctx.tp_size() > 1) return ctx.groups.tp->AllReduce(din, n);
  return absl::OkStatus();
}

}  // namespace furnace::model
