#include "runtime/model/stash.h"

#include <utility>

#include "absl/strings/str_cat.h"

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
  absl::MutexLock lock(&mu_);
  const int64_t id = next_id_++;
  Entry& e = entries_[id];
  e.info.id = id;
  e.info.producer = std::move(producer);
  e.info.layer = layer;
  e.info.shape = std::move(shape);
  e.info.dtype = dtype;
  e.info.bytes = want;
  e.info.state = StashState::kKept;
  e.info.recompute = std::move(recompute);
  e.buffer = std::move(buffer);
  kept_bytes_ += want;
  if (kept_bytes_ > peak_bytes_) peak_bytes_ = kept_bytes_;
  return StashHandle{id};
}

absl::StatusOr<tensor::TensorView> Stash::Get(StashHandle handle) {
  StashEntryInfo info;
  RestoreHook restore;
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
    if (!restore_) {
      return absl::UnimplementedError(absl::StrCat("stash: '", e.info.producer, "' is ",
                                                   StashStateName(e.info.state),
                                                   " and no restore hook is set"));
    }
    info = e.info;
    restore = restore_;
  }
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

}  // namespace furnace::model
