// Stash: the one place where tensors saved for backward live. Every module registers each tensor
// it saves with Save() and reads it back with Get(); the model holds saved activations no other
// way. Each entry records its producer ("layers.1.moe.expert_hidden"), layer, size, dtype and
// what recomputing it would need, so a memory planner can choose per tensor to keep it, offload it
// to pinned host memory, store it compressed (bf16 / fp8) or drop it and recompute it.
//
// Only kKept is implemented now. The other states are the planner's slots: it moves an entry out
// of kKept with Offload/Compress/Drop (to come), and Get() of an entry that is not kept calls the
// restore hook, which must hand back a device Buffer holding the tensor (copied back, decompressed
// or recomputed per the entry's RecomputeSpec); Get() then marks it kept again.
//
// Thread-safety: one mutex; the compute thread saves/gets/releases while a copy thread (later)
// may offload. A TensorView from Get() stays valid until that entry is Released or leaves kKept.
// Errors: Get/Release of an unknown or released handle: NotFound naming the handle; Save of a
// buffer whose size does not match shape x dtype: InvalidArgument; Get of a non-kept entry without
// a restore hook: Unimplemented.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "runtime/tensor/buffer.h"
#include "runtime/tensor/dtype.h"
#include "runtime/tensor/tensor.h"

namespace furnace::model {

struct StashHandle {
  int64_t id = -1;
  bool valid() const { return id >= 0; }
};

enum class StashState { kKept, kOffloaded, kCompressed, kDropped };
const char* StashStateName(StashState state);

// What it would take to rebuild a tensor instead of keeping it.
struct RecomputeSpec {
  // The op that rebuilds it from `inputs` and the parameters: "gelu", "layernorm", "matmul",
  // "grouped_matmul", "permute", "attention", ... Empty: not recomputable from the stash (a module
  // input such as the token ids, or the residual stream itself).
  std::string op;
  std::vector<StashHandle> inputs;
  double flops = 0;  // cost of the rebuild, for the planner's bytes-per-flop ranking
};

struct StashEntryInfo {
  int64_t id = -1;
  std::string producer;
  int layer = -1;  // -1: not inside a transformer layer (embedding, head)
  std::vector<int64_t> shape;
  tensor::DType dtype = tensor::DType::kF32;
  uint64_t bytes = 0;  // at full precision
  StashState state = StashState::kKept;
  RecomputeSpec recompute;
};

class Stash {
 public:
  // Rebuilds a tensor that is not kept. Called with the stash unlocked.
  using RestoreHook = std::function<absl::StatusOr<tensor::Buffer>(const StashEntryInfo&)>;

  explicit Stash(device::Kind device = device::Kind::kCpu) : device_(device) {}
  Stash(const Stash&) = delete;
  Stash& operator=(const Stash&) = delete;

  absl::StatusOr<StashHandle> Save(std::string producer, int layer, tensor::Buffer&& buffer,
                                   std::vector<int64_t> shape, tensor::DType dtype,
                                   RecomputeSpec recompute);
  // The kept tensor (restoring it first if it is not kept).
  absl::StatusOr<tensor::TensorView> Get(StashHandle handle);
  // Drops the tensor and its bytes.
  absl::Status Release(StashHandle handle);
  void ReleaseAll();

  void SetRestoreHook(RestoreHook hook);

  uint64_t stashed_bytes() const;       // bytes of entries currently kept
  uint64_t peak_stashed_bytes() const;  // since the last ResetPeak
  void ResetPeak();
  int64_t size() const;                         // live entries
  std::vector<StashEntryInfo> Entries() const;  // live entries in save order (for a planner)

 private:
  struct Entry {
    StashEntryInfo info;
    tensor::Buffer buffer;
  };

  const device::Kind device_;
  mutable absl::Mutex mu_;
  std::map<int64_t, Entry> entries_ ABSL_GUARDED_BY(mu_);
  int64_t next_id_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t kept_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t peak_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  RestoreHook restore_ ABSL_GUARDED_BY(mu_);
};

}  // namespace furnace::model
