#include "runtime/checkpoint/checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <system_error>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "nlohmann/json.hpp"
#include "runtime/base/file_error.h"
#include "runtime/base/status.h"
#include "runtime/checkpoint/crc32.h"
#include "runtime/checkpoint/durable_file.h"

namespace furnace::train {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

constexpr char kShardMagic[8] = {'F', 'U', 'R', 'N', 'C', 'K', 'P', 'T'};
constexpr char kManifest[] = "manifest.json";
constexpr char kManifestChecksum[] = "manifest_crc32";
constexpr char kLatest[] = "LATEST";
constexpr char kStepPrefix[] = "step-";

template <typename T>
void Put(std::string* out, T value) {
  for (size_t i = 0; i < sizeof(T); ++i) {
    out->push_back(static_cast<char>(static_cast<uint64_t>(value) >> (8 * i)));
  }
}

template <typename T>
T Get(const unsigned char* p) {
  uint64_t v = 0;
  for (size_t i = 0; i < sizeof(T); ++i) v |= uint64_t{p[i]} << (8 * i);
  return static_cast<T>(v);
}

// step-00000012 -> 12; anything else -> nullopt.
std::optional<int64_t> ParseStepDir(const std::string& name) {
  absl::string_view rest = name;
  if (!absl::ConsumePrefix(&rest, kStepPrefix) || rest.size() < 8) return std::nullopt;
  int64_t step;
  if (!absl::SimpleAtoi(rest, &step) || step < 0) return std::nullopt;
  if (!std::all_of(rest.begin(), rest.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return std::nullopt;
  }
  return step;
}

// The step directories of `dir`, each with whether it holds a manifest, or Unavailable when `dir`
// cannot be listed (a missing `dir` has none). A manifest whose status cannot be read (EIO,
// ESTALE, EACCES: anything but "no such file") counts as present: such a step is never taken for
// an interrupted save (and deleted) nor skipped by a loader, which then reports the error it meets
// reading it.
absl::StatusOr<std::vector<std::pair<int64_t, bool>>> ListStepDirs(const std::string& dir) {
  std::vector<std::pair<int64_t, bool>> steps;
  std::error_code ec;
  fs::directory_iterator it(dir, ec);
  if (ec == std::errc::no_such_file_or_directory) return steps;
  // Advanced with increment(ec): the throwing operator++ would end the process on a failing
  // file system (an NFS server gone stale mid-listing) from the commit thread.
  for (const fs::directory_iterator end; !ec && it != end; it.increment(ec)) {
    std::optional<int64_t> step = ParseStepDir(it->path().filename().string());
    if (!step) continue;
    std::error_code manifest_ec;
    const fs::file_status manifest = fs::status(it->path() / kManifest, manifest_ec);
    steps.emplace_back(*step, manifest.type() != fs::file_type::not_found);
  }
  if (ec) {
    return absl::UnavailableError(
        absl::StrCat("checkpoint: cannot list ", dir, ": ", ec.message()));
  }
  return steps;
}

// The steps of ListStepDirs that hold a manifest, ascending.
std::vector<int64_t> CommittedOf(const std::vector<std::pair<int64_t, bool>>& dirs) {
  std::vector<int64_t> steps;
  for (const auto& [step, has_manifest] : dirs) {
    if (has_manifest) steps.push_back(step);
  }
  std::sort(steps.begin(), steps.end());
  return steps;
}

// The element count of `shape` (dims >= 0), saturating at INT64_MAX: shapes come from a manifest,
// which no checksum protects.
int64_t SaturatingNumel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d != 0 && n > INT64_MAX / d) return INT64_MAX;
    n *= d;
  }
  return n;
}

absl::Status NewerVersionError(const std::string& what, uint64_t version) {
  return absl::FailedPreconditionError(
      absl::StrCat(what, ": format version ", version, ", this build reads version ",
                   kCheckpointVersion, " (written by a newer furnace: run that one)"));
}

// Reads exactly n bytes into dst, folding them into *crc.
absl::Status ReadExact(std::FILE* f, const std::string& path, void* dst, size_t n, uint32_t* crc) {
  if (std::fread(dst, 1, n, f) != n) {
    // A read error says nothing of the bytes (an I/O error of a network file system); an early
    // end of a file of the recorded size is damage.
    if (std::ferror(f)) return UnreadableFileError(absl::StrCat("checkpoint shard ", path), errno);
    return absl::DataLossError(absl::StrCat("checkpoint shard ", path, ": short read"));
  }
  *crc = Crc32(*crc, dst, n);
  return absl::OkStatus();
}

