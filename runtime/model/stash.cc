#include "runtime/model/stash.h"

#include <limits>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "runtime/base/status.h"
#include "runtime/tensor/transfer.h"

namespace furnace::model {

const char* StashStateName(StashState state) {
  switch (state) {
    case StashState::kKept:
      return "kept";
    case StashState::kOffloaded:
      return "offloaded";
    case StashState::kCompressed:
      return "compressed";
    case StashState::kDropped:
      return "dropped";
  }
  return "?";
}

absl::StatusOr<StashHandle> Stash::Save(std::string producer, int layer, tensor::Buffer&& buffer,
                                        std::vector<int64_t> shape, tensor::DType dtype,
                                        RecomputeSpec recompute) {
  const uint64_t want =
      static_cast<uint64_t>(tensor::NumElements(shape) * tensor::ElementSize(dtype));
  if (buffer.bytes() != want) {
    return absl::InvalidArgumentError(absl::StrCat(
        "stash: '", producer, "' has ", buffer.bytes(), " bytes but shape ",
        tensor::ShapeString(shape), " of ", tensor::DTypeName(dtype), " needs ", want));
  }
  StashEntryInfo info;
  info.producer = std::move(producer);
  info.layer = layer;
  info.shape = std::move(shape);
  info.dtype = dtype;
  info.bytes = want;
  info.state = StashState::kKept;
  info.recompute = std::move(recompute);
  SavePolicy policy;
  {
    absl::MutexLock lock(&mu_);
    policy = save_policy_;
    // Before the policy sees it: a plan made for micro-batch j drops micro-batch j's tensors.
    info.micro = micro_;
  }
  const bool drop = policy && policy(info) == memory::SaveAction::kDropAfterForward;
  if (drop && !info.recompute.rebuildable()) {
    return absl::InvalidArgumentError(
        absl::StrCat("stash: the save policy drops '", info.producer, "', which has no rebuild"));
  }
  absl::MutexLock lock(&mu_);
  Key key{info.micro, info.producer};
  if (keys_.count(key) != 0) {
    return absl::AlreadyExistsError(absl::StrCat("stash: '", info.producer, "' of micro-batch ",
                                                 info.micro, " is already saved"));
  }
  const int64_t id = next_id_++;
  keys_.emplace(std::move(key), id);
  Entry& e = entries_[id];
  e.info = std::move(info);
  e.info.id = id;
  e.buffer = std::move(buffer);
  NoteKeptLocked(want);
  if (drop) pending_drops_.push_back(id);
  return StashHandle{id};
}

void Stash::NoteKeptLocked(uint64_t bytes) {
  kept_bytes_ += bytes;
  if (kept_bytes_ > peak_bytes_) peak_bytes_ = kept_bytes_;
}

absl::StatusOr<tensor::TensorView> Stash::Get(StashHandle handle) {
  bool dropped = false;
  {
    absl::MutexLock lock(&mu_);
    auto it = entries_.find(handle.id);
    if (it == entries_.end()) {
      return absl::NotFoundError(absl::StrCat("stash: no live entry ", handle.id));
    }
    const Entry& e = it->second;
    if (e.info.state == StashState::kKept) {
      // Kept with a copy error: its reload was ordered before the compute stream and then failed,
      // so the buffer holds no tensor.
      if (!e.copy_error.ok()) return e.copy_error;
      return tensor::TensorView{e.buffer.data(), e.info.shape, e.info.dtype, device_};
    }
    dropped = e.info.state == StashState::kDropped;
  }
  if (dropped) return Rebuild(handle);  // through its RecomputeSpec
  // Offloaded or compressed: restored by the stash itself.
  RETURN_IF_ERROR(RestoreOne(handle, Now()));
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(handle.id);
  if (it == entries_.end() || it->second.info.state != StashState::kKept) {
    return absl::NotFoundError(
        absl::StrCat("stash: entry ", handle.id, " released during restore"));
  }
  const Entry& e = it->second;
  return tensor::TensorView{e.buffer.data(), e.info.shape, e.info.dtype, device_};
}

namespace {

bool Pending(memory::CopyEngine* engine, const memory::CopyTicket& ticket) {
  return engine != nullptr && ticket.valid() && !engine->Done(ticket);
}

}  // namespace

absl::Status Stash::Release(StashHandle handle) {
  for (;;) {
    Entry doomed;  // returned to the pools after the lock is dropped
    memory::CopyEngine* engine = nullptr;
    memory::CopyTicket to_host, to_device;
    {
      absl::MutexLock lock(&mu_);
      auto it = entries_.find(handle.id);
      if (it == entries_.end()) {
        return absl::NotFoundError(absl::StrCat("stash: release of unknown entry ", handle.id));
      }
      Entry& e = it->second;
      if (!Pending(engine_, e.to_host) && !Pending(engine_, e.to_device)) {
        kept_bytes_ -= e.buffer.bytes() + e.incoming.bytes() + e.encoded.bytes();
        keys_.erase(Key{e.info.micro, e.info.producer});
        // A reload that failed after the compute stream was told to read it: that backward read
        // no tensor, and its step must not count.
        const absl::Status failed_reload =
            e.info.state == StashState::kKept ? e.copy_error : absl::OkStatus();
        doomed = std::move(e);
        entries_.erase(it);
        return failed_reload;
      }
      engine = engine_;
      to_host = e.to_host;
      to_device = e.to_device;
    }
    // Copies read or write this entry's buffers: let them finish first.
    engine->Wait(to_host).IgnoreError();
    engine->Wait(to_device).IgnoreError();
  }
}

void Stash::ReleaseAll() {
  for (;;) {
    std::map<int64_t, Entry> doomed;
    memory::CopyEngine* engine = nullptr;
    std::vector<memory::CopyTicket> pending;
    {
      absl::MutexLock lock(&mu_);
      for (const auto& [id, e] : entries_) {
        if (Pending(engine_, e.to_host)) pending.push_back(e.to_host);
        if (Pending(engine_, e.to_device)) pending.push_back(e.to_device);
      }
      if (pending.empty()) {
        doomed.swap(entries_);
        keys_.clear();
        kept_bytes_ = 0;
        pending_drops_.clear();
        return;
      }
      engine = engine_;
    }
    for (const memory::CopyTicket& t : pending) engine->Wait(t).IgnoreError();
  }
}

uint64_t Stash::stashed_bytes() const {
  absl::MutexLock lock(&mu_);
  return kept_bytes_;
}

uint64_t Stash::peak_stashed_bytes() const {
  absl::MutexLock lock(&mu_);
  return peak_bytes_;
}

void Stash::ResetPeak() {
  absl::MutexLock lock(&mu_);
  peak_bytes_ = kept_bytes_;
}

int64_t Stash::size() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(entries_.size());
}

