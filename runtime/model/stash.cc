#include "runtime/model/stash.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "runtime/base/status.h"

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
  }
  const bool drop = policy && policy(info) == memory::SaveAction::kDropAfterForward;
  if (drop && !info.recompute.rebuildable()) {
    return absl::InvalidArgumentError(
        absl::StrCat("stash: the save policy drops '", info.producer, "', which has no rebuild"));
  }
  absl::MutexLock lock(&mu_);
  const int64_t id = next_id_++;
  Entry& e = entries_[id];
  e.info = std::move(info);
  e.info.id = id;
  e.buffer = std::move(buffer);
  kept_bytes_ += want;
  if (kept_bytes_ > peak_bytes_) peak_bytes_ = kept_bytes_;
  if (drop) pending_drops_.push_back(id);
  return StashHandle{id};
}

absl::StatusOr<tensor::TensorView> Stash::Get(StashHandle handle) {
  StashEntryInfo info;
  RestoreHook restore;
  bool dropped = false;
  {
    absl::MutexLock lock(&mu_);
    auto it = entries_.find(handle.id);
    if (it == entries_.end()) {
      return absl::NotFoundError(absl::StrCat("stash: no live entry ", handle.id));
    }
    Entry& e = it->second;
    if (e.info.state == StashState::kKept) {
      return tensor::TensorView{e.buffer.data(), e.info.shape, e.info.dtype, device_};
    }
    dropped = e.info.state == StashState::kDropped;  // rebuilt below, through its spec
    if (!dropped) {
      if (!restore_) {
        return absl::UnimplementedError(absl::StrCat("stash: '", e.info.producer, "' is ",
                                                     StashStateName(e.info.state),
                                                     " and no restore hook is set"));
      }
      info = e.info;
      restore = restore_;
    }
  }
  if (dropped) return Rebuild(handle);
  absl::StatusOr<tensor::Buffer> restored = restore(info);
  if (!restored.ok()) return restored.status();
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(handle.id);
  if (it == entries_.end()) {
    return absl::NotFoundError(
        absl::StrCat("stash: entry ", handle.id, " released during restore"));
  }
  Entry& e = it->second;
  if (restored->bytes() != e.info.bytes) {
    return absl::InternalError(absl::StrCat("stash: restore of '", e.info.producer, "' returned ",
                                            restored->bytes(), " bytes, want ", e.info.bytes));
  }
  e.buffer = std::move(*restored);
  e.info.state = StashState::kKept;
  kept_bytes_ += e.info.bytes;
  if (kept_bytes_ > peak_bytes_) peak_bytes_ = kept_bytes_;
  return tensor::TensorView{e.buffer.data(), e.info.shape, e.info.dtype, device_};
}

absl::Status Stash::Release(StashHandle handle) {
  tensor::Buffer doomed;  // returned to its owner after the lock is dropped
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(handle.id);
  if (it == entries_.end()) {
    return absl::NotFoundError(absl::StrCat("stash: release of unknown entry ", handle.id));
  }
  if (it->second.info.state == StashState::kKept) kept_bytes_ -= it->second.info.bytes;
  doomed = std::move(it->second.buffer);
  entries_.erase(it);
  return absl::OkStatus();
}

void Stash::ReleaseAll() {
  std::map<int64_t, Entry> doomed;
  absl::MutexLock lock(&mu_);
  doomed.swap(entries_);
  kept_bytes_ = 0;
  pending_drops_.clear();
}

void Stash::SetRestoreHook(RestoreHook hook) {
  absl::MutexLock lock(&mu_);
  restore_ = std::move(hook);
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

// ---- Drop and recompute ----

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
  for (StashHandle h : handles) {
    if (!h.valid()) continue;
    RETURN_IF_ERROR(Get(h).status());
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

void Stash::DropLocked(Entry& e, tensor::Buffer& doomed) {
  doomed = std::move(e.buffer);
  e.info.state = StashState::kDropped;
  kept_bytes_ -= e.info.bytes;
  dropped_bytes_ += e.info.bytes;
}

absl::Status Stash::Drop(StashHandle handle) {
  tensor::Buffer doomed;  // returned to its owner after the lock is dropped
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(handle.id);
  if (it == entries_.end()) {
    return absl::NotFoundError(absl::StrCat("stash: drop of unknown entry ", handle.id));
  }
  Entry& e = it->second;
  const std::string& name = e.info.producer;
  if (e.info.state != StashState::kKept) {
    return absl::FailedPreconditionError(
        absl::StrCat("stash: cannot drop '", name, "': it is ", StashStateName(e.info.state)));
  }
  if (e.pins > 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("stash: cannot drop '", name, "': a backward has acquired it"));
  }
  if (!e.info.recompute.rebuildable()) {
    return absl::FailedPreconditionError(
        absl::StrCat("stash: cannot drop '", name, "': it has no rebuild"));
  }
  if (e.info.recompute.collective != RecomputeCollective::kNone) {
    return absl::FailedPreconditionError(absl::StrCat(
        "stash: cannot drop '", name,
        "' on one rank: its rebuild re-runs the expert all-to-all, so only a save policy applied "
        "on every rank of the group may drop it"));
  }
  DropLocked(e, doomed);
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
    if (it == entries_.end() || it->second.info.state != StashState::kKept) continue;
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
  kept_bytes_ += e.info.bytes;
  if (kept_bytes_ > peak_bytes_) peak_bytes_ = kept_bytes_;
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
