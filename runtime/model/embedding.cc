#include "runtime/model/embedding.h"

#include "runtime/base/status.h"

namespace furnace::model {

absl::StatusOr<EmbeddingSaved> EmbeddingForward(ModuleContext& ctx, const Dims& dims,
                                                const int32_t* tokens, const float* wte,
                                                const float* wpe) {
  const int B = dims.B, T = dims.T, C = dims.C, N = dims.N();
  EmbeddingSaved saved;
  // The token ids (host) uploaded: the data path's way in.
  ASSIGN_OR_RETURN(tensor::Buffer tok, AllocI32(ctx, N, "embedding.tokens"));  // (B, T)
  RETURN_IF_ERROR(Upload(ctx, tok.data(), tokens, I32Bytes(N)));
  const int32_t* dev_tokens = tok.as<int32_t>();
  ASSIGN_OR_RETURN(saved.tokens, SaveI32(ctx, "embedding.tokens", -1, std::move(tok), {B, T}));

  ASSIGN_OR_RETURN(tensor::Buffer out, AllocF32(ctx, int64_t{N} * C, "embedding.out", false));
  ctx.ops.embedding_forward(out.as<float>(), dev_tokens, wte, wpe, B, T, C);  // (B, T, C)
  ASSIGN_OR_RETURN(saved.out, SaveF32(ctx, "embedding.out", -1, std::move(out), {B, T, C},
                                      {"embedding", {saved.tokens}, 0}));
  return saved;
}

absl::Status EmbeddingBackward(ModuleContext& ctx, const Dims& dims, const EmbeddingSaved& saved,
                               const float* dres, float* dwte, float* dwpe) {
  ASSIGN_OR_RETURN(Stash::Lease lease, ctx.stash.Acquire({saved.tokens}));
  ASSIGN_OR_RETURN(const int32_t* tokens, GetI32(ctx, saved.tokens));
  ctx.ops.embedding_backward(dwte, dwpe, dres, tokens, dims.B, dims.T, dims.C);
  return ReleaseAll(ctx, {saved.tokens, saved.out});
}

}  // namespace furnace::model