std::vector<StashEntryInfo> Stash::Entries() const {
  absl::MutexLock lock(&mu_);
  std::vector<StashEntryInfo> out;
  out.reserve(entries_.size());
  for (const auto& [id, e] : entries_) out.push_back(e.info);
  return out;
}

std::vector<StashEntrySummary> Stash::Summaries() const {
  absl::MutexLock lock(&mu_);
  std::vector<StashEntrySummary> out;
  out.reserve(entries_.size());
  std::set<int64_t> read_by_dropped;
  for (const auto& [id, e] : entries_) {
    if (e.info.state != StashState::kDropped) continue;
    for (const StashHandle input : e.info.recompute.inputs) read_by_dropped.insert(input.id);
  }
  for (const auto& [id, e] : entries_) {
    const RecomputeSpec& r = e.info.recompute;
    StashEntrySummary& s = out.emplace_back();
    s.handle = StashHandle{id};
    s.producer = e.info.producer;
    s.layer = e.info.layer;
    s.micro = e.info.micro;
    s.bytes = e.info.bytes;
    s.held_bytes = e.buffer.bytes() + e.incoming.bytes() + e.encoded.bytes();
    s.encoded_bytes = e.info.state == StashState::kCompressed                    ? e.encoded.bytes()
                      : e.info.state == StashState::kOffloaded && e.host_encoded ? e.host_bytes
                                                                                 : 0;
    s.state = e.info.state;
    s.pinned = e.pins > 0;
    s.rebuildable = r.rebuildable() && r.collective == RecomputeCollective::kNone;
    s.collective_rebuild = r.rebuildable() && r.collective != RecomputeCollective::kNone;
    s.rebuild_flops = r.flops;
    for (const StashHandle input : r.inputs) s.rebuild_inputs.push_back(input.id);
    s.lossy_input = LossyInputLocked(e) != nullptr;
    s.dropped_reader = read_by_dropped.count(id) != 0;
  }
  return out;
}

