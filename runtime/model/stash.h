// Stash: the one place where tensors saved for backward live. Every module registers each tensor
// it saves with Save() and reads it back with Get(); the model holds saved activations no other
// way. Each entry records its producer ("layers.1.moe.expert_hidden"), layer, micro-batch, size,
// dtype and what recomputing it would need, so a memory planner can choose per tensor to keep it,
// offload it to pinned host memory, store it compressed (bf16 / fp8) or drop it and recompute it.
//
// Entries are keyed by (micro-batch, producer) (the producer names the layer and the tensor):
// Save tags an entry with the current micro-batch (set_micro_batch), and Find looks one up, so one
// micro-batch's tensors can be acted on while others are in flight.
//
// Actions (each leaves Get() returning the fp32 tensor):
//   Offload(h): asynchronous, through the copy engine, to the host pool (pinned on CUDA once a GPU
//     path exists; plain host memory on the CPU backend). The device bytes are freed when the copy
//     completes (on the copy thread). Bit-exact.
//   Prefetch(hs): starts the reloads (a device buffer from the arena, a host->device job), in the
//     order given: callers pass backward order. An entry whose offload copy has not landed yet
//     simply keeps its device bytes (nothing to reload).
//   Compress(h, codec): synchronous, for tensors on the runtime/memory/codec.h whitelist; the
//     encoding lives in the arena in place of the fp32 bytes. Get restores fp32 (within the
//     codec's tolerance, not bit-exact).
//   Any other non-kept state goes through the restore hook: Get() then calls it, and it must hand
//   back a device Buffer holding the tensor (recomputed per the entry's RecomputeSpec).
//
// The backward rule: a module's backward first calls Acquire() with every handle it reads, which
// restores each entry (waits for its reload, counting a late reload when it has not landed by
// then, or decodes it) and pins it, and only then takes raw pointers with Get(). A pinned entry
// refuses Offload/Compress (FailedPrecondition) until it is released, so those pointers stay
// valid through the backward whatever a planner does meanwhile.
//
// Thread-safety: one mutex; the compute thread saves/gets/acts/releases while the copy engine's
// thread completes offloads and reloads (its hooks take the mutex; the stash never waits on the
// engine while holding it). A TensorView from Get() stays valid until that entry is Released or
// leaves kKept. Release/ReleaseAll wait for the entry's copies in flight. The arena, backend,
// copy engine and host pool given to the stash must outlive it.
// Errors: Get/Release/actions on an unknown or released handle: NotFound naming the handle; Save
// of a buffer whose size does not match shape x dtype: InvalidArgument; Save of a (micro-batch,
// producer) that is live: AlreadyExists; Get of a dropped entry without a restore hook:
// Unimplemented; an action on an entry in the wrong state, or without the engine / arena it
// needs, or a compress off the whitelist: FailedPrecondition naming the tensor; a failed copy:
// its status from Get/Acquire.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "runtime/device/backend.h"
#include "runtime/memory/codec.h"
#include "runtime/memory/copy_engine.h"
#include "runtime/tensor/arena.h"
#include "runtime/tensor/buffer.h"
#include "runtime/tensor/dtype.h"
#include "runtime/tensor/host_pool.h"
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
  int micro = 0;   // the micro-batch it belongs to
  std::vector<int64_t> shape;
  tensor::DType dtype = tensor::DType::kF32;
  uint64_t bytes = 0;  // at full precision
  StashState state = StashState::kKept;
  RecomputeSpec recompute;
};

// Totals of the offload / compress actions since the stash was made (for telemetry and tests).
struct StashActionStats {
  uint64_t offloaded_bytes = 0;         // fp32 bytes sent to the host
  uint64_t reloaded_bytes = 0;          // fp32 bytes brought back
  uint64_t compressed_bytes = 0;        // fp32 bytes stored compressed
  uint64_t compressed_saved_bytes = 0;  // of those, the bytes the encodings saved
  int64_t late_reloads = 0;             // reloads not landed when Acquire/Get needed them
};

class Stash {
 public:
  // Rebuilds a tensor that is not kept. Called with the stash unlocked.
  using RestoreHook = std::function<absl::StatusOr<tensor::Buffer>(const StashEntryInfo&)>;

  explicit Stash(device::Kind device = device::Kind::kCpu) : device_(device) {}
  ~Stash();
  Stash(const Stash&) = delete;
  Stash& operator=(const Stash&) = delete;

