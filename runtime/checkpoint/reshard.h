// Loading a checkpoint into any parallel layout of the same model (DESIGN.md "Recovery").
//
// A checkpoint's manifest lists, for every shard, the parameters that rank held: each one's name,
// local shape, offset into the shard's flat arrays and which part of the whole tensor it is
// (ParamInfo::shard). A rank of another layout (other dp, tp, pp, ep, esp or order) describes its
// own parameters the same way, so loading is a gather by name and global element index: every
// element this rank holds is copied, with its Adam moments, from the first shard that holds it.
// The shards are tried in the order: `preferred` (the rank's own shard, which under the layout
// that wrote the checkpoint holds every element it needs, so the same layout reads one file as
// before), then the others in ascending order; a shard is read (and its checksum verified) only
// when it holds an element still missing, and is dropped once copied from.
//
// Replicated elements (data- or tensor-parallel replicas, the tied wte on two pipeline stages) are
// taken from the first shard read; the runtime keeps replicas bit-identical, so which copy does
// not matter.
//
// Errors:
//   FailedPrecondition: the checkpoint is of another model: a tensor of this rank is not in it, or
//     its whole shape differs (both shapes named), or the checkpoint's tensors are not the model's
//     (CompareTensorSets, for callers that know the whole model's tensors);
//   DataLoss: a shard this rank needs is damaged (the loader's message), or an element of a tensor
//     is on no shard;
//   Unavailable: a shard or manifest exists but could not be read (CheckpointStore::Load);
//   NotFound: nothing committed (LoadLatestIntoLayout).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/checkpoint/checkpoint.h"
#include "runtime/trainable/param_info.h"

namespace furnace::train {

// The whole tensors `params` describe (a rank's part of a model, or a shard's manifest entry).
// DataLoss when a description is inconsistent (see ParamGlobalShape).
absl::StatusOr<TensorShapes> WholeShapes(const std::vector<ParamInfo>& params);

// OK when `model` (the model's tensors, over all ranks) and the checkpoint's are the same set with
// the same shapes; FailedPrecondition naming the first tensor that differs otherwise.
absl::Status CompareTensorSets(const std::string& checkpoint, const TensorShapes& in_checkpoint,
                               const TensorShapes& model);

// Committed step `step` gathered into the layout `mine` (this rank's parameters, over flat arrays
// of `n` values). The result's params are `mine`; its num_shards is the writer's; tensors holds
// the checkpoint's whole tensors; shards_read the shards read, in order.
absl::StatusOr<LoadedCheckpoint> LoadIntoLayout(const CheckpointStore& store, int64_t step,
                                                const std::vector<ParamInfo>& mine, int64_t n,
                                                int preferred);

// The newest committed checkpoint (not newer than LATEST) that loads into `mine`; a damaged one
// is passed over for the previous one and listed in `skipped` (CheckpointStore::LoadLatest's
// rules). Any other error (another model, another format version, a file that could not be
// read) is returned at once: an older checkpoint of the same directory would be no better.
absl::StatusOr<LoadedCheckpoint> LoadLatestIntoLayout(const CheckpointStore& store,
                                                      const std::vector<ParamInfo>& mine, int64_t n,
                                                      int preferred);

}  // namespace furnace::train
