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
// States. kKept holds the bytes. The actions below move an entry out of kKept; Get() (and
// Acquire) bring it back:
//   Offload(h) -> kOffloaded: asynchronous, through the copy engine, to the host pool (pinned
//     memory: Device::AllocateHost). The copy runs on the engine's copy stream after an event the
//     offload records on the calling thread's (compute) stream, so it reads the tensor after the
//     kernels that wrote it. The device bytes are freed when the copy completes (on the copy
//     thread). Bit-exact.
//   Prefetch(hs): starts the reloads (a device buffer from the arena, a host->device job after an
//     event on the compute stream), in the order given: callers pass backward order. An entry
//     whose offload copy has not landed yet simply keeps its device bytes (nothing to reload).
//   Compress(h, codec) -> kCompressed: synchronous, for tensors on the runtime/memory/codec.h
//     whitelist; the encoding lives in the arena in place of the fp32 bytes. Get restores fp32
//     (within the codec's tolerance, not bit-exact). A compressed entry can still be offloaded:
//     its encoding goes to the host (fewer bytes over the link), comes back as the encoding and
//     is decoded on the compute stream after the reload, so an entry stored compressed never pins
//     its bytes to the device when memory runs short later.
//   Drop(h), or a save policy's drop after forward -> kDropped: frees the bytes; Get() rebuilds
//     the tensor through its RecomputeSpec's `rebuild` and marks it kept again.
//
// Drop and recompute. A rebuild runs the forward's own kernels on the same inputs (other stash
// entries, rebuilt first if they are dropped too, and the parameters, unchanged until the optimizer
// step), so a rebuilt tensor is bit-identical to the one forward saved. A tensor whose rebuild
// re-runs the expert all-to-all (RecomputeCollective::kExpertDispatch) may be dropped only by a
// save policy (SetSavePolicy: a policy is a function of the tag) or by DropAgreed (the ranks'
// agreement), so every rank of the group drops the same tensors and rebuilds them at the same
// point of the same backward; Drop() refuses it,
// and ApplyPendingDrops() fails (Internal, naming it) rather than keep one it cannot drop (it left
// the arena, or its rebuild would read a compressed input): the peers would run the rebuild's
// all-to-all without this rank.
// A save policy's drops wait in a pending list until ApplyPendingDrops(), which the model calls
// when the module's forward is done, so a tensor that forward still reads is not rebuilt for it.
//
// The backward rule. A module's backward first calls Acquire() with every saved tensor it reads:
// that makes them all available (starts every reload, then waits for each, counting a late reload
// when one has not landed by then; decodes compressed ones; rebuilds dropped ones) and pins them;
// on a discrete device (emulated, CUDA) the wait for a reload is the compute stream's, not the
// host's: CopyEngine::OrderBefore makes the calling thread's stream wait for the copy's event, the
// entry is kept at once with the reload's destination as its bytes, and a reload not done at that
// point counts as late (the stream will wait for it). On the CPU device the host is the compute
// stream, so it waits there (with the engine's deadline accounting);
// only then does it take raw pointers with Get(). A pinned entry cannot leave kKept (Drop, Offload
// and Compress refuse it with FailedPrecondition) until the Lease is gone, so the pointers stay
// valid for the whole backward. A module's own Release of a pinned entry at the end of its
// backward is allowed.
//
// Thread-safety: one mutex; the compute thread saves/gets/acts/releases while the copy engine's
// thread completes offloads and reloads (its hooks take the mutex; the stash never waits on the
// engine while holding it). A rebuild runs on the thread that asked for it, with the stash
// unlocked (it reads other entries). A TensorView from Get() stays valid until that entry is
// Released or leaves kKept. Release/ReleaseAll wait for the entry's copies in flight. The arena,
// backend, copy engine and host pool given to the stash must outlive it.
// Errors: Get/Release/Drop/Acquire/actions on an unknown or released handle: NotFound naming the
// handle; Save of a buffer whose size does not match shape x dtype, or that the save policy drops
// though it has no rebuild: InvalidArgument; Save of a (micro-batch, producer) that is live:
// AlreadyExists; Drop of an entry that is pinned, not kept, not rebuildable or needs a collective:
// FailedPrecondition; Offload/Compress of an entry in the wrong state or pinned, or without the
// engine / arena it needs, or a compress off the whitelist: FailedPrecondition naming the tensor;
// a failed copy: its status from Get/Acquire (a reload that fails after the compute stream was
// ordered to read it: from Get, Acquire and the entry's Release, which still frees it); a
// rebuild's own error is returned as is (the entry stays dropped).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "runtime/device/backend.h"
#include "runtime/memory/codec.h"
#include "runtime/memory/copy_engine.h"
#include "runtime/memory/policy.h"
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
  int micro = 0;   // the micro-batch it belongs to
  std::vector<int64_t> shape;
  tensor::DType dtype = tensor::DType::kF32;
  uint64_t bytes = 0;  // at full precision
  StashState state = StashState::kKept;
  RecomputeSpec recompute;
};