// A JSON integer as T. nlohmann's get<T>() casts a JSON float to an integer type, undefined
// behaviour when it does not fit (a manifest saying 2e125; found by tests/fuzz), and narrows a
// large integer silently. A manifest is not covered by a checksum, so both throw here, as
// nlohmann's getters do on a type mismatch (callers catch Json::exception).
template <typename T>
T Integer(const Json& j) {
  if (j.is_number_unsigned()) {
    if (const uint64_t v = j.get<uint64_t>(); std::in_range<T>(v)) return static_cast<T>(v);
  } else if (j.is_number_integer()) {
    if (const int64_t v = j.get<int64_t>(); std::in_range<T>(v)) return static_cast<T>(v);
  } else {
    throw Json::type_error::create(302, absl::StrCat("expected an integer, got ", j.dump()), &j);
  }
  throw Json::out_of_range::create(406, absl::StrCat("integer ", j.dump(), " out of range"), &j);
}

std::vector<int64_t> Integers(const Json& j) {
  if (!j.is_array()) {
    throw Json::type_error::create(302, absl::StrCat("expected an array, got ", j.dump()), &j);
  }
  std::vector<int64_t> out;
  for (const Json& e : j) out.push_back(Integer<int64_t>(e));
  return out;
}

Json ParamsJson(const std::vector<ParamInfo>& params) {
  Json list = Json::array();
  for (const ParamInfo& p : params) {
    Json j = {{"name", p.name},
              {"shape", p.shape},
              {"offset", p.offset},
              {"weight_decay", p.weight_decay}};
    if (p.shard.sharded()) {
      Json ranges = Json::array();
      for (const auto& [b, e] : p.shard.ranges) ranges.push_back({b, e});
      j["global_shape"] = p.shard.global_shape;
      j["shard_dim"] = p.shard.dim;
      j["shard_ranges"] = ranges;
    }
    list.push_back(std::move(j));
  }
  return list;
}

// Throws Json::exception on a malformed entry (callers catch).
std::vector<ParamInfo> ParamsFromJson(const Json& list) {
  std::vector<ParamInfo> params;
  for (const Json& p : list) {
    ParamInfo info;
    info.name = p.at("name").get<std::string>();
    info.shape = Integers(p.at("shape"));
    info.offset = Integer<int64_t>(p.at("offset"));
    info.weight_decay = p.at("weight_decay").get<bool>();
    if (p.contains("global_shape")) {
      info.shard.global_shape = Integers(p.at("global_shape"));
      info.shard.dim = Integer<int>(p.at("shard_dim"));
      for (const Json& r : p.at("shard_ranges")) {
        info.shard.ranges.emplace_back(Integer<int64_t>(r.at(0)), Integer<int64_t>(r.at(1)));
      }
    }
    params.push_back(std::move(info));
  }
  return params;
}

Json RecordJson(const ShardRecord& r) {
  Json j = {{"file", r.file}, {"bytes", r.bytes}, {"crc32", r.crc32}};
  if (r.n >= 0) {
    j["num_params"] = r.n;
    j["params"] = ParamsJson(r.params);
  }
  return j;
}

ShardRecord RecordFromJson(const Json& j) {
  ShardRecord r;
  r.file = j.at("file").get<std::string>();
  r.bytes = Integer<uint64_t>(j.at("bytes"));
  r.crc32 = Integer<uint32_t>(j.at("crc32"));
  if (j.contains("num_params")) {
    r.n = Integer<int64_t>(j.at("num_params"));
    r.params = ParamsFromJson(j.at("params"));
  }
  return r;
}

}  // namespace

std::string SerializeShardRecord(const ShardRecord& record) { return RecordJson(record).dump(); }

absl::StatusOr<ShardRecord> ParseShardRecord(const std::string& text) {
  Json j = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError("shard record: not valid JSON");
  }
  try {
    return RecordFromJson(j);
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("shard record: ", e.what()));
  }
}

std::string CheckpointStore::StepDir(int64_t step) const {
  return (fs::path(dir_) / absl::StrFormat("%s%08d", kStepPrefix, step)).string();
}

std::string CheckpointStore::ShardFileName(int shard) {
  return absl::StrFormat("shard-%05d.bin", shard);
}

absl::Status CheckpointStore::Save(const std::vector<ParamInfo>& params, const ShardState& state,
                                   std::string* retention_error) {
  ASSIGN_OR_RETURN(ShardRecord record, WriteShard(state));
  RETURN_IF_ERROR(Stage("shard"));
  return Commit(params, state, {record}, retention_error);
}

