// Checkpoints (DESIGN.md "Recovery", item 3). Layout under a checkpoint directory:
//
//   <dir>/step-<8 digits>/shard-<5 digits>.bin   one per rank: params, Adam m and v, counters
//   <dir>/step-<8 digits>/manifest.json          written last; its presence commits the step
//   <dir>/LATEST                                 the newest committed step, moved last
//
// Every file is written as <name>.tmp, fsynced, renamed and its directory fsynced, so a crash
// leaves either the old file or the complete new one. The order (shards, then manifest with each
// shard's byte size and CRC-32, then LATEST) means LATEST never names a step whose shards are not
// durable. Loading verifies sizes and checksums before trusting a byte; LoadLatest falls back from
// a corrupt or partial checkpoint to the previous committed one and says which it skipped and why.
//
// Shard file (little-endian):
//   0 char[8] "FURNCKPT" | 8 u32 version (1) | 12 u32 shard | 16 u32 num_shards | 20 u32 0
//   24 i64 step | 32 i64 data_position | 40 u64 seed | 48 i64 n | 56 f32 params[n] m[n] v[n]
//
// Single rank: shard 0 holds the whole flat arrays. With several ranks (a parallel layout) each
// writes its own shard with WriteShard (shard = its world rank), the records travel to one rank,
// which calls Commit once all are durable; the manifest then lists every shard's own parameters
// (with the part of each global tensor it holds), so a checkpoint loads into any layout of the
// same model (reshard.h) and tools can reassemble whole tensors from the shards.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "runtime/data/data_position.h"
#include "runtime/trainable/param_info.h"

namespace furnace::train {

inline constexpr uint32_t kCheckpointVersion = 1;
inline constexpr int64_t kShardHeaderBytes = 56;

// What one rank saves. The arrays are borrowed for the duration of the call.
struct ShardState {
  int64_t step = 0;           // completed optimizer steps
  int64_t data_position = 0;  // the next step index the sampler draws (== step)
  uint64_t seed = 0;          // the run's seed: data order and initialisation
  // Where the data stands (epoch, index, what defines the order): the manifest's "data" object.
  data::DataPosition data{};
  // The settings that steer the run from here on (the optimizer's: job-spec field -> its value as
  // text, e.g. "train.lr" -> "0.0003"): the manifest's "settings" object, compared on resume.
  std::map<std::string, std::string> settings{};
  // The job that wrote it (the manifest's "job"; empty: not recorded), so a reader of a
  // directory several jobs have written in turn takes the named job's steps only.
  std::string job{};
  int shard = 0;
  int num_shards = 1;
  int64_t n = 0;  // floats in each of params, m, v
  const float* params = nullptr;
  const float* m = nullptr;
  const float* v = nullptr;
};

struct ShardRecord {
  std::string file;  // name inside the step directory
  uint64_t bytes = 0;
  uint32_t crc32 = 0;
  // Parallel layouts: the shard's own parameters (names, local shapes, offsets and which part of
  // each global tensor it holds) and their count. Empty / -1: the manifest's top-level "params".
  std::vector<ParamInfo> params;
  int64_t n = -1;
};

// A ShardRecord as one JSON text (ranks exchange them before rank 0 commits), and back.
std::string SerializeShardRecord(const ShardRecord& record);
absl::StatusOr<ShardRecord> ParseShardRecord(const std::string& text);

// Every tensor's name and whole shape.
using TensorShapes = std::map<std::string, std::vector<int64_t>>;

// The whole shape of the tensor `p` is part of, or DataLoss saying why its shard description
// cannot be right (a manifest is not covered by a checksum): a negative dim, a shard dim that
// does not exist, another dim that is not whole, a range outside the tensor, ranges that do not
// add up to the local shape.
absl::StatusOr<std::vector<int64_t>> ParamGlobalShape(const ParamInfo& p);

// Whether a load error is damage to the checkpoint (DataLoss), for which a loader passes the step
// over for the previous one; any other error (unreadable, another version, another model) is one
// an older checkpoint of the same directory would not cure.
inline bool IsDamage(const absl::Status& status) { return absl::IsDataLoss(status); }

// What a load keeps of a shard: everything, or its parameters only (export and sampling, which
// need no Adam moments: the moments are still read through the checksum, a block at a time, so a
// damaged one is found, but not kept, a third of the memory).
enum class ShardParts { kAll, kParams };

// A committed step's manifest, checked for structure (no shard read).
struct CheckpointManifest {
  int64_t step = 0;
  int64_t data_position = 0;
  uint64_t seed = 0;
  data::DataPosition data{};  // order empty: not recorded (a checkpoint older than the record)
  std::map<std::string, std::string> settings{};  // empty: not recorded (an older checkpoint)
  std::string job;                                // who wrote it; empty: not recorded
  std::string path;                               // the step directory
  int num_shards = 1;
  int64_t values_in_all_shards = 0;
  // Per shard: its file, size, checksum, and its parameters (a single rank's: the top-level list)
  // with n their stored values.
  std::vector<ShardRecord> shards;
};

struct LoadedCheckpoint {
  int64_t step = 0;
  int64_t data_position = 0;
  uint64_t seed = 0;
  data::DataPosition data{};                      // order empty: not recorded
  std::map<std::string, std::string> settings{};  // empty: not recorded
  std::string job;                                // who wrote it; empty: not recorded
  std::string path;                               // the step directory loaded
  int num_shards = 1;                             // ranks that wrote it
  int64_t values_in_all_shards = 0;  // parameter values stored by all its shards together
  std::vector<ParamInfo> params;     // names, shapes and offsets recorded in the manifest
  std::vector<float> param_data, m, v;
  std::vector<std::string> skipped;  // newer checkpoints passed over, each with the reason
  // Loaded into another layout (reshard.h): the shards read, in order, and every tensor of the
  // checkpoint with its whole shape. Empty for a plain Load.
  std::vector<int> shards_read;
  TensorShapes tensors;
};

// A checkpoint directory. Not thread-safe; one writer per directory.
class CheckpointStore {
 public:
  // keep: committed checkpoints retained (older ones deleted after each commit); <= 0 keeps all.
  CheckpointStore(std::string dir, int keep) : dir_(std::move(dir)), keep_(keep) {}