// A live entry as a planner weighs it (Summaries): no rebuild closure, no input list.
struct StashEntrySummary {
  StashHandle handle;
  std::string producer;
  int layer = -1;
  int micro = 0;
  uint64_t bytes = 0;       // at full precision
  uint64_t held_bytes = 0;  // device bytes it holds now (kCompressed: the encoding's)
  // Its bytes are an encoding (kCompressed, or offloaded from it): the encoding's size; else 0.
  // Bringing such an offloaded entry back holds the encoding and the decoded tensor at once.
  uint64_t encoded_bytes = 0;
  StashState state = StashState::kKept;
  bool pinned = false;       // acquired by a backward
  bool rebuildable = false;  // has a rebuild that needs no collective (a per-rank drop is safe)
  bool collective_rebuild = false;  // has a rebuild that re-runs a collective (DropAgreed only)
  double rebuild_flops = 0;
  std::vector<int64_t> rebuild_inputs;  // the ids of the entries its rebuild reads
  bool lossy_input = false;     // one of those is stored in reduced precision: Drop refuses it
  bool dropped_reader = false;  // a dropped entry's rebuild reads it: Compress refuses it
};

// Totals of the offload / compress actions since the stash was made (for telemetry and tests).
struct StashActionStats {
  uint64_t offloaded_bytes = 0;         // bytes sent to the host (an encoding's at its size)
  uint64_t reloaded_bytes = 0;          // bytes brought back
  uint64_t compressed_bytes = 0;        // fp32 bytes stored compressed
  uint64_t compressed_saved_bytes = 0;  // of those, the bytes the encodings saved
  int64_t late_reloads = 0;             // reloads not landed when Acquire/Get needed them
};

class Stash {
 public:
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
  // Makes every entry of `handles` kept (starts the reloads of the offloaded ones first, then, in
  // order, waits for each reload, decodes compressed ones and rebuilds dropped ones) and pins them
  // until the Lease is destroyed. Invalid handles (id < 0) are skipped. On error nothing stays
  // pinned.
  absl::StatusOr<Lease> Acquire(const std::vector<StashHandle>& handles);

  // ---- Offload and compress (see the file comment) ----
  // Where reloads and decodes allocate, and the casts Compress uses.
  void SetDeviceMemory(tensor::DeviceArena* arena, const device::Backend* ops);
  // Where offloads go; both nullptr: offload unavailable.
  void SetOffloadTargets(memory::CopyEngine* engine, tensor::HostPool* host);
  absl::Status Offload(StashHandle handle);
  absl::Status Prefetch(const std::vector<StashHandle>& handles);
  absl::Status Compress(StashHandle handle, memory::Codec codec);
  // Waits for every copy in flight (offloads land, reloads land).
  void WaitForCopies();
  // The device bytes that offloads still copying free when they land (not those wanted back
  // before landing, which stay): the arena's bytes in use less these is what it holds once the
  // copies in flight are done. The planner projects on that figure; an allocation that needs the
  // bytes sooner waits for the copies (module.cc Allocate, RetriedAfterCopies).
  uint64_t OffloadingBytes() const;
  StashActionStats action_stats() const;

  // ---- Drop and recompute ----
  // Frees a kept, unpinned, rebuildable entry's bytes; Get() rebuilds it.
  absl::Status Drop(StashHandle handle);
  // Drop for an entry whose rebuild needs a collective too: the caller guarantees that every rank
  // of the group drops the same entry at the same point of the same micro-batch (the adaptive
  // planner's agreement, GptMoe), so the rebuilds run together. CanDropAgreed: Drop's conditions
  // hold (kept, its reload not failed, unpinned, rebuildable, no input in reduced precision), so
  // DropAgreed succeeds.
  absl::Status DropAgreed(StashHandle handle);
  bool CanDropAgreed(StashHandle handle) const;
  // Decides per new entry whether it is kept or dropped once its module's forward is done (nullptr:
  // keep everything). Called by Save on the saving thread, with the stash unlocked.
  using SavePolicy = std::function<memory::SaveAction(const StashEntryInfo&)>;
  void SetSavePolicy(SavePolicy policy);
  // Drops the entries the save policy marked since the last call (those still live and kept).
  absl::Status ApplyPendingDrops();
  // Bytes dropped and bytes rebuilt since the stash was made.
  uint64_t dropped_bytes() const;
  uint64_t rebuilt_bytes() const;

  // Device bytes the entries hold: kept tensors, compressed encodings, offloads whose copy is still
  // in flight, reloads.
  uint64_t stashed_bytes() const;
  uint64_t peak_stashed_bytes() const;  // since the last ResetPeak
  void ResetPeak();
  int64_t size() const;                              // live entries
  std::vector<StashEntryInfo> Entries() const;       // live entries in save order (for a planner)
  std::vector<StashEntrySummary> Summaries() const;  // live entries in save order
  // One live entry's description; nullopt for an invalid, unknown or released handle.
  std::optional<StashEntryInfo> Info(StashHandle handle) const;