std::optional<StashEntryInfo> Stash::Info(StashHandle handle) const {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(handle.id);
  if (it == entries_.end()) return std::nullopt;
  return it->second.info;
}

// ---- Micro-batch keys ----

Stash::~Stash() { ReleaseAll(); }

void Stash::set_micro_batch(int micro) {
  absl::MutexLock lock(&mu_);
  micro_ = micro;
}

absl::StatusOr<StashHandle> Stash::Find(int micro, const std::string& producer) const {
  absl::MutexLock lock(&mu_);
  auto it = keys_.find(Key{micro, producer});
  if (it == keys_.end()) {
    return absl::NotFoundError(
        absl::StrCat("stash: no live '", producer, "' of micro-batch ", micro));
  }
  return StashHandle{it->second};
}

// ---- Leases (the backward rule) ----

Stash::Lease::Lease(Lease&& other) noexcept
    : stash_(std::exchange(other.stash_, nullptr)), ids_(std::move(other.ids_)) {}

Stash::Lease& Stash::Lease::operator=(Lease&& other) noexcept {
  if (this != &other) {
    if (stash_ != nullptr) stash_->Unpin(ids_);
    stash_ = std::exchange(other.stash_, nullptr);
    ids_ = std::move(other.ids_);
  }
  return *this;
}

Stash::Lease::~Lease() {
  if (stash_ != nullptr) stash_->Unpin(ids_);
}

void Stash::Unpin(const std::vector<int64_t>& ids) {
  absl::MutexLock lock(&mu_);
  for (int64_t id : ids) {
    auto it = entries_.find(id);
    if (it != entries_.end() && it->second.pins > 0) --it->second.pins;  // released: gone
  }
}

absl::StatusOr<Stash::Lease> Stash::Acquire(const std::vector<StashHandle>& handles) {
  Lease lease;
  lease.stash_ = this;
  // Start every reload first so they overlap each other, then wait in order; all of them are
  // needed now, so each one not landed by now is late.
  RETURN_IF_ERROR(Prefetch(handles));
  const double needed_at = Now();
  for (StashHandle h : handles) {
    if (!h.valid()) continue;
    RETURN_IF_ERROR(RestoreOne(h, needed_at));  // offloaded or compressed
    RETURN_IF_ERROR(Get(h).status());           // dropped: rebuilt
    absl::MutexLock lock(&mu_);
    auto it = entries_.find(h.id);
    if (it == entries_.end()) {
      return absl::NotFoundError(absl::StrCat("stash: entry ", h.id, " released during Acquire"));
    }
    ++it->second.pins;
    lease.ids_.push_back(h.id);
  }
  return lease;
}

// ---- Offload and compress ----

void Stash::SetDeviceMemory(tensor::DeviceArena* arena, const device::Backend* ops) {
  absl::MutexLock lock(&mu_);
  arena_ = arena;
  ops_ = ops;
}

void Stash::SetOffloadTargets(memory::CopyEngine* engine, tensor::HostPool* host) {
  WaitForCopies();  // no copy of the old engine may still read or write an entry's buffers
  absl::MutexLock lock(&mu_);
  engine_ = engine;
  host_ = host;
}

double Stash::Now() const {
  absl::MutexLock lock(&mu_);
  return engine_ == nullptr ? 0.0 : engine_->clock().MonotonicSeconds();
}

namespace {

absl::Status WrongState(const StashEntryInfo& info, const char* action, const char* why) {
  return absl::FailedPreconditionError(absl::StrCat("stash: cannot ", action, " '", info.producer,
                                                    "' of micro-batch ", info.micro, ": ", why));
}

}  // namespace