absl::StatusOr<ShardRecord> CheckpointStore::WriteShard(const ShardState& s) {
  const std::string step_dir = StepDir(s.step);
  std::error_code ec;
  // The checkpoint directory and those above it that the first checkpoint creates: each one's
  // entry is made durable in its parent too (outermost first), or a power loss after the first
  // commit could lose the whole directory.
  std::vector<fs::path> created;
  for (fs::path p = fs::path(dir_); !p.empty() && !fs::exists(p, ec); p = p.parent_path()) {
    created.push_back(p);
    if (p == p.parent_path()) break;
  }
  fs::create_directories(step_dir, ec);
  if (ec) {
    return absl::InternalError(
        absl::StrCat("checkpoint: cannot create ", step_dir, ": ", ec.message()));
  }
  for (auto it = created.rbegin(); it != created.rend(); ++it) {
    RETURN_IF_ERROR(SyncDirectory(it->parent_path().string()));
  }
  RETURN_IF_ERROR(SyncDirectory(dir_));
  // Re-saving a committed step (a resumed run reaching it again): uncommit it first, so a crash
  // mid-write cannot leave an old manifest describing a new shard.
  const fs::path manifest = fs::path(step_dir) / kManifest;
  if (fs::exists(manifest, ec)) {
    fs::remove(manifest, ec);
    if (ec) {
      return absl::InternalError(
          absl::StrCat("checkpoint: cannot remove ", manifest.string(), ": ", ec.message()));
    }
    RETURN_IF_ERROR(SyncDirectory(step_dir));
  }

  ShardRecord record;
  record.file = ShardFileName(s.shard);
  std::string header;
  header.append(kShardMagic, 8);
  Put<uint32_t>(&header, kCheckpointVersion);
  Put<uint32_t>(&header, static_cast<uint32_t>(s.shard));
  Put<uint32_t>(&header, static_cast<uint32_t>(s.num_shards));
  Put<uint32_t>(&header, 0);
  Put<int64_t>(&header, s.step);
  Put<int64_t>(&header, s.data_position);
  Put<uint64_t>(&header, s.seed);
  Put<int64_t>(&header, s.n);
  DurableWriter writer((fs::path(step_dir) / record.file).string());
  RETURN_IF_ERROR(writer.Open());
  RETURN_IF_ERROR(writer.Append(header.data(), header.size()));
  const size_t array_bytes = static_cast<size_t>(s.n) * sizeof(float);
  RETURN_IF_ERROR(writer.Append(s.params, array_bytes));
  RETURN_IF_ERROR(writer.Append(s.m, array_bytes));
  RETURN_IF_ERROR(writer.Append(s.v, array_bytes));
  RETURN_IF_ERROR(writer.Commit());
  record.bytes = writer.bytes();
  record.crc32 = writer.crc32();
  return record;
}