 private:
  struct Entry {
    StashEntryInfo info;
    tensor::Buffer buffer;    // the fp32 device tensor (kept, or offloaded while the copy runs)
    int pins = 0;             // Leases holding it
    bool rebuilding = false;  // its rebuild is running (a rebuild that needs itself is a cycle)
    // ---- Offload and compress ----
    tensor::Buffer host;        // kOffloaded: the host copy
    bool host_encoded = false;  // kOffloaded: `host` is the encoding (offloaded from kCompressed)
    uint64_t host_bytes = 0;    // kOffloaded: the bytes copied out (and back)
    tensor::Buffer incoming;    // kOffloaded: the device buffer a reload fills
    tensor::Buffer encoded;     // kCompressed: the encoding, in the arena
    memory::Codec codec = memory::Codec::kBf16;
    // Stored compressed at some point: its values carry the codec's error from then on (decoded
    // too), so nothing may be rebuilt from them (LossyInputLocked).
    bool lossy = false;
    memory::CopyTicket to_host;    // the offload copy
    memory::CopyTicket to_device;  // the reload copy
    bool landed = false;           // the offload copy completed and freed `buffer`
    bool keep_device = false;      // needed again before the offload landed: keep `buffer`
    // Discrete device: the reload is ordered before the compute stream (RestoreOne) and `buffer`
    // already is its destination; the copy's hook frees the host copy only.
    bool reload_ordered = false;
    absl::Status copy_error;  // a failed reload
  };
  using Key = std::pair<int, std::string>;  // (micro-batch, producer)

  // Copy-thread hooks.
  void OnOffloaded(int64_t id, const absl::Status& status);
  void OnReloaded(int64_t id, const absl::Status& status);
  // Starts the restore of an offloaded entry (lock held); the ticket to wait for, if any.
  absl::StatusOr<memory::CopyTicket> StartReloadLocked(Entry& e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status DecodeLocked(Entry& e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A reload's destination becomes the entry's bytes: the tensor (kKept), or the encoding
  // (kCompressed) where the host copy was one.
  void ArriveLocked(Entry& e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Decodes `handle` if it is compressed (once more after the copies in flight, as a reload).
  absl::Status DecodeAfterCopies(StashHandle handle) ABSL_LOCKS_EXCLUDED(mu_);
  // `restore()` (which takes mu_ itself), and once more after the copies in flight when the arena
  // refused it (ResourceExhausted): Prefetch and RestoreOne.
  template <typename Restore>
  absl::Status RetriedAfterCopies(const Restore& restore) ABSL_LOCKS_EXCLUDED(mu_);
  // The live entry `handle` names if `action` ("offload", "compress") may move it: kept and not
  // acquired by a backward. NotFound or FailedPrecondition naming it otherwise.
  // `compressed_too`: a compressed entry may move too (offload: its encoding goes to the host).
  absl::StatusOr<Entry*> MovableEntryLocked(StashHandle handle, const char* action,
                                            bool compressed_too = false)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Restores `handle` if offloaded or compressed (waiting with deadline `needed_at`).
  absl::Status RestoreOne(StashHandle handle, double needed_at);
  void NoteKeptLocked(uint64_t bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The copy engine's clock (0 without an engine: nothing can be late then).
  double Now() const;
  // The stream the compute thread enqueues on (the calling thread's, for the arena's device);
  // nullptr without an arena.
  device::Stream* ComputeStreamLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether the compute "stream" is the host itself (the CPU device, or no arena): a reload is
  // then waited for on the host.
  bool HostIsComputeLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Drop and recompute.
  absl::StatusOr<tensor::TensorView> Rebuild(StashHandle handle);
  // Recompute and reduced precision never combine: a rebuild from a compressed input would carry
  // the codec's error into a tensor the codec may not touch (a GELU input under fp8, the expert
  // output that drives the gate's gradient), and further than its bound for those it may.
  // The input of `e`'s rebuild that is or was compressed (nullptr: none).
  const Entry* LossyInputLocked(const Entry& e) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Why Drop (agreed: DropAgreed) would refuse `e`, or OK: the one list of conditions both
  // DropChecked and CanDropAgreed apply.
  absl::Status DropRefusalLocked(const Entry& e, bool agreed) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status DropChecked(StashHandle handle, bool agreed);
  // A dropped entry whose rebuild reads entry `id` (nullptr: none).
  const Entry* DroppedReaderLocked(int64_t id) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Moves a kept entry's buffer out (into `doomed`, freed by the caller after unlocking).
  void DropLocked(Entry& e, tensor::Buffer& doomed) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Unpin(const std::vector<int64_t>& ids);

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

  // Drop and recompute.
  SavePolicy save_policy_ ABSL_GUARDED_BY(mu_);
  std::vector<int64_t> pending_drops_ ABSL_GUARDED_BY(mu_);
  uint64_t dropped_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t rebuilt_bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace furnace::model
