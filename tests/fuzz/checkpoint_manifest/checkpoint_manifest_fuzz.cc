// The checkpoint manifest parser (runtime/checkpoint): the bytes become step 1's manifest.json
// and CheckpointStore::ReadManifest reads them, as a restart would after a crash or a damaged
// disk (a manifest that records its CRC32 is checked against it; one without, as older builds
// wrote them, is parsed field by field, which is what this exercises). The same bytes also go to
// ParseShardRecord (the
// record ranks exchange before rank 0 commits). Beyond not crashing:
//  - a manifest is refused only with DataLoss (the store's promise), or FailedPrecondition when
//    it says a newer format version than this build's; a shard record only with InvalidArgument;
//  - an accepted manifest is self-consistent: the step it says, one record per shard, every
//    parameter inside its shard's stored values, the shard totals adding up, its counters JSON
//    integers;
//  - every accepted record survives SerializeShardRecord -> ParseShardRecord unchanged;
//  - ReadShard of an accepted manifest (its shard files absent) fails cleanly.
#include <cstddef>
#include <cstdint>
#include <string>

#include "nlohmann/json.hpp"
#include "runtime/checkpoint/checkpoint.h"
#include "tests/fuzz/fuzz_check.h"
#include "tests/fuzz/scratch_dir.h"

namespace {

using furnace::train::CheckpointManifest;
using furnace::train::ShardRecord;

bool SameRecord(const ShardRecord& a, const ShardRecord& b) {
  if (a.file != b.file || a.bytes != b.bytes || a.crc32 != b.crc32 || a.n != b.n ||
      a.params.size() != b.params.size()) {
    return false;
  }
  for (size_t i = 0; i < a.params.size(); ++i) {
    const furnace::train::ParamInfo& p = a.params[i];
    const furnace::train::ParamInfo& q = b.params[i];
    if (p.name != q.name || p.shape != q.shape || p.offset != q.offset ||
        p.weight_decay != q.weight_decay || p.shard.global_shape != q.shard.global_shape ||
        (!p.shard.global_shape.empty() &&
         (p.shard.dim != q.shard.dim || p.shard.ranges != q.shard.ranges))) {
      return false;
    }
  }
  return true;
}

void CheckRoundTrip(const ShardRecord& record) {
  const absl::StatusOr<ShardRecord> back =
      furnace::train::ParseShardRecord(furnace::train::SerializeShardRecord(record));
  FUZZ_CHECK(back.ok(), "a serialized record does not parse: %s",
             std::string(back.status().message()).c_str());
  FUZZ_CHECK(SameRecord(record, *back), "a record changes on a serialize/parse round trip");
}

void CheckManifest(const CheckpointManifest& m) {
  FUZZ_CHECK(m.step == 1, "manifest of step 1 accepted with step %lld",
             static_cast<long long>(m.step));
  FUZZ_CHECK(m.num_shards >= 1 && m.shards.size() == static_cast<size_t>(m.num_shards),
             "%zu shard records for num_shards %d", m.shards.size(), m.num_shards);
  int64_t total = 0;
  for (const ShardRecord& r : m.shards) {
    FUZZ_CHECK(r.n >= 0, "shard %s with %lld values", r.file.c_str(), static_cast<long long>(r.n));
    FUZZ_CHECK(!r.file.empty() && r.file.find('/') == std::string::npos, "shard file '%s'",
               r.file.c_str());
    for (const furnace::train::ParamInfo& p : r.params) {
      FUZZ_CHECK(p.offset >= 0 && p.offset <= r.n, "parameter %s at offset %lld of %lld",
                 p.name.c_str(), static_cast<long long>(p.offset), static_cast<long long>(r.n));
    }
    total += r.n;
    CheckRoundTrip(r);
  }
  FUZZ_CHECK(total == m.values_in_all_shards, "shard sizes add to %lld, manifest says %lld",
             static_cast<long long>(total), static_cast<long long>(m.values_in_all_shards));
}

// The manifest's counters are JSON integers: a float (2e125) accepted for one would have been
// cast to an integer type (undefined behaviour when it does not fit).
void CheckIntegers(const uint8_t* data, size_t size) {
  const nlohmann::json j = nlohmann::json::parse(data, data + size, nullptr, false);
  FUZZ_CHECK(j.is_object(), "an accepted manifest is no JSON object");
  for (const char* key : {"version", "step", "data_position", "seed", "num_shards", "num_params"}) {
    FUZZ_CHECK(j[key].is_number_integer(), "accepted \"%s\": %s", key, j[key].dump().c_str());
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const furnace::fuzz::ScratchDir scratch;
  scratch.Write("step-00000001/manifest.json", data, size);
  const furnace::train::CheckpointStore store(scratch.path(), /*keep=*/0);
  const absl::StatusOr<CheckpointManifest> manifest = store.ReadManifest(1);
  if (manifest.ok()) {
    CheckManifest(*manifest);
    CheckIntegers(data, size);
    const absl::StatusOr<furnace::train::LoadedCheckpoint> shard = store.ReadShard(*manifest, 0);
    FUZZ_CHECK(!shard.ok(), "a shard that does not exist was loaded");
  } else {
    // Damage (DataLoss), or a newer format version (FailedPrecondition: a newer furnace wrote
    // it, not damage) where the text says a version above this build's.
    const nlohmann::json j = nlohmann::json::parse(data, data + size, nullptr, false);
    const bool newer = j.is_object() && j.contains("version") &&
                       j["version"].is_number_unsigned() &&
                       j["version"].get<uint64_t>() > furnace::train::kCheckpointVersion;
    FUZZ_CHECK(absl::IsDataLoss(manifest.status()) ||
                   (newer && absl::IsFailedPrecondition(manifest.status())),
               "manifest refused with %s: %s",
               std::string(absl::StatusCodeToString(manifest.status().code())).c_str(),
               std::string(manifest.status().message()).c_str());
  }

  const absl::StatusOr<ShardRecord> record =
      furnace::train::ParseShardRecord(std::string(reinterpret_cast<const char*>(data), size));
  if (record.ok()) {
    CheckRoundTrip(*record);
  } else {
    FUZZ_CHECK(absl::IsInvalidArgument(record.status()), "record refused with %s",
               std::string(absl::StatusCodeToString(record.status().code())).c_str());
  }
  return 0;
}
