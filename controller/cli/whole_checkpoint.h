// Whole tensors from a committed checkpoint, whatever layout wrote it
// (runtime/checkpoint/checkpoint.h). A single-rank checkpoint holds every tensor whole in shard 0.
// A parallel one holds, in each rank's shard, that rank's part of each tensor it has:
// ParamInfo::shard says where local element i lies in the whole tensor (GlobalIndex), and a tensor
// several ranks hold (replicated across data or tensor parallelism, the tied wte on the first and
// last pipeline stage) appears on each of them. Reassembly places every shard's elements by name,
// keeps the first copy of a replicated element and compares the later ones with it, and refuses a
// checkpoint that leaves an element of some tensor on no shard.
//
// Errors: DataLoss for a damaged or inconsistent checkpoint (the loader's checks, a part outside
// its shard's values, shapes that disagree between shards, an element on no shard), naming the
// checkpoint, shard and tensor; the loader's NotFound when there is nothing committed.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "furnace/v1/controller.pb.h"
#include "runtime/checkpoint/checkpoint.h"
#include "runtime/trainable/param_info.h"

namespace furnace::cli {

struct WholeTensor {
  std::string name;            // MODEL.md name
  std::vector<int64_t> shape;  // the whole tensor's shape
  std::vector<float> data;
};

struct WholeCheckpoint {
  int64_t step = 0;
  uint64_t seed = 0;
  std::string path;  // the step directory read
  std::string job;   // the job that wrote it (its manifest's "job"; empty: not recorded)
  int num_shards = 1;
  // In the single-process order: wte, wpe, then layer by layer (each layer's tensors in the order
  // the shards list them, experts by index), then lnf.
  std::vector<WholeTensor> tensors;
  std::vector<std::string> skipped;   // newer checkpoints passed over, each with the reason
  std::vector<std::string> warnings;  // replicas that disagree (the first copy is kept)
  int64_t num_params() const;
};

// Collects the shards of one checkpoint. Not thread-safe.
class TensorAssembler {
 public:
  // Relative difference above which two copies of a replicated element are reported.
  static constexpr double kReplicaTolerance = 1e-6;

  // `where` names the checkpoint in errors and warnings; `max_elements` bounds a whole tensor (the
  // values all shards store together: each element lies on some shard), so a damaged manifest
  // cannot ask for an absurd allocation. Shards may be added in any order; the first copy of an
  // element added is the one kept.
  TensorAssembler(std::string where, int64_t max_elements)
      : where_(std::move(where)), max_elements_(max_elements) {}

  // Places shard `shard`'s parameters (its manifest entries over its `n` stored values).
  absl::Status AddShard(int shard, const std::vector<train::ParamInfo>& params, const float* data,
                        int64_t n);
  // Checks that every element of every tensor came from some shard and returns the tensors in
  // the single-process order (see WholeCheckpoint::tensors). Call once.
  absl::StatusOr<std::vector<WholeTensor>> Finish();
  // One line per (tensor, shard) whose copy disagreed with the one kept.
  const std::vector<std::string>& warnings() const { return warnings_; }

 private:
  struct Slot {
    WholeTensor tensor;
    std::vector<bool> covered;
    int first_shard = 0;
  };
  std::string where_;
  int64_t max_elements_;
  std::vector<Slot> slots_;  // in order of first appearance
  std::map<std::string, size_t> index_;
  std::vector<std::string> warnings_;
};

// Every shard of committed step `step`, reassembled (after the loader verified each).
absl::StatusOr<WholeCheckpoint> LoadWholeCheckpoint(const train::CheckpointStore& store,
                                                    int64_t step);
// The newest committed checkpoint (not newer than LATEST) whose every shard verifies and
// reassembles; a damaged one is passed over for the previous one and listed in `skipped`. A
// running job may commit while this reads, and its checkpoint.keep then deletes the steps being
// read: when LATEST moved during a read that failed, the read starts again from the new LATEST.
absl::StatusOr<WholeCheckpoint> LoadLatestWholeCheckpoint(const train::CheckpointStore& store);

// The committed checkpoint of `job` at `step` (-1: the newest that verifies), read from the job's
// checkpoint.dir on this machine, for `command` ("export", "sample") to name in its messages.
// Errors are LocalErrors (exit 5): no checkpoint directory, the directory not visible here, none
// committed (saying the job's state and checkpoint.every), no committed checkpoint at `step`
// (listing those there are), or the loader's and reassembly's errors above.
absl::StatusOr<WholeCheckpoint> LoadJobCheckpoint(const v1::JobDetail& job, int64_t step,
                                                  const char* command);

}  // namespace furnace::cli