  // Single rank: WriteShard, then Commit.
  absl::Status Save(const std::vector<ParamInfo>& params, const ShardState& state,
                    std::string* retention_error = nullptr);

  // Writes this rank's shard durably into the step directory (uncommitting the step first if a
  // manifest for it already exists).
  absl::StatusOr<ShardRecord> WriteShard(const ShardState& state);
  // Writes the manifest (durably, atomically), uncommits any step after this one (a timeline the
  // run left when it resumed from an earlier checkpoint), then moves LATEST, then deletes old
  // checkpoints. Once LATEST has moved the checkpoint is committed: a deletion that fails does
  // not fail it, it is said in `retention_error` (cleared otherwise) and tried again next time.
  absl::Status Commit(const std::vector<ParamInfo>& params, const ShardState& state,
                      const std::vector<ShardRecord>& shards,
                      std::string* retention_error = nullptr);

  // The newest committed checkpoint not newer than LATEST whose manifest, sizes and checksums
  // verify. NotFound when the directory holds no committed checkpoint; DataLoss (listing each
  // reason) when every one is damaged. Only damage (IsDamage) passes a checkpoint over: an
  // unreadable file or a newer format version is returned at once, since falling back would
  // resume from an older step and the next commit would uncommit the newer ones.
  absl::StatusOr<LoadedCheckpoint> LoadLatest(int shard = 0,
                                              ShardParts parts = ShardParts::kAll) const;
  // One step, verified; errors name the file and what is wrong with it:
  //   DataLoss: damage (a missing or truncated file, a checksum or a field that does not verify);
  //   Unavailable: a file that exists but could not be read (EIO, ESTALE, EACCES), not known to
  //     be damaged: a restart reads it again;
  //   FailedPrecondition: a newer format version (a newer furnace wrote it), or no such shard.
  absl::StatusOr<LoadedCheckpoint> Load(int64_t step, int shard = 0,
                                        ShardParts parts = ShardParts::kAll) const;
  // The manifest of committed step `step` (DataLoss when damaged; every shard's parameters are
  // checked with ParamGlobalShape and against its stored values).
  absl::StatusOr<CheckpointManifest> ReadManifest(int64_t step) const;
  // Shard `shard` of a manifest ReadManifest returned, verified against it.
  absl::StatusOr<LoadedCheckpoint> ReadShard(const CheckpointManifest& manifest, int shard,
                                             ShardParts parts = ShardParts::kAll) const;

  // Steps whose manifest exists (or cannot be told not to: its status unreadable), ascending;
  // Unavailable when the directory cannot be listed. CommittedSteps: the same, none when it
  // cannot (for messages and tests).
  absl::StatusOr<std::vector<int64_t>> ListCommittedSteps() const;
  std::vector<int64_t> CommittedSteps() const;
  // The committed steps a loader may use, newest first: none newer than LATEST (a manifest
  // written after LATEST moved was never published), all of them when LATEST is missing or
  // unreadable (and then `notes` says so). LoadLatest tries them in this order. Unavailable when
  // the directory cannot be listed: a loader must not then start over as if there were none.
  absl::StatusOr<std::vector<int64_t>> LoadableSteps(std::vector<std::string>* notes) const;
  // The step LATEST names; nullopt when there is no LATEST file.
  absl::StatusOr<std::optional<int64_t>> LatestStep() const;

  const std::string& dir() const { return dir_; }
  std::string StepDir(int64_t step) const;
  static std::string ShardFileName(int shard);

  // Tests: called after each stage of Save ("shard", "manifest", "latest"); an error aborts the
  // save there, as a crash would.
  void SetStageHookForTest(std::function<absl::Status(absl::string_view)> hook) {
    stage_hook_ = std::move(hook);
  }

 private:
  absl::Status Prune(int64_t latest) const;
  // Deletes LATEST temporaries that commits killed mid-write left behind.
  void RemoveStaleLatestTemps() const;
  absl::Status Stage(absl::string_view name) const {
    return stage_hook_ ? stage_hook_(name) : absl::OkStatus();
  }

  std::string dir_;
  int keep_;
  std::function<absl::Status(absl::string_view)> stage_hook_;
};

}  // namespace furnace::train