absl::Status CheckpointStore::Commit(const std::vector<ParamInfo>& params, const ShardState& s,
                                     const std::vector<ShardRecord>& shards,
                                     std::string* retention_error) {
  if (retention_error != nullptr) retention_error->clear();
  Json manifest = {{"format", "furnace-checkpoint"},
                   {"version", kCheckpointVersion},
                   {"step", s.step},
                   {"data_position", s.data_position},
                   {"seed", s.seed},
                   {"num_shards", s.num_shards},
                   {"num_params", s.n}};
  if (!s.data.order.empty()) {
    manifest["data"] = {{"order", s.data.order},
                        {"sequences", s.data.sequences},
                        {"epoch", s.data.epoch},
                        {"index_in_epoch", s.data.index_in_epoch},
                        {"epoch_sequences", s.data.epoch_sequences}};
    if (!s.data.datasets.empty()) {
      Json datasets = Json::array();
      for (const data::DatasetPosition& d : s.data.datasets) {
        datasets.push_back({{"path", d.path},
                            {"epoch", d.epoch},
                            {"index_in_epoch", d.index_in_epoch},
                            {"epoch_sequences", d.epoch_sequences}});
      }
      manifest["data"]["datasets"] = datasets;
    }
  }
  if (!s.settings.empty()) manifest["settings"] = s.settings;
  if (!s.job.empty()) manifest["job"] = s.job;
  Json shard_list = Json::array();
  for (const ShardRecord& r : shards) shard_list.push_back(RecordJson(r));
  manifest["shards"] = shard_list;
  manifest["params"] = ParamsJson(params);
  // Its own checksum, of the text without it: a damaged offset or shape would otherwise load
  // (the shards' checksums cover their bytes, not where the manifest says each tensor lies).
  const std::string body = manifest.dump(1);
  manifest[kManifestChecksum] = Crc32(0, body.data(), body.size());
  const std::string step_dir = StepDir(s.step);
  // Every shard must be where the manifest is written, whole: ranks on hosts that do not share
  // checkpoint.dir write their shards on their own disks, and a manifest naming files this host
  // lacks would commit, step after step, checkpoints no restart can load.
  // Opened, then fstat: NFS revalidates a file's attributes at open (close-to-open), where a bare
  // stat may answer from its attribute cache (a re-saved step's old size).
  for (size_t i = 0; i < shards.size(); ++i) {
    const std::string file = (fs::path(step_dir) / shards[i].file).string();
    const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
    struct stat st {};
    const int err = fd < 0 ? errno : ::fstat(fd, &st) != 0 ? errno : 0;
    if (fd >= 0) ::close(fd);
    if (err != 0 || static_cast<uint64_t>(st.st_size) != shards[i].bytes) {
      return absl::FailedPreconditionError(absl::StrCat(
          "checkpoint: shard ", i, "'s file ", file, " is ",
          err != 0
              ? absl::StrCat("not visible here (", std::strerror(err), ")")
              : absl::StrCat(st.st_size, " bytes, not the ", shards[i].bytes, " its rank wrote"),
          ": checkpoint.dir must be one file system that every rank's host shares"));
    }
  }
  RETURN_IF_ERROR(
      WriteFileDurably((fs::path(step_dir) / kManifest).string(), manifest.dump(1) + "\n"));
  RETURN_IF_ERROR(Stage("manifest"));
  // Steps committed after this one belong to a timeline the run left: it resumed from an earlier
  // checkpoint (a newer one was damaged, or a rank could not read it). LATEST moving back hides
  // them, but only until it passes them again; then a damaged one would count as one of the
  // `keep` and good ones be deleted in its place. They are uncommitted first (before LATEST:
  // a crash between leaves nothing of them loadable), and deleted once LATEST passes them.
  ASSIGN_OR_RETURN(const std::vector<int64_t> committed, ListCommittedSteps());
  for (const int64_t later : committed) {
    if (later <= s.step) continue;
    std::error_code ec;
    fs::remove(fs::path(StepDir(later)) / kManifest, ec);
    if (ec) {
      return absl::InternalError(absl::StrCat("checkpoint: cannot uncommit ", StepDir(later),
                                              " (a step after ", s.step, "): ", ec.message()));
    }
    RETURN_IF_ERROR(SyncDirectory(StepDir(later)));  // the unlink is the step directory's entry
  }
  RETURN_IF_ERROR(
      WriteFileDurably((fs::path(dir_) / kLatest).string(), absl::StrCat(s.step, "\n")));
  RETURN_IF_ERROR(Stage("latest"));
  RemoveStaleLatestTemps();
  // Committed. Deleting old checkpoints that fails (a file another host still holds open, a
  // directory made immutable) does not undo that: it is said, and tried again at the next commit.
  if (absl::Status pruned = Prune(s.step); !pruned.ok()) {
    if (retention_error != nullptr) *retention_error = std::string(pruned.message());
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int64_t>> CheckpointStore::ListCommittedSteps() const {
  ASSIGN_OR_RETURN(const auto dirs, ListStepDirs(dir_));
  return CommittedOf(dirs);
}

std::vector<int64_t> CheckpointStore::CommittedSteps() const {
  return ListCommittedSteps().value_or(std::vector<int64_t>());
}

absl::StatusOr<std::optional<int64_t>> CheckpointStore::LatestStep() const {
  const std::string path = (fs::path(dir_) / kLatest).string();
  std::string text;
  absl::Status s = ReadFileToString(path, &text);
  if (absl::IsNotFound(s)) return std::optional<int64_t>();
  RETURN_IF_ERROR(s);
  int64_t step;
  if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(text), &step) || step < 0) {
    return absl::DataLossError(
        absl::StrCat("checkpoint: ", path, " holds \"", text, "\", not a step number"));
  }
  return std::optional<int64_t>(step);
}

void CheckpointStore::RemoveStaleLatestTemps() const {
  // A commit killed while writing LATEST leaves its temporary (LATEST.tmp.XXXXXX) behind; each
  // crash one more. This commit's own is renamed by now, so any left are a dead writer's: only
  // one process commits a store at a time. An hour's margin all the same, so a clock skewed
  // between hosts of a shared file system, or a second job wrongly given the same directory,
  // never loses a LATEST being written. Best effort: litter, not state.
  const std::string prefix = absl::StrCat(kLatest, ".tmp.");
  const auto cutoff = fs::file_time_type::clock::now() - std::chrono::hours(1);
  std::error_code ec;
  fs::directory_iterator it(dir_, ec);
  for (const fs::directory_iterator end; !ec && it != end; it.increment(ec)) {
    if (!absl::StartsWith(it->path().filename().string(), prefix)) continue;
    std::error_code file_ec;
    const fs::file_time_type written = fs::last_write_time(it->path(), file_ec);
    if (!file_ec && written < cutoff) fs::remove(it->path(), file_ec);
  }
}