absl::StatusOr<Stash::Entry*> Stash::MovableEntryLocked(StashHandle handle, const char* action,
                                                        bool compressed_too) {
  auto it = entries_.find(handle.id);
  if (it == entries_.end()) {
    return absl::NotFoundError(absl::StrCat("stash: ", action, " of unknown entry ", handle.id));
  }
  Entry& e = it->second;
  if (e.info.state != StashState::kKept &&
      !(compressed_too && e.info.state == StashState::kCompressed)) {
    return WrongState(e.info, action, StashStateName(e.info.state));
  }
  if (e.pins > 0) return WrongState(e.info, action, "it is acquired by a backward");
  // Its reload failed after the compute stream was told to read it: no tensor to move (and an
  // offload would clear the error that says so).
  if (!e.copy_error.ok()) return WrongState(e.info, action, "its reload failed");
  return &e;
}

absl::Status Stash::Offload(StashHandle handle) {
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(Entry * entry, MovableEntryLocked(handle, "offload", /*compressed_too=*/true));
  Entry& e = *entry;
  if (engine_ == nullptr || host_ == nullptr) {
    return WrongState(e.info, "offload", "no copy engine and host pool are set");
  }
  if (Pending(engine_, e.to_device)) {
    return WrongState(e.info, "offload", "its reload is still being copied");
  }
  if (e.info.bytes == 0) return absl::OkStatus();
  // What leaves the device: the tensor, or its encoding where it is stored compressed.
  const bool encoded = e.info.state == StashState::kCompressed;
  const tensor::Buffer& payload = encoded ? e.encoded : e.buffer;
  absl::StatusOr<tensor::Buffer> host = host_->Allocate(payload.bytes(), e.info.producer);
  if (!host.ok()) return host.status();
  e.host = std::move(*host);
  e.host_encoded = encoded;
  e.host_bytes = payload.bytes();
  e.info.state = StashState::kOffloaded;
  e.landed = false;
  e.keep_device = false;
  e.copy_error = absl::OkStatus();
  const int64_t id = e.info.id;
  // The copy waits for what the compute stream has enqueued so far (the kernels writing the
  // tensor or its encoding), by an event recorded now on it.
  e.to_host = engine_->Submit(
      memory::CopyDirection::kDeviceToHost, e.host.data(), payload.data(), e.host_bytes,
      [this, id](const absl::Status& s) { OnOffloaded(id, s); }, ComputeStreamLocked());
  if (engine_->Done(e.to_host)) {  // refused (the hook cannot have run: it needs our lock)
    const absl::Status refused = engine_->Wait(e.to_host);
    e.host.Reset();
    e.info.state = encoded ? StashState::kCompressed : StashState::kKept;
    return refused;
  }
  return absl::OkStatus();
}

void Stash::OnOffloaded(int64_t id, const absl::Status& status) {
  tensor::Buffer doomed;  // freed after the lock is dropped
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(id);
  if (it == entries_.end()) return;
  Entry& e = it->second;
  // Counts what the policy offloaded (deterministic), also when the tensor was wanted back before
  // its copy landed and kept its device bytes.
  if (status.ok()) action_stats_.offloaded_bytes += e.host_bytes;
  if (!status.ok() || e.keep_device) {
    // The device bytes stay: the copy failed, or the tensor was wanted back before it landed.
    doomed = std::move(e.host);
    e.keep_device = false;
    e.info.state = e.host_encoded ? StashState::kCompressed : StashState::kKept;
    e.host_encoded = false;
    return;
  }
  tensor::Buffer& payload = e.host_encoded ? e.encoded : e.buffer;
  kept_bytes_ -= payload.bytes();
  doomed = std::move(payload);
  e.landed = true;
}

absl::StatusOr<memory::CopyTicket> Stash::StartReloadLocked(Entry& e) {
  if (e.info.state != StashState::kOffloaded) return memory::CopyTicket();
  if (!e.landed) {  // the offload is still copying: keep the device bytes instead
    e.keep_device = true;
    return e.to_host;
  }
  if (Pending(engine_, e.to_device)) return e.to_device;
  if (!e.copy_error.ok()) return e.copy_error;
  if (arena_ == nullptr || engine_ == nullptr) {
    return WrongState(e.info, "reload", "no device arena and copy engine are set");
  }
  absl::StatusOr<tensor::Buffer> incoming = arena_->Allocate(
      e.host_bytes, e.host_encoded ? e.info.producer + ".compressed" : e.info.producer);
  if (!incoming.ok()) return incoming.status();
  e.incoming = std::move(*incoming);
  NoteKeptLocked(e.incoming.bytes());
  const int64_t id = e.info.id;
  // After the compute stream's work so far: the destination was allocated in its order.
  e.to_device = engine_->Submit(
      memory::CopyDirection::kHostToDevice, e.incoming.data(), e.host.data(), e.host_bytes,
      [this, id](const absl::Status& s) { OnReloaded(id, s); }, ComputeStreamLocked());
  if (engine_->Done(e.to_device)) {  // refused
    const absl::Status refused = engine_->Wait(e.to_device);
    kept_bytes_ -= e.incoming.bytes();
    e.incoming.Reset();
    return refused;
  }
  return e.to_device;
}

