#include "runtime/checkpoint/reshard.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "runtime/base/status.h"

namespace furnace::train {
namespace {

// This rank's parameters by name, and which of each one's elements are still to be copied.
class LayoutGather {
 public:
  LayoutGather(const std::vector<ParamInfo>& mine, int64_t n)
      : mine_(mine), params_(n), m_(n), v_(n) {
    for (size_t k = 0; k < mine_.size(); ++k) {
      by_name_.emplace(mine_[k].name, k);
      missing_.emplace_back(static_cast<size_t>(mine_[k].numel()), true);
      left_ += mine_[k].numel();
    }
  }

  // FailedPrecondition unless every tensor of this rank is in the checkpoint with the same
  // whole shape.
  absl::Status CheckAgainst(const std::string& path, const TensorShapes& in_checkpoint) const {
    for (const ParamInfo& p : mine_) {
      ASSIGN_OR_RETURN(const std::vector<int64_t> whole, ParamGlobalShape(p));
      const auto it = in_checkpoint.find(p.name);
      if (it == in_checkpoint.end()) {
        return absl::FailedPreconditionError(absl::StrCat(
            "checkpoint ", path, " has no tensor ", p.name, " (it was written by another model)"));
      }
      if (it->second != whole) {
        return absl::FailedPreconditionError(absl::StrCat(
            "checkpoint ", path, ": tensor ", p.name, " is ", ShapeText(it->second), " there and ",
            ShapeText(whole), " in this model (it was written by another model)"));
      }
    }
    return absl::OkStatus();
  }

  // How many still-missing elements `theirs` (one shard's parameters) holds; with `from`, copies
  // them (params, m, v) and marks them done.
  int64_t Take(const std::vector<ParamInfo>& theirs, const LoadedCheckpoint* from) {
    int64_t taken = 0;
    for (const ParamInfo& q : theirs) {
      const auto it = by_name_.find(q.name);
      if (it == by_name_.end()) continue;
      const ParamInfo& p = mine_[it->second];
      std::vector<bool>& missing = missing_[it->second];
      const int64_t numel = p.numel();
      for (int64_t i = 0; i < numel; ++i) {
        if (!missing[static_cast<size_t>(i)]) continue;
        const int64_t j = q.LocalIndex(p.GlobalIndex(i));
        if (j < 0) continue;
        ++taken;
        if (from == nullptr) continue;
        missing[static_cast<size_t>(i)] = false;
        const auto src = static_cast<size_t>(q.offset + j);
        const auto dst = static_cast<size_t>(p.offset + i);
        params_[dst] = from->param_data[src];
        m_[dst] = from->m[src];
        v_[dst] = from->v[src];
      }
    }
    left_ -= from != nullptr ? taken : 0;
    return taken;
  }

  int64_t left() const { return left_; }

  // DataLoss naming the first tensor with an element no shard holds.
  absl::Status Complete(const std::string& path) const {
    if (left_ == 0) return absl::OkStatus();
    for (size_t k = 0; k < mine_.size(); ++k) {
      const auto count = std::count(missing_[k].begin(), missing_[k].end(), true);
      if (count > 0) {
        return absl::DataLossError(absl::StrCat("checkpoint ", path, ": ", count, " of ",
                                                missing_[k].size(), " elements of tensor ",
                                                mine_[k].name, " are on no shard"));
      }
    }
    return absl::OkStatus();
  }

  void MoveInto(LoadedCheckpoint& out) {
    out.param_data = std::move(params_);
    out.m = std::move(m_);
    out.v = std::move(v_);
  }