absl::Status CheckpointStore::Prune(int64_t latest) const {
  if (keep_ <= 0) return absl::OkStatus();
  // Nothing is deleted on a listing that failed: a partial one would count too few newer steps.
  ASSIGN_OR_RETURN(const auto dirs, ListStepDirs(dir_));
  const std::vector<int64_t> committed = CommittedOf(dirs);
  std::vector<int64_t> doomed;
  int kept = 0;
  for (auto it = committed.rbegin(); it != committed.rend(); ++it) {
    if (*it > latest) continue;
    if (kept < keep_) {
      ++kept;
    } else {
      doomed.push_back(*it);
    }
  }
  // Uncommitted directories older than LATEST (surely without a manifest) are leftovers of
  // interrupted saves.
  for (const auto& [step, has_manifest] : dirs) {
    if (step < latest && !has_manifest) doomed.push_back(step);
  }
  std::error_code ec;
  for (int64_t step : doomed) {
    // Uncommit first (manifest, made durable), so a crash mid-delete leaves an uncommitted
    // leftover, not a committed checkpoint with missing shards.
    if (fs::remove(fs::path(StepDir(step)) / kManifest, ec) && !ec) {
      RETURN_IF_ERROR(SyncDirectory(StepDir(step)));
    }
    fs::remove_all(StepDir(step), ec);
    if (ec) {
      return absl::InternalError(
          absl::StrCat("checkpoint: cannot delete ", StepDir(step), ": ", ec.message()));
    }
  }
  return SyncDirectory(dir_);
}

absl::StatusOr<std::vector<int64_t>> CheckpointStore::LoadableSteps(
    std::vector<std::string>* notes) const {
  ASSIGN_OR_RETURN(const std::vector<int64_t> committed, ListCommittedSteps());
  absl::StatusOr<std::optional<int64_t>> latest = LatestStep();
  std::optional<int64_t> bound;
  if (!latest.ok()) {
    notes->push_back(absl::StrCat(latest.status().message(), "; trying every committed step"));
  } else if (!latest->has_value()) {
    if (!committed.empty()) {
      notes->push_back(
          absl::StrCat("checkpoint: ", dir_, "/LATEST is missing; trying every committed step"));
    }
  } else {
    bound = **latest;
    if (!std::binary_search(committed.begin(), committed.end(), *bound)) {
      notes->push_back(absl::StrCat("checkpoint: ", dir_, "/LATEST names step ", *bound,
                                    ", which is not committed (its manifest is missing)"));
    }
  }
  std::vector<int64_t> steps, above;
  for (auto it = committed.rbegin(); it != committed.rend(); ++it) {
    (!bound || *it <= *bound ? steps : above).push_back(*it);
  }
  if (!above.empty()) {
    // A crash between a manifest and LATEST's move leaves one such step; LATEST set back (by hand,
    // or damaged) leaves any number. Either way the run resumes at LATEST and its next commit
    // uncommits them (Commit): said, so the work is not lost without a word.
    std::reverse(above.begin(), above.end());
    notes->push_back(absl::StrCat(
        "checkpoint: ", dir_, " holds committed step", above.size() == 1 ? " " : "s ",
        absl::StrJoin(above, ", "), " above step ", *bound,
        ", which LATEST names: passed over, and uncommitted by this run's next checkpoint (if "
        "LATEST was set back by mistake or damaged, stop the job and write the step to resume "
        "from into ",
        dir_, "/LATEST)"));
  }
  return steps;
}

absl::StatusOr<LoadedCheckpoint> CheckpointStore::LoadLatest(int shard, ShardParts parts) const {
  std::vector<std::string> skipped;
  ASSIGN_OR_RETURN(const std::vector<int64_t> candidates, LoadableSteps(&skipped));
  for (int64_t step : candidates) {
    absl::StatusOr<LoadedCheckpoint> loaded = Load(step, shard, parts);
    if (loaded.ok()) {
      loaded->skipped = std::move(skipped);
      return loaded;
    }
    if (!IsDamage(loaded.status())) return loaded.status();
    skipped.push_back(std::string(loaded.status().message()));
  }
  if (skipped.empty()) {
    return absl::NotFoundError(absl::StrCat("checkpoint: no committed checkpoint in ", dir_));
  }
  std::string all;
  for (const std::string& s : skipped) absl::StrAppend(&all, all.empty() ? "\n  " : ";\n  ", s);
  return absl::DataLossError(absl::StrCat("checkpoint: no usable checkpoint in ", dir_, ":", all));
}

