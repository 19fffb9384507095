// What every module (embedding, attention block, dense MLP, MoE layer, head) shares: the dims of a
// micro-batch, the backend it computes with, the arena and stash it allocates from, and helpers
// that keep the module files about the math. Module contract (the model's declared activation bytes
// rely on it):
//   forward:  saves tensors only through the stash; frees its scratch before returning;
//   backward: first acquires every saved tensor it reads (Stash::Acquire, the stash's backward
//             rule: reloads land, encodings are decoded, dropped tensors are rebuilt in the order
//             given, and all are pinned), only then takes raw pointers with Get; accumulates
//             parameter gradients and the residual-stream gradient `dres` (N, C) in place, frees
//             its scratch, and releases its own saved tensors as its last step (they stay live
//             during its backward).
// Each module declares its bytes with functions mirroring its allocation order exactly: its saved
// tensors in acquire order (with each one's rebuild scratch), forward peak (own saved + scratch,
// from entry) and backward peak (scratch only). They live in declared_bytes.h (pure, so `furnace
// plan` uses them too), with the dims and rows they take; DeclareModule composes them under a
// memory policy.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/comm/communicator.h"
#include "runtime/device/backend.h"
#include "runtime/memory/policy.h"
#include "runtime/model/declared_bytes.h"
#include "runtime/model/stash.h"
#include "runtime/tensor/arena.h"
#include "runtime/tensor/transfer.h"

namespace furnace::moe {
class ExchangeCounters;
}  // namespace furnace::moe

namespace furnace::model {

// The groups a module talks to; nullptr (or a group of one) where the layout does not split it.
//   tp:  the tensor-parallel group (attention and dense MLP: all-reduce of row-parallel outputs
//        in forward and of the input gradients in backward);
//   ep:  the expert-parallel group (token all-to-all); esp: the expert-sharding group.
struct ParallelGroups {
  comm::Communicator* tp = nullptr;
  comm::Communicator* ep = nullptr;
  comm::Communicator* esp = nullptr;
  // The ESP group is the TP group (topology::Topology::EspGroupIsTpGroup): under the deepspeed
  // schedule the experts are then sliced the DeepSpeed-MoE way (runtime/moe/schedule.h).
  bool esp_is_tp = false;
};

// Where a memory planner hooks into the modules (GptMoe's adaptive policy implements it).
class MemoryHooks {
 public:
  virtual ~MemoryHooks() = default;
  // An MoE block knows its rows (its token counts are exchanged); its expert buffers come next.
  // An error fails the forward.
  virtual absl::Status BeforeExpertBuffers(int layer, const MoeRows& rows) = 0;
  // The arena refused `bytes` even after the stash's copies landed. Make room if possible (the
  // emergency offload); true: something was freed, try again.
  virtual bool MakeRoom(uint64_t bytes) = 0;
};

// `ops`: the backend of the arena's device (device::BackendFor); every kernel call goes through it,
// on the calling thread's current stream. Every pointer a module computes on is memory of that
// device except where a comment says host; bytes cross between the two only through the helpers
// below (Upload, ToHost) and the copies of runtime/tensor/transfer.h.
struct ModuleContext {
  const device::Backend& ops;
  tensor::DeviceArena& arena;
  Stash& stash;
  ParallelGroups groups = {};
  MemoryHooks* hooks = nullptr;  // nullptr: no planner
  // The MoE schedules' per-op byte counters (runtime/moe/executor.h); nullptr: not counted.
  moe::ExchangeCounters* moe_counters = nullptr;
  // Where host inputs (tokens, targets) are staged on their way to the device; nullptr: copied
  // and waited for (tensor::CopyToDevice).
  tensor::UploadRing* uploads = nullptr;
  int tp_size() const { return groups.tp == nullptr ? 1 : groups.tp->size(); }
  device::Device& device() const { return arena.device(); }
};

// The data path's host transfers (gpt_moe.h lists where they happen):
// dst (device) <- src (host), on the current stream; src may be reused on return.
absl::Status Upload(ModuleContext& ctx, void* dst, const void* src, int64_t bytes);
// dst (host) <- src (device), the current stream synchronised: dst holds the bytes on return.
absl::Status ToHost(ModuleContext& ctx, void* dst, const void* src, int64_t bytes);

// Row-parallel output: out (N, C) holds this rank's partial product; sums it over the TP group,
// then adds the bias (C) and the residual x (N, C). With tp == 1 only the adds.
absl::Status RowParallelFinish(ModuleContext& ctx, float* out, const float* bias, const float* x,
                               int64_t N, int C);
// Column-parallel input gradient: din (N, C) partial over the TP group -> summed in place.
absl::Status ColumnParallelInputGrad(ModuleContext& ctx, float* din, int64_t n);

inline constexpr float kLayerNormEps = 1e-5f;  // MODEL.md: every LayerNorm

// Arena scratch of n floats / int32s; `zero` fills it with 0 (backward accumulators), enqueued on
// the current stream.
absl::StatusOr<tensor::Buffer> AllocF32(ModuleContext& ctx, int64_t n, std::string tag, bool zero);
absl::StatusOr<tensor::Buffer> AllocI32(ModuleContext& ctx, int64_t n, std::string tag);

// Saves a float / int32 buffer of `shape` under `producer`.
absl::StatusOr<StashHandle> SaveF32(ModuleContext& ctx, std::string producer, int layer,
                                    tensor::Buffer&& buffer, std::vector<int64_t> shape,
                                    RecomputeSpec recompute = {});
absl::StatusOr<StashHandle> SaveI32(ModuleContext& ctx, std::string producer, int layer,
                                    tensor::Buffer&& buffer, std::vector<int64_t> shape,
                                    RecomputeSpec recompute = {});

absl::StatusOr<float*> GetF32(ModuleContext& ctx, StashHandle handle);
absl::StatusOr<int32_t*> GetI32(ModuleContext& ctx, StashHandle handle);

// A pre-norm (ln1 before attention, ln2 before the FFN): its output, mean and rstd, stashed.
struct SavedNorm {
  StashHandle out;   // (B, T, C)
  StashHandle mean;  // (B, T)
  StashHandle rstd;  // (B, T)
};

// LayerNorm (MODEL.md: eps 1e-5) of the residual stream x_in (B, T, C) with weight w and bias b,
// saved under "<prefix>.out/.mean/.rstd", e.g. prefix "layers.1.ln2". The allocation order (out,
// mean, rstd) is part of the modules' declared byte timelines. The output can be rebuilt from x_in
// (the same kernel into a fresh output, mean and rstd as scratch: NormSaved's rebuild scratch).
// `w` and `b` must stay valid while the entry lives.
absl::StatusOr<SavedNorm> NormForward(ModuleContext& ctx, const Dims& dims,
                                      const std::string& prefix, int layer, StashHandle x_in,
                                      const float* w, const float* b);
// Releases every valid handle in `handles` (a module's own saved tensors).
absl::Status ReleaseAll(ModuleContext& ctx, const std::vector<StashHandle>& handles);

}  // namespace furnace::model