void Stash::OnReloaded(int64_t id, const absl::Status& status) {
  tensor::Buffer doomed;
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(id);
  if (it == entries_.end()) return;
  Entry& e = it->second;
  if (e.reload_ordered) {
    // The compute stream already reads `buffer` after this copy (RestoreOne): the host copy goes.
    e.reload_ordered = false;
    if (!status.ok()) {
      e.copy_error = status;
      return;
    }
    action_stats_.reloaded_bytes += e.host_bytes;
    doomed = std::move(e.host);
    e.landed = false;
    return;
  }
  if (!status.ok()) {
    kept_bytes_ -= e.incoming.bytes();
    doomed = std::move(e.incoming);
    e.copy_error = status;
    return;
  }
  action_stats_.reloaded_bytes += e.host_bytes;
  doomed = std::move(e.host);
  e.landed = false;
  ArriveLocked(e);
}

template <typename Restore>
absl::Status Stash::RetriedAfterCopies(const Restore& restore) {
  const absl::Status first = restore();
  if (!absl::IsResourceExhausted(first)) return first;
  // Offloads still copying hold their device bytes until they land: whether a reload or a decode
  // fits must not depend on how fast the copy thread is (module.cc's Allocate waits the same way).
  // What the first try started is not started again.
  WaitForCopies();
  return restore();
}

absl::Status Stash::Prefetch(const std::vector<StashHandle>& handles) {
  return RetriedAfterCopies([&]() -> absl::Status {
    absl::MutexLock lock(&mu_);
    for (StashHandle h : handles) {
      if (!h.valid()) continue;
      auto it = entries_.find(h.id);
      if (it == entries_.end()) {
        return absl::NotFoundError(absl::StrCat("stash: prefetch of unknown entry ", h.id));
      }
      absl::StatusOr<memory::CopyTicket> started = StartReloadLocked(it->second);
      if (!started.ok()) return started.status();
    }
    return absl::OkStatus();
  });
}

absl::Status Stash::Compress(StashHandle handle, memory::Codec codec) {
  tensor::Buffer doomed;
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(Entry * entry, MovableEntryLocked(handle, "compress"));
  Entry& e = *entry;
  if (arena_ == nullptr || ops_ == nullptr) {
    return WrongState(e.info, "compress", "no device arena and backend are set");
  }
  RETURN_IF_ERROR(memory::CheckCompressible(e.info.producer, e.info.dtype, codec));
  if (const Entry* reader = DroppedReaderLocked(e.info.id)) {
    return WrongState(e.info, "compress",
                      absl::StrCat("'", reader->info.producer,
                                   "' is dropped and its rebuild reads it (it would carry the "
                                   "codec's error)")
                          .c_str());
  }
  const int64_t n = tensor::NumElements(e.info.shape);
  absl::StatusOr<tensor::Buffer> encoded =
      arena_->Allocate(memory::EncodedBytes(codec, n), e.info.producer + ".compressed");
  if (!encoded.ok()) return encoded.status();
  e.encoded = std::move(*encoded);
  NoteKeptLocked(e.encoded.bytes());
  memory::Encode(*ops_, codec, e.buffer.as<float>(), n, e.encoded.data());
  kept_bytes_ -= e.buffer.bytes();
  doomed = std::move(e.buffer);
  e.codec = codec;
  e.lossy = true;
  e.info.state = StashState::kCompressed;
  action_stats_.compressed_bytes += e.info.bytes;
  // A tiny fp8 tensor can take more bytes than fp32 (one scale per block): nothing saved then.
  if (e.info.bytes > e.encoded.bytes()) {
    action_stats_.compressed_saved_bytes += e.info.bytes - e.encoded.bytes();
  }
  return absl::OkStatus();
}