 private:
  const std::vector<ParamInfo>& mine_;
  std::map<std::string, size_t> by_name_;
  std::vector<std::vector<bool>> missing_;
  std::vector<float> params_, m_, v_;
  int64_t left_ = 0;
};

}  // namespace

absl::StatusOr<TensorShapes> WholeShapes(const std::vector<ParamInfo>& params) {
  TensorShapes shapes;
  for (const ParamInfo& p : params) {
    ASSIGN_OR_RETURN(std::vector<int64_t> whole, ParamGlobalShape(p));
    shapes.emplace(p.name, std::move(whole));
  }
  return shapes;
}

absl::Status CompareTensorSets(const std::string& checkpoint, const TensorShapes& in_checkpoint,
                               const TensorShapes& model) {
  for (const auto& [name, shape] : in_checkpoint) {
    const auto it = model.find(name);
    if (it == model.end()) {
      return absl::FailedPreconditionError(
          absl::StrCat("checkpoint ", checkpoint, " holds tensor ", name, " ", ShapeText(shape),
                       ", which this model does not have (it was written by another model)"));
    }
    if (it->second != shape) {
      return absl::FailedPreconditionError(absl::StrCat(
          "checkpoint ", checkpoint, ": tensor ", name, " is ", ShapeText(shape), " there and ",
          ShapeText(it->second), " in this model (it was written by another model)"));
    }
  }
  for (const auto& [name, shape] : model) {
    if (in_checkpoint.count(name) == 0) {
      return absl::FailedPreconditionError(absl::StrCat("checkpoint ", checkpoint,
                                                        " has no tensor ", name,
                                                        " (it was written by another model)"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<LoadedCheckpoint> LoadIntoLayout(const CheckpointStore& store, int64_t step,
                                                const std::vector<ParamInfo>& mine, int64_t n,
                                                int preferred) {
  ASSIGN_OR_RETURN(const CheckpointManifest manifest, store.ReadManifest(step));
  LoadedCheckpoint out;
  out.step = manifest.step;
  out.data_position = manifest.data_position;
  out.data = manifest.data;
  out.settings = manifest.settings;
  out.job = manifest.job;
  out.seed = manifest.seed;
  out.path = manifest.path;
  out.num_shards = manifest.num_shards;
  out.values_in_all_shards = manifest.values_in_all_shards;
  for (const ShardRecord& record : manifest.shards) {
    for (const ParamInfo& p : record.params) {
      ASSIGN_OR_RETURN(std::vector<int64_t> whole, ParamGlobalShape(p));
      auto [it, inserted] = out.tensors.emplace(p.name, whole);
      if (!inserted && it->second != whole) {
        return absl::DataLossError(absl::StrCat("checkpoint ", manifest.path, ": tensor ", p.name,
                                                " is ", ShapeText(it->second), " on one shard and ",
                                                ShapeText(whole), " on ", record.file));
      }
    }
  }
  LayoutGather gather(mine, n);
  RETURN_IF_ERROR(gather.CheckAgainst(manifest.path, out.tensors));

  std::vector<int> order;
  if (preferred >= 0 && preferred < manifest.num_shards) order.push_back(preferred);
  for (int s = 0; s < manifest.num_shards; ++s) {
    if (s != preferred) order.push_back(s);
  }
  for (int s : order) {
    if (gather.left() == 0) break;
    if (gather.Take(manifest.shards[static_cast<size_t>(s)].params, nullptr) == 0) continue;
    ASSIGN_OR_RETURN(const LoadedCheckpoint shard, store.ReadShard(manifest, s));
    gather.Take(shard.params, &shard);
    out.shards_read.push_back(s);
  }
  RETURN_IF_ERROR(gather.Complete(manifest.path));
  gather.MoveInto(out);
  out.params = mine;
  return out;
}

absl::StatusOr<LoadedCheckpoint> LoadLatestIntoLayout(const CheckpointStore& store,
                                                      const std::vector<ParamInfo>& mine, int64_t n,
                                                      int preferred) {
  std::vector<std::string> skipped;
  ASSIGN_OR_RETURN(const std::vector<int64_t> candidates, store.LoadableSteps(&skipped));
  for (int64_t step : candidates) {
    absl::StatusOr<LoadedCheckpoint> loaded = LoadIntoLayout(store, step, mine, n, preferred);
    if (loaded.ok()) {
      loaded->skipped = std::move(skipped);
      return loaded;
    }
    if (!IsDamage(loaded.status())) return loaded.status();
    skipped.push_back(std::string(loaded.status().message()));
  }
  if (skipped.empty()) {
    return absl::NotFoundError(
        absl::StrCat("checkpoint: no committed checkpoint in ", store.dir()));
  }
  return absl::DataLossError(absl::StrCat("checkpoint: no usable checkpoint in ", store.dir(),
                                          ":\n  ", absl::StrJoin(skipped, ";\n  ")));
}

}  // namespace furnace::train
