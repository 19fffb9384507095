// Stash: the one place where tensors saved for backward live. Every module registers each tensor
// it saves with Save() and reads it back with Get(); the model holds saved activations no other
// way. Each entry records its producer ("layers.1.moe.expert_hidden"), layer, size, dtype and
// what recomputing it would need, so a memory planner can choose per tensor to keep it, offload it
// to pinned host memory, store it compressed (bf16 / fp8) or drop it and recompute it.
//
// States. kKept holds the bytes. kDropped (Drop, or a save policy's drop after forward) has freed
// them; Get() rebuilds the tensor through its RecomputeSpec's `rebuild` and marks it kept again.
// kOffloaded / kCompressed are the planner's other slots: Get() of such an entry calls the restore
// hook, which must hand back a device Buffer holding the tensor.
//
// Drop and recompute. A rebuild runs the forward's own kernels on the same inputs (other stash
// entries, rebuilt first if they are dropped too, and the parameters, unchanged until the optimizer
// step), so a rebuilt tensor is bit-identical to the one forward saved. A tensor whose rebuild
// re-runs the expert all-to-all (RecomputeCollective::kExpertDispatch) may be dropped only by a
// save policy (SetSavePolicy): a policy is a function of the tag, so every rank of the group drops
// the same tensors and rebuilds them at the same point of the same backward; Drop() refuses it.
// A save policy's drops wait in a pending list until ApplyPendingDrops(), which the model calls
// when the module's forward is done, so a tensor that forward still reads is not rebuilt for it.
//
// The backward rule. A module's backward first calls Acquire() with every saved tensor it reads:
// that makes them all available (rebuilt or reloaded) and pins them; only then does it take raw
// pointers with Get(). A pinned entry cannot leave kKept (Drop and the planner's actions refuse
// it) until the Lease is gone, so the pointers stay valid for the whole backward. A module's own
// Release of a pinned entry at the end of its backward is allowed.
//
// Thread-safety: one mutex; the compute thread saves/gets/releases while a copy thread (later)
// may offload. A rebuild runs on the thread that asked for it, with the stash unlocked (it reads
// other entries). A TensorView from Get() stays valid until that entry is Released or leaves
// kKept. Errors: Get/Release/Drop/Acquire of an unknown or released handle: NotFound naming the
// handle; Save of a buffer whose size does not match shape x dtype, or that the save policy drops
// though it has no rebuild: InvalidArgument; Drop of an entry that is pinned, not kept, not
// rebuildable or needs a collective: FailedPrecondition; Get of a non-kept entry without a restore
// hook: Unimplemented; a rebuild's own error is returned as is (the entry stays dropped).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "runtime/memory/policy.h"
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

// What a rebuild needs beyond this rank's own kernels.
enum class RecomputeCollective {
  kNone,
  // Re-runs the expert all-to-all (moe::ExpertDispatcher) on every rank of the EP / ESP group
  // together: only a save policy applied on every rank may drop such a tensor.
  kExpertDispatch,
};

// What it would take to rebuild a tensor instead of keeping it.
struct RecomputeSpec {
  // The op that rebuilds it from `inputs` and the parameters: "gelu", "layernorm", "router",
  // "topk", "permute", "grouped_matmul", "attention", ... Empty: not recomputable from the stash (a
  // module input such as the token ids, or the residual stream itself).
  std::string op;
  std::vector<StashHandle> inputs;
  double flops = 0;  // cost of the rebuild, for the planner's bytes-per-flop ranking
  RecomputeCollective collective = RecomputeCollective::kNone;
  // Recomputes the tensor into a fresh Buffer of the entry's bytes (from the arena it was saved
  // from), reading `inputs` through the stash. Set where the module implements the rebuild; an
  // `op` without it names the cost of a rebuild this build does not run.
  std::function<absl::StatusOr<tensor::Buffer>()> rebuild = nullptr;
  bool rebuildable() const { return static_cast<bool>(rebuild); }
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

  // ---- Drop and recompute ----
  // Pins entries for a module's backward (see "The backward rule"); unpins them when destroyed.
  // Move-only; must not outlive the stash.
  class Lease {
   public:
    Lease() = default;
    Lease(Lease&& other) noexcept;
    Lease& operator=(Lease&& other) noexcept;
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    ~Lease();

   private:
    friend class Stash;
    Stash* stash_ = nullptr;
    std::vector<int64_t> ids_;
  };
  // Makes every entry of `handles` kept, in order (rebuilding dropped ones, restoring the others
  // through the hook), and pins them until the Lease is destroyed. Invalid handles (id < 0) are
  // skipped. On error nothing stays pinned.
  absl::StatusOr<Lease> Acquire(const std::vector<StashHandle>& handles);
  // Frees a kept, unpinned, rebuildable entry's bytes; Get() rebuilds it.
  absl::Status Drop(StashHandle handle);
  // Decides per new entry whether it is kept or dropped once its module's forward is done (nullptr:
  // keep everything). Called by Save on the saving thread, with the stash unlocked.
  using SavePolicy = std::function<memory::SaveAction(const StashEntryInfo&)>;
  void SetSavePolicy(SavePolicy policy);
  // Drops the entries the save policy marked since the last call (those still live and kept).
  absl::Status ApplyPendingDrops();
  // Bytes dropped and bytes rebuilt since the stash was made.
  uint64_t dropped_bytes() const;
  uint64_t rebuilt_bytes() const;

  uint64_t stashed_bytes() const;       // bytes of entries currently kept
  uint64_t peak_stashed_bytes() const;  // since the last ResetPeak
  void ResetPeak();
  int64_t size() const;                         // live entries
  std::vector<StashEntryInfo> Entries() const;  // live entries in save order (for a planner)

 private:
  struct Entry {
    StashEntryInfo info;
    tensor::Buffer buffer;
    int pins = 0;             // Leases holding it
    bool rebuilding = false;  // its rebuild is running (a rebuild that needs itself is a cycle)
  };

  // Drop and recompute.
  absl::StatusOr<tensor::TensorView> Rebuild(StashHandle handle);
  // Moves a kept entry's buffer out (into `doomed`, freed by the caller after unlocking).
  void DropLocked(Entry& e, tensor::Buffer& doomed) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Unpin(const std::vector<int64_t>& ids);

  const device::Kind device_;
  mutable absl::Mutex mu_;
  std::map<int64_t, Entry> entries_ ABSL_GUARDED_BY(mu_);
  int64_t next_id_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t kept_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t peak_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  RestoreHook restore_ ABSL_GUARDED_BY(mu_);

  // Drop and recompute.
  SavePolicy save_policy_ ABSL_GUARDED_BY(mu_);
  std::vector<int64_t> pending_drops_ ABSL_GUARDED_BY(mu_);
  uint64_t dropped_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t rebuilt_bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace furnace::model