absl::Status Stash::DecodeLocked(Entry& e) {
  if (arena_ == nullptr || ops_ == nullptr) {
    return WrongState(e.info, "decompress", "no device arena and backend are set");
  }
  absl::StatusOr<tensor::Buffer> out = arena_->Allocate(e.info.bytes, e.info.producer);
  if (!out.ok()) return out.status();
  e.buffer = std::move(*out);
  NoteKeptLocked(e.buffer.bytes());
  memory::Decode(*ops_, e.codec, e.encoded.data(), tensor::NumElements(e.info.shape),
                 e.buffer.as<float>());
  kept_bytes_ -= e.encoded.bytes();
  e.encoded.Reset();
  e.info.state = StashState::kKept;
  return absl::OkStatus();
}

absl::Status Stash::RestoreOne(StashHandle handle, double needed_at) {
  memory::CopyTicket ticket;
  memory::CopyEngine* engine = nullptr;
  device::Stream* consumer = nullptr;  // set: order the reload before this stream's work
  RETURN_IF_ERROR(RetriedAfterCopies([&]() -> absl::Status {
    absl::MutexLock lock(&mu_);
    auto it = entries_.find(handle.id);
    if (it == entries_.end()) {
      return absl::NotFoundError(absl::StrCat("stash: no live entry ", handle.id));
    }
    Entry& e = it->second;
    if (e.info.state == StashState::kCompressed) return DecodeLocked(e);
    if (e.info.state != StashState::kOffloaded) return absl::OkStatus();
    // Wanted back before its offload landed: the device bytes stay, and waiting for that copy
    // is not a reload, so it can never be a late one.
    const bool reload = e.landed;
    if (!reload) needed_at = std::numeric_limits<double>::infinity();
    ASSIGN_OR_RETURN(ticket, StartReloadLocked(e));
    engine = engine_;
    if (reload && ticket.valid() && !HostIsComputeLocked()) consumer = ComputeStreamLocked();
    return absl::OkStatus();
  }));
  if (!ticket.valid()) return absl::OkStatus();
  bool late = false;
  // A discrete device: the compute stream waits for the reload's event; the host does not. The
  // CPU: the host waits. (Unlocked: the engine's thread takes our lock in its completion hooks.)
  const bool ordered = consumer != nullptr;
  const absl::Status waited = ordered ? engine->OrderBefore(ticket, *consumer, &late)
                                      : engine->Wait(ticket, needed_at, &late);
  {
    absl::MutexLock lock(&mu_);
    if (late) ++action_stats_.late_reloads;
    auto it = entries_.find(handle.id);
    if (it == entries_.end()) {
      return absl::NotFoundError(
          absl::StrCat("stash: entry ", handle.id, " released during reload"));
    }
    Entry& e = it->second;
    if (!e.copy_error.ok()) return e.copy_error;
    if (ordered) {
      if (!waited.ok()) return waited;
      if (e.info.state == StashState::kOffloaded) {  // still copying: the stream reads it after
        e.reload_ordered = true;
        ArriveLocked(e);
      }
    } else if (e.info.state != StashState::kKept && e.info.state != StashState::kCompressed) {
      // A failed offload copy leaves the tensor kept; anything else is the reload's failure.
      return waited.ok() ? absl::InternalError(absl::StrCat("stash: reload of '", e.info.producer,
                                                            "' completed but it is not kept"))
                         : waited;
    }
    if (e.info.state != StashState::kCompressed) return absl::OkStatus();
  }
  // An encoding brought back (or one whose offload was wanted back before it landed): decoded on
  // the compute stream, after the copy it waits for.
  return DecodeAfterCopies(handle);
}

void Stash::ArriveLocked(Entry& e) {
  (e.host_encoded ? e.encoded : e.buffer) = std::move(e.incoming);
  e.info.state = e.host_encoded ? StashState::kCompressed : StashState::kKept;
  e.host_encoded = false;
}

absl::Status Stash::DecodeAfterCopies(StashHandle handle) {
  return RetriedAfterCopies([&]() -> absl::Status {
    absl::MutexLock lock(&mu_);
    auto it = entries_.find(handle.id);
    if (it == entries_.end()) {
      return absl::NotFoundError(
          absl::StrCat("stash: entry ", handle.id, " released during reload"));
    }
    Entry& e = it->second;
    return e.info.state == StashState::kCompressed ? DecodeLocked(e) : absl::OkStatus();
  });
}