absl::StatusOr<LoadedCheckpoint> CheckpointStore::Load(int64_t step, int shard,
                                                       ShardParts parts) const {
  ASSIGN_OR_RETURN(const CheckpointManifest manifest, ReadManifest(step));
  return ReadShard(manifest, shard, parts);
}

absl::StatusOr<CheckpointManifest> CheckpointStore::ReadManifest(int64_t step) const {
  const std::string step_dir = StepDir(step);
  const std::string manifest_path = (fs::path(step_dir) / kManifest).string();
  std::string text;
  if (absl::Status read = ReadFileToString(manifest_path, &text); !read.ok()) {
    // Listed as committed, gone now (deleted while it was being loaded): damage, passed over,
    // never "no checkpoint" (which would start the run afresh). Any other error says nothing of
    // its bytes.
    if (absl::IsNotFound(read)) {
      return absl::DataLossError(
          absl::StrCat("checkpoint manifest ", manifest_path, ": missing (", read.message(), ")"));
    }
    return UnreadableFileError(read.message());
  }
  Json m = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  auto bad_manifest = [&](const std::string& what) {
    return absl::DataLossError(absl::StrCat("checkpoint manifest ", manifest_path, ": ", what));
  };
  if (m.is_discarded() || !m.is_object()) return bad_manifest("not valid JSON");
  // This build's rule: the CRC-32 of the manifest's text without the checksum (Commit).
  const auto checksum_verifies = [](Json manifest) {
    const Json recorded = manifest[kManifestChecksum];
    manifest.erase(kManifestChecksum);
    const std::string body = manifest.dump(1);
    return recorded.is_number_unsigned() &&
           recorded.get<uint64_t>() == Crc32(0, body.data(), body.size());
  };
  const bool has_checksum =
      m.contains(kManifestChecksum);  // (manifests written before it have none)
  // A newer version before the checksum: its manifest may compute its checksum otherwise, and it
  // is no damage (this build is older than the checkpoint: an older checkpoint would be no
  // better). Unless the checksum verifies with this build's version in its place: then the version
  // is what was damaged (a newer furnace's manifest names its own version, under whatever rule).
  if (const auto version = m.find("version"); version != m.end() && version->is_number_unsigned() &&
                                              version->get<uint64_t>() > kCheckpointVersion) {
    const uint64_t read = version->get<uint64_t>();
    Json as_ours = m;
    as_ours["version"] = kCheckpointVersion;
    if (has_checksum && checksum_verifies(as_ours)) {
      return bad_manifest(absl::StrCat("checksum mismatch: its version reads ", read,
                                       ", and the checksum verifies with version ",
                                       kCheckpointVersion,
                                       " in its place (the version was damaged)"));
    }
    return NewerVersionError(absl::StrCat("checkpoint manifest ", manifest_path), read);
  }
  if (has_checksum && !checksum_verifies(m)) {
    return bad_manifest("checksum mismatch (the manifest was changed or damaged)");
  }
  for (const char* key : {"version", "step", "data_position", "seed", "num_shards", "num_params",
                          "shards", "params"}) {
    if (!m.contains(key)) return bad_manifest(absl::StrCat("missing \"", key, "\""));
  }
  CheckpointManifest out;
  out.path = step_dir;
  try {  // nlohmann's typed getters throw on a type mismatch: caught here, never escapes
    if (Integer<uint32_t>(m["version"]) != kCheckpointVersion) {
      return bad_manifest(absl::StrCat("unsupported version ", m["version"].dump()));
    }
    out.step = Integer<int64_t>(m["step"]);
    out.data_position = Integer<int64_t>(m["data_position"]);
    out.seed = Integer<uint64_t>(m["seed"]);
    if (m.contains("data")) {
      const Json& d = m["data"];
      out.data.order = d.at("order").get<std::string>();
      out.data.sequences = Integer<int64_t>(d.at("sequences"));
      out.data.epoch = Integer<int64_t>(d.at("epoch"));
      out.data.index_in_epoch = Integer<int64_t>(d.at("index_in_epoch"));
      out.data.epoch_sequences = Integer<int64_t>(d.at("epoch_sequences"));
      if (d.contains("datasets")) {
        for (const Json& e : d.at("datasets")) {
          out.data.datasets.push_back(
              {.path = e.at("path").get<std::string>(),
               .epoch = Integer<int64_t>(e.at("epoch")),
               .index_in_epoch = Integer<int64_t>(e.at("index_in_epoch")),
               .epoch_sequences = Integer<int64_t>(e.at("epoch_sequences"))});
        }
      }
    }
    if (m.contains("settings")) {
      const Json& settings = m["settings"];
      if (!settings.is_object()) return bad_manifest("\"settings\" is not an object");
      for (const auto& [key, value] : settings.items()) {
        out.settings[key] = value.get<std::string>();
      }
    }
    if (m.contains("job")) out.job = m["job"].get<std::string>();
    out.num_shards = Integer<int>(m["num_shards"]);
    const int64_t n = Integer<int64_t>(m["num_params"]);
    if (out.step != step) {
      return bad_manifest(
          absl::StrCat("says step ", out.step, " inside the directory of step ", step));
    }
    if (out.num_shards <= 0 || m["shards"].size() != static_cast<size_t>(out.num_shards)) {
      return bad_manifest(absl::StrCat("has ", m["shards"].size(), " shards of ", out.num_shards));
    }
    std::vector<ParamInfo> top_level;
    bool top_level_read = false;
    for (const Json& e : m["shards"]) {
      ShardRecord record = RecordFromJson(e);
      if (record.n < 0) {  // a single rank's: the top-level size and parameters
        if (!top_level_read) {
          top_level = ParamsFromJson(m["params"]);
          top_level_read = true;
        }
        record.n = n;
        record.params = top_level;
      }
      if (record.n < 0 || record.n > INT64_MAX / 2 - out.values_in_all_shards) {
        return bad_manifest(absl::StrCat("bad shard size ", record.n));
      }
      out.values_in_all_shards += record.n;
      // A name in the step's directory: not a path, not the directory or its parent.
      if (record.file.find('/') != std::string::npos || record.file.empty() || record.file == "." ||
          record.file == "..") {
        return bad_manifest(absl::StrCat("bad shard file name \"", record.file, "\""));
      }
      // (Checked by division: the product of a crafted n can wrap around to the bytes given.)
      const uint64_t per_value = 3 * sizeof(float);
      const bool sized =
          record.bytes >= kShardHeaderBytes &&
          (record.bytes - kShardHeaderBytes) % per_value == 0 &&
          (record.bytes - kShardHeaderBytes) / per_value == static_cast<uint64_t>(record.n);
      if (!sized) {
        return bad_manifest(absl::StrCat("shard ", record.file, ": bytes ", record.bytes,
                                         " do not match ", record.n, " params (", kShardHeaderBytes,
                                         " + 12 bytes a param)"));
      }
      for (const ParamInfo& p : record.params) {
        absl::StatusOr<std::vector<int64_t>> whole = ParamGlobalShape(p);
        if (!whole.ok()) {
          return bad_manifest(absl::StrCat("shard ", record.file, ": parameter ", p.name, ": ",
                                           whole.status().message()));
        }
        const int64_t numel = SaturatingNumel(p.shape);
        if (p.offset < 0 || numel > record.n || p.offset > record.n - numel) {
          return bad_manifest(absl::StrCat("shard ", record.file, ": parameter ", p.name, " [",
                                           p.offset, ", +", numel, ") lies outside its ", record.n,
                                           " stored values"));
        }
      }
      out.shards.push_back(std::move(record));
    }
  } catch (const Json::exception& e) {
    return bad_manifest(e.what());
  }
  return out;
}