  absl::StatusOr<StashHandle> Save(std::string producer, int layer, tensor::Buffer&& buffer,
                                   std::vector<int64_t> shape, tensor::DType dtype,
                                   RecomputeSpec recompute);
  // The kept tensor (restoring it first if it is not kept).
  absl::StatusOr<tensor::TensorView> Get(StashHandle handle);
  // Drops the tensor and its bytes (after its copies in flight, if any, complete).
  absl::Status Release(StashHandle handle);
  void ReleaseAll();

  // The micro-batch later Saves belong to (0 until set).
  void set_micro_batch(int micro);
  // The live entry saved by `producer` for `micro`; NotFound naming both.
  absl::StatusOr<StashHandle> Find(int micro, const std::string& producer) const;

  // ---- Offload and compress (see the file comment) ----
  // Where reloads and decodes allocate, and the casts Compress uses.
  void SetDeviceMemory(tensor::DeviceArena* arena, const device::Backend* ops);
  // Where offloads go; both nullptr: offload unavailable.
  void SetOffloadTargets(memory::CopyEngine* engine, tensor::HostPool* host);
  absl::Status Offload(StashHandle handle);
  absl::Status Prefetch(const std::vector<StashHandle>& handles);
  absl::Status Compress(StashHandle handle, memory::Codec codec);
  // Restores every valid handle and pins it (the backward rule). Invalid handles are skipped.
  absl::Status Acquire(const std::vector<StashHandle>& handles);
  // Waits for every copy in flight (offloads land, reloads land).
  void WaitForCopies();
  StashActionStats action_stats() const;

  void SetRestoreHook(RestoreHook hook);

  // Device bytes the entries hold: kept tensors, compressed encodings, offloads whose copy is still
  // in flight, reloads.
  uint64_t stashed_bytes() const;
  uint64_t peak_stashed_bytes() const;  // since the last ResetPeak
  void ResetPeak();
  int64_t size() const;                         // live entries
  std::vector<StashEntryInfo> Entries() const;  // live entries in save order (for a planner)

 private:
  struct Entry {
    StashEntryInfo info;
    tensor::Buffer buffer;  // the fp32 device tensor (kept, or offloaded while the copy runs)
    // ---- Offload and compress ----
    tensor::Buffer host;      // kOffloaded: the host copy
    tensor::Buffer incoming;  // kOffloaded: the device buffer a reload fills
    tensor::Buffer encoded;   // kCompressed: the encoding, in the arena
    memory::Codec codec = memory::Codec::kBf16;
    memory::CopyTicket to_host;    // the offload copy
    memory::CopyTicket to_device;  // the reload copy
    bool landed = false;           // the offload copy completed and freed `buffer`
    bool keep_device = false;      // needed again before the offload landed: keep `buffer`
    absl::Status copy_error;       // a failed reload
    bool pinned = false;           // Acquired: refuses actions until released
  };
  using Key = std::pair<int, std::string>;  // (micro-batch, producer)

  // Copy-thread hooks.
  void OnOffloaded(int64_t id, const absl::Status& status);
  void OnReloaded(int64_t id, const absl::Status& status);
  // Starts the restore of an offloaded entry (lock held); the ticket to wait for, if any.
  absl::StatusOr<memory::CopyTicket> StartReloadLocked(Entry& e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status DecodeLocked(Entry& e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Restores `handle` if offloaded or compressed (waiting with deadline `needed_at`); pins it.
  absl::Status RestoreOne(StashHandle handle, double needed_at, bool pin);
  void NoteKeptLocked(uint64_t bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The copy engine's clock (0 without an engine: nothing can be late then).
  double Now() const;

  const device::Kind device_;
  mutable absl::Mutex mu_;
  std::map<int64_t, Entry> entries_ ABSL_GUARDED_BY(mu_);
  std::map<Key, int64_t> keys_ ABSL_GUARDED_BY(mu_);
  int micro_ ABSL_GUARDED_BY(mu_) = 0;
  tensor::DeviceArena* arena_ ABSL_GUARDED_BY(mu_) = nullptr;
  const device::Backend* ops_ ABSL_GUARDED_BY(mu_) = nullptr;
  memory::CopyEngine* engine_ ABSL_GUARDED_BY(mu_) = nullptr;
  tensor::HostPool* host_ ABSL_GUARDED_BY(mu_) = nullptr;
  StashActionStats action_stats_ ABSL_GUARDED_BY(mu_);
  int64_t next_id_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t kept_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t peak_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  RestoreHook restore_ ABSL_GUARDED_BY(mu_);
};

}  // namespace furnace::model