device::Stream* Stash::ComputeStreamLocked() const {
  return arena_ == nullptr ? nullptr : &tensor::StreamFor(arena_->device());
}

bool Stash::HostIsComputeLocked() const {
  return arena_ == nullptr || device::HostAddressable(arena_->device());
}

void Stash::WaitForCopies() {
  memory::CopyEngine* engine = nullptr;
  std::vector<memory::CopyTicket> pending;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [id, e] : entries_) {
      if (Pending(engine_, e.to_host)) pending.push_back(e.to_host);
      if (Pending(engine_, e.to_device)) pending.push_back(e.to_device);
    }
    engine = engine_;
  }
  for (const memory::CopyTicket& t : pending) engine->Wait(t).IgnoreError();
}

uint64_t Stash::OffloadingBytes() const {
  absl::MutexLock lock(&mu_);
  uint64_t bytes = 0;
  for (const auto& [id, e] : entries_) {
    if (e.info.state != StashState::kOffloaded || e.landed || e.keep_device) continue;
    bytes += (e.host_encoded ? e.encoded : e.buffer).bytes();
  }
  return bytes;
}

StashActionStats Stash::action_stats() const {
  absl::MutexLock lock(&mu_);
  return action_stats_;
}

// ---- Drop and recompute ----

const Stash::Entry* Stash::LossyInputLocked(const Entry& e) const {
  for (const StashHandle input : e.info.recompute.inputs) {
    auto it = entries_.find(input.id);
    if (it != entries_.end() && it->second.lossy) return &it->second;
  }
  return nullptr;
}

const Stash::Entry* Stash::DroppedReaderLocked(int64_t id) const {
  for (const auto& [other, e] : entries_) {
    if (e.info.state != StashState::kDropped) continue;
    for (const StashHandle input : e.info.recompute.inputs) {
      if (input.id == id) return &e;
    }
  }
  return nullptr;
}

void Stash::DropLocked(Entry& e, tensor::Buffer& doomed) {
  doomed = std::move(e.buffer);
  e.info.state = StashState::kDropped;
  kept_bytes_ -= e.info.bytes;
  dropped_bytes_ += e.info.bytes;
}

absl::Status Stash::Drop(StashHandle handle) { return DropChecked(handle, /*agreed=*/false); }

absl::Status Stash::DropAgreed(StashHandle handle) { return DropChecked(handle, /*agreed=*/true); }

bool Stash::CanDropAgreed(StashHandle handle) const {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(handle.id);
  return it != entries_.end() && DropRefusalLocked(it->second, /*agreed=*/true).ok();
}

absl::Status Stash::DropRefusalLocked(const Entry& e, bool agreed) const {
  const std::string& name = e.info.producer;
  if (e.info.state != StashState::kKept) {
    return absl::FailedPreconditionError(
        absl::StrCat("stash: cannot drop '", name, "': it is ", StashStateName(e.info.state)));
  }
  if (!e.copy_error.ok()) {  // as MovableEntryLocked: its error must reach Release
    return absl::FailedPreconditionError(
        absl::StrCat("stash: cannot drop '", name, "': its reload failed"));
  }
  if (e.pins > 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("stash: cannot drop '", name, "': a backward has acquired it"));
  }
  if (!e.info.recompute.rebuildable()) {
    return absl::FailedPreconditionError(
        absl::StrCat("stash: cannot drop '", name, "': it has no rebuild"));
  }
  if (e.info.recompute.collective != RecomputeCollective::kNone && !agreed) {
    return absl::FailedPreconditionError(absl::StrCat(
        "stash: cannot drop '", name,
        "' on one rank: its rebuild re-runs the expert all-to-all, so only a save policy applied "
        "on every rank of the group, or the ranks' agreement (DropAgreed), may drop it"));
  }
  if (const Entry* lossy = LossyInputLocked(e)) {
    return absl::FailedPreconditionError(
        absl::StrCat("stash: cannot drop '", name, "': its rebuild reads '", lossy->info.producer,
                     "', stored in reduced precision (the rebuild would carry the codec's error)"));
  }
  return absl::OkStatus();
}