absl::StatusOr<LoadedCheckpoint> CheckpointStore::ReadShard(const CheckpointManifest& manifest,
                                                            int shard, ShardParts parts) const {
  if (shard < 0 || shard >= manifest.num_shards) {
    return absl::FailedPreconditionError(absl::StrCat("checkpoint ", manifest.path,
                                                      " was written by ", manifest.num_shards,
                                                      " rank(s) and has no shard ", shard));
  }
  const ShardRecord& record = manifest.shards[static_cast<size_t>(shard)];
  const int64_t n = record.n;
  LoadedCheckpoint out;
  out.step = manifest.step;
  out.data_position = manifest.data_position;
  out.seed = manifest.seed;
  out.data = manifest.data;
  out.settings = manifest.settings;
  out.job = manifest.job;
  out.values_in_all_shards = manifest.values_in_all_shards;
  out.params = record.params;

  const std::string shard_path = (fs::path(manifest.path) / record.file).string();
  std::error_code ec;
  const uint64_t actual = fs::file_size(shard_path, ec);
  if (ec == std::errc::no_such_file_or_directory) {
    return absl::DataLossError(
        absl::StrCat("checkpoint shard ", shard_path, ": missing (", ec.message(), ")"));
  }
  if (ec) return UnreadableFileError(absl::StrCat("checkpoint shard ", shard_path), ec.value());
  if (actual != record.bytes) {
    return absl::DataLossError(absl::StrCat("checkpoint shard ", shard_path, ": ",
                                            actual < record.bytes ? "truncated" : "too long", ": ",
                                            actual, " bytes, the manifest says ", record.bytes));
  }
  std::FILE* f = std::fopen(shard_path.c_str(), "rb");
  if (f == nullptr) {
    if (errno == ENOENT) {
      return absl::DataLossError(
          absl::StrCat("checkpoint shard ", shard_path, ": cannot open: ", std::strerror(errno)));
    }
    return UnreadableFileError(absl::StrCat("checkpoint shard ", shard_path), errno);
  }
  uint32_t crc = 0;
  unsigned char header[kShardHeaderBytes];
  const size_t array_bytes = static_cast<size_t>(n) * sizeof(float);
  out.param_data.resize(static_cast<size_t>(n));
  absl::Status read = ReadExact(f, shard_path, header, sizeof(header), &crc);
  if (read.ok()) read = ReadExact(f, shard_path, out.param_data.data(), array_bytes, &crc);
  if (parts == ShardParts::kAll) {
    out.m.resize(static_cast<size_t>(n));
    out.v.resize(static_cast<size_t>(n));
    if (read.ok()) read = ReadExact(f, shard_path, out.m.data(), array_bytes, &crc);
    if (read.ok()) read = ReadExact(f, shard_path, out.v.data(), array_bytes, &crc);
  } else {
    // The moments through the checksum only, a block at a time.
    std::vector<char> block(size_t{4} << 20);
    for (size_t left = 2 * array_bytes; read.ok() && left > 0;) {
      const size_t take = std::min(left, block.size());
      read = ReadExact(f, shard_path, block.data(), take, &crc);
      left -= take;
    }
  }
  std::fclose(f);
  RETURN_IF_ERROR(read);
  if (crc != record.crc32) {
    return absl::DataLossError(absl::StrFormat(
        "checkpoint shard %s: checksum mismatch: crc32 0x%08x, the manifest says 0x%08x "
        "(the file is corrupted)",
        shard_path, crc, record.crc32));
  }
  auto bad_shard = [&](const std::string& what) {
    return absl::DataLossError(absl::StrCat("checkpoint shard ", shard_path, ": ", what));
  };
  if (std::memcmp(header, kShardMagic, 8) != 0) return bad_shard("bad magic");
  if (Get<uint32_t>(header + 8) != kCheckpointVersion) {
    // (The manifest was this version's: a shard of another one under it is damage.)
    return bad_shard(absl::StrCat("unsupported version ", Get<uint32_t>(header + 8)));
  }
  if (Get<uint32_t>(header + 12) != static_cast<uint32_t>(shard) ||
      Get<uint32_t>(header + 16) != static_cast<uint32_t>(manifest.num_shards) ||
      Get<int64_t>(header + 24) != out.step || Get<int64_t>(header + 32) != out.data_position ||
      Get<uint64_t>(header + 40) != out.seed || Get<int64_t>(header + 48) != n) {
    return bad_shard(
        "header disagrees with the manifest (shard, step, data position, seed or size)");
  }
  out.path = manifest.path;
  out.num_shards = manifest.num_shards;
  return out;
}

absl::StatusOr<std::vector<int64_t>> ParamGlobalShape(const ParamInfo& p) {
  for (int64_t d : p.shape) {
    if (d < 0) return absl::DataLossError(absl::StrCat("negative shape ", ShapeText(p.shape)));
  }
  if (!p.shard.sharded()) return p.shape;
  const ParamShard& s = p.shard;
  const std::string what = absl::StrCat("local shape ", ShapeText(p.shape), ", a part of ",
                                        ShapeText(s.global_shape), " along dim ", s.dim);
  auto bad = [&](absl::string_view why) {
    return absl::DataLossError(absl::StrCat(what, ": ", why));
  };
  if (s.global_shape.size() != p.shape.size()) return bad("the ranks differ");
  if (s.dim < 0 || static_cast<size_t>(s.dim) >= p.shape.size()) return bad("no such dim");
  for (size_t d = 0; d < p.shape.size(); ++d) {
    if (static_cast<int>(d) != s.dim && p.shape[d] != s.global_shape[d]) {
      return bad(absl::StrCat("dim ", d, " is not whole"));
    }
  }
  int64_t held = 0;
  for (const auto& [begin, end] : s.ranges) {
    if (begin < 0 || end < begin || end > s.global_shape[s.dim]) {
      return bad(absl::StrCat("range [", begin, ", ", end, ") lies outside [0, ",
                              s.global_shape[s.dim], ")"));
    }
    held += end - begin;
  }
  if (held != p.shape[s.dim]) {
    return bad(
        absl::StrCat("the ranges hold ", held, " of dim ", s.dim, ", the shape ", p.shape[s.dim]));
  }
  return s.global_shape;
}

}  // namespace furnace::train