absl::Status Stash::DropChecked(StashHandle handle, bool agreed) {
  tensor::Buffer doomed;  // returned to its owner after the lock is dropped
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(handle.id);
  if (it == entries_.end()) {
    return absl::NotFoundError(absl::StrCat("stash: drop of unknown entry ", handle.id));
  }
  RETURN_IF_ERROR(DropRefusalLocked(it->second, agreed));
  DropLocked(it->second, doomed);
  return absl::OkStatus();
}

void Stash::SetSavePolicy(SavePolicy policy) {
  absl::MutexLock lock(&mu_);
  save_policy_ = std::move(policy);
}

absl::Status Stash::ApplyPendingDrops() {
  std::vector<tensor::Buffer> doomed;  // returned to their owner after the lock is dropped
  absl::MutexLock lock(&mu_);
  for (int64_t id : pending_drops_) {
    auto it = entries_.find(id);
    if (it == entries_.end()) continue;
    const Entry& e = it->second;
    const Entry* lossy = LossyInputLocked(e);
    if (e.info.recompute.collective != RecomputeCollective::kNone &&
        (e.info.state != StashState::kKept || lossy != nullptr)) {
      // Every rank of the group drops it (a save policy applied on each): one that kept it would
      // skip the rebuild's all-to-all the others run in its backward.
      pending_drops_.clear();
      return absl::InternalError(absl::StrCat(
          "stash: '", e.info.producer, "' must be dropped on every rank of its group, but it is ",
          lossy != nullptr ? absl::StrCat("rebuilt from '", lossy->info.producer,
                                          "', stored in reduced precision")
                           : std::string(StashStateName(e.info.state))));
    }
    if (e.info.state != StashState::kKept) continue;
    if (lossy != nullptr) continue;  // kept: see LossyInputLocked
    if (it->second.pins > 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "stash: '", it->second.info.producer, "' is acquired before its forward is done"));
    }
    doomed.emplace_back();
    DropLocked(it->second, doomed.back());
  }
  pending_drops_.clear();
  return absl::OkStatus();
}

absl::StatusOr<tensor::TensorView> Stash::Rebuild(StashHandle handle) {
  std::function<absl::StatusOr<tensor::Buffer>()> rebuild;
  {
    absl::MutexLock lock(&mu_);
    auto it = entries_.find(handle.id);
    if (it == entries_.end()) {
      return absl::NotFoundError(absl::StrCat("stash: no live entry ", handle.id));
    }
    Entry& e = it->second;
    if (e.info.state == StashState::kKept) {  // rebuilt meanwhile, as another one's input
      return tensor::TensorView{e.buffer.data(), e.info.shape, e.info.dtype, device_};
    }
    if (e.rebuilding) {
      return absl::InternalError(
          absl::StrCat("stash: the rebuild of '", e.info.producer, "' needs itself"));
    }
    e.rebuilding = true;
    rebuild = e.info.recompute.rebuild;
  }
  absl::StatusOr<tensor::Buffer> rebuilt = rebuild();
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(handle.id);
  if (it == entries_.end()) {
    return absl::NotFoundError(
        absl::StrCat("stash: entry ", handle.id, " released during its rebuild"));
  }
  Entry& e = it->second;
  e.rebuilding = false;
  if (!rebuilt.ok()) return rebuilt.status();
  if (rebuilt->bytes() != e.info.bytes) {
    return absl::InternalError(absl::StrCat("stash: the rebuild of '", e.info.producer,
                                            "' returned ", rebuilt->bytes(), " bytes, want ",
                                            e.info.bytes));
  }
  e.buffer = std::move(*rebuilt);
  e.info.state = StashState::kKept;
  NoteKeptLocked(e.info.bytes);
  rebuilt_bytes_ += e.info.bytes;
  return tensor::TensorView{e.buffer.data(), e.info.shape, e.info.dtype, device_};
}

uint64_t Stash::dropped_bytes() const {
  absl::MutexLock lock(&mu_);
  return dropped_bytes_;
}

uint64_t Stash::rebuilt_bytes() const {
  absl::MutexLock lock(&mu_);
  return rebuilt_bytes_;
}

}  // namespace furnace::model
