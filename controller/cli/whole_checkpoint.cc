#include "controller/cli/whole_checkpoint.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <optional>
#include <tuple>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "controller/cli/exit_codes.h"
#include "controller/cli/format.h"
#include "runtime/base/status.h"

namespace furnace::cli {
namespace {

namespace fs = std::filesystem;

using train::ShapeText;

// The element count of `shape` (dims >= 0), saturating at INT64_MAX: shapes come from a manifest,
// which no checksum protects.
int64_t Numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d != 0 && n > INT64_MAX / d) return INT64_MAX;
    n *= d;
  }
  return n;
}

// The coordinates of flat element `i` of a tensor of `shape` (row-major), as "[r, c]".
std::string CoordText(int64_t i, const std::vector<int64_t>& shape) {
  std::vector<int64_t> coord(shape.size());
  for (size_t d = shape.size(); d-- > 0;) {
    coord[d] = shape[d] > 0 ? i % shape[d] : 0;
    i = shape[d] > 0 ? i / shape[d] : 0;
  }
  return ShapeText(coord);
}

// |a - b| relative to the larger magnitude (NaN when either is NaN).
double RelativeDifference(float a, float b) {
  const double scale =
      std::max(std::fabs(static_cast<double>(a)), std::fabs(static_cast<double>(b)));
  const double diff = std::fabs(static_cast<double>(a) - b);
  return scale > 0 ? diff / scale : diff;
}

// Equal bit for bit (NaNs included) or within the relative tolerance.
bool SameValue(float a, float b) {
  return std::memcmp(&a, &b, sizeof(float)) == 0 ||
         RelativeDifference(a, b) <= TensorAssembler::kReplicaTolerance;
}

// Sort key of the single-process parameter order (runtime/model/param_layout.cc): wte, wpe, the
// layers in order, names the model does not use, lnf. Inside a layer, tensors keep the order in
// which their name pattern (the name with an expert index replaced) first appeared, experts of
// one pattern by index: the order a single process lists them, since every rank holding a layer
// lists its tensors in that order and its experts in ascending runs.
struct OrderKey {
  int section = 0;
  int64_t layer = -1;
  size_t pattern = 0;
  int64_t expert = -1;
  bool operator<(const OrderKey& o) const {
    return std::tie(section, layer, pattern, expert) <
           std::tie(o.section, o.layer, o.pattern, o.expert);
  }
};

// "layers.3.moe.experts.5.w1" -> 3; -1 when the name does not start with "layers.<n>.".
int64_t LayerOf(absl::string_view name) {
  if (!absl::ConsumePrefix(&name, "layers.")) return -1;
  const size_t dot = name.find('.');
  int64_t layer;
  if (dot == absl::string_view::npos || !absl::SimpleAtoi(name.substr(0, dot), &layer)) return -1;
  return layer;
}

// "...experts.5.w1" -> {"...experts.*.w1", 5}; other names -> {name, -1}.
std::pair<std::string, int64_t> ExpertPattern(const std::string& name) {
  constexpr char kExperts[] = ".experts.";
  const size_t at = name.find(kExperts);
  if (at == std::string::npos) return {name, -1};
  const size_t first = at + sizeof(kExperts) - 1;
  const size_t dot = name.find('.', first);
  int64_t expert;
  if (dot == std::string::npos ||
      !absl::SimpleAtoi(absl::string_view(name).substr(first, dot - first), &expert)) {
    return {name, -1};
  }
  return {absl::StrCat(name.substr(0, first), "*", name.substr(dot)), expert};
}

std::vector<OrderKey> OrderKeys(const std::vector<std::string>& names) {
  std::map<std::string, size_t> pattern_seen;
  std::vector<OrderKey> keys;
  for (const std::string& name : names) {
    OrderKey k;
    auto [pattern, expert] = ExpertPattern(name);
    k.pattern = pattern_seen.emplace(pattern, pattern_seen.size()).first->second;
    k.expert = expert;
    k.layer = LayerOf(name);
    if (name == "wte") {
      k.section = 0;
    } else if (name == "wpe") {
      k.section = 1;
    } else if (k.layer >= 0) {
      k.section = 2;
    } else if (absl::StartsWith(name, "lnf.")) {
      k.section = 4;
    } else {
      k.section = 3;
    }
    keys.push_back(k);
  }
  return keys;
}

// Reassembles the checkpoint whose shard 0 is `first`, loading its other shards one at a time
// (each is dropped once placed: the whole tensors plus one shard are in memory at a time).
absl::StatusOr<WholeCheckpoint> Reassemble(const train::CheckpointStore& store,
                                           train::LoadedCheckpoint first) {
  WholeCheckpoint out;
  out.step = first.step;
  out.seed = first.seed;
  out.path = first.path;
  out.job = first.job;
  out.skipped = std::move(first.skipped);
  out.num_shards = first.num_shards;
  TensorAssembler assembler(absl::StrCat("checkpoint ", first.path), first.values_in_all_shards);
  RETURN_IF_ERROR(assembler.AddShard(0, first.params, first.param_data.data(),
                                     static_cast<int64_t>(first.param_data.size())));
  first = train::LoadedCheckpoint();
  for (int shard = 1; shard < out.num_shards; ++shard) {
    ASSIGN_OR_RETURN(const train::LoadedCheckpoint part,
                     store.Load(out.step, shard, train::ShardParts::kParams));
    RETURN_IF_ERROR(assembler.AddShard(shard, part.params, part.param_data.data(),
                                       static_cast<int64_t>(part.param_data.size())));
  }
  ASSIGN_OR_RETURN(out.tensors, assembler.Finish());
  out.warnings = assembler.warnings();
  return out;
}

std::string NoCheckpointYet(const v1::JobDetail& job, const std::string& why) {
  const v1::JobSummary& s = job.summary();
  const v1::CheckpointSpec& checkpoint = job.spec().checkpoint();
  const std::string every = checkpoint.every_auto()  ? "auto (from the failure rate)"
                            : checkpoint.every() > 0 ? absl::StrCat(checkpoint.every(), " steps")
                                                     : "0: only at the end";
  return absl::StrCat("job ", s.job_id(), " has no checkpoint yet: ", why, " (job ",
                      StateName(s.state()), " at step ", FormatProgress(s.step(), s.total_steps()),
                      "; checkpoint.every ", every, ")");
}

// Whether a step whose manifest names `writer` is job `id`'s: a step that names no writer (written
// before manifests recorded it) is taken as the job's, as it was before.
bool WrittenBy(const std::string& writer, const std::string& id) {
  return writer.empty() || writer == id;
}

absl::StatusOr<WholeCheckpoint> LoadFrom(const v1::JobDetail& job, const std::string& dir,
                                         int64_t step, const char* command) {
  const std::string& id = job.summary().job_id();
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    return LocalError(absl::NotFoundError(NoCheckpointYet(
        job, absl::StrCat("the checkpoint directory ", dir, " does not exist on this machine (",
                          command, " reads it directly: run it where the directory is visible)"))));
  }
  const train::CheckpointStore store(dir, /*keep=*/0);
  if (step < 0) {
    absl::StatusOr<WholeCheckpoint> loaded = LoadLatestWholeCheckpoint(store);
    if (absl::IsNotFound(loaded.status()) && store.CommittedSteps().empty()) {
      return LocalError(absl::NotFoundError(
          NoCheckpointYet(job, absl::StrCat("no committed checkpoint in ", dir))));
    }
    if (!loaded.ok()) return LocalError(loaded.status());
    if (WrittenBy(loaded->job, id)) return loaded;
    // A directory several jobs wrote in turn (a later job named this one's checkpoint.dir once
    // it had ended): the newest step this job wrote, passing over the later job's.
    absl::StatusOr<std::vector<int64_t>> listed = store.ListCommittedSteps();
    if (!listed.ok()) return LocalError(listed.status());
    for (auto it = listed->rbegin(); it != listed->rend(); ++it) {
      if (*it >= loaded->step) continue;
      absl::StatusOr<train::CheckpointManifest> manifest = store.ReadManifest(*it);
      if (!manifest.ok()) continue;  // a damaged older step: not this job's to judge
      if (!WrittenBy(manifest->job, id)) continue;
      absl::StatusOr<WholeCheckpoint> own = LoadWholeCheckpoint(store, *it);
      if (!own.ok()) return LocalError(own.status());
      own->skipped.insert(
          own->skipped.begin(),
          absl::StrCat("steps after ", *it, " in ", dir, " (the newest, ", loaded->step,
                       ") were written by job ", loaded->job, ", not ", id));
      return own;
    }
    return LocalError(absl::NotFoundError(absl::StrCat(
        "job ", id, " has no checkpoint of its own in ", dir, ": its newest committed step, ",
        loaded->step, ", was written by job ", loaded->job, " (the directory was used by both; ",
        command, " that job's instead: furnace ", command, " ", loaded->job, ")")));
  }
  // A directory that cannot be listed is said as such, not as "none yet".
  absl::StatusOr<std::vector<int64_t>> listed = store.ListCommittedSteps();
  if (!listed.ok()) return LocalError(listed.status());
  const std::vector<int64_t> committed = *std::move(listed);
  if (std::find(committed.begin(), committed.end(), step) == committed.end()) {
    return LocalError(absl::NotFoundError(absl::StrCat(
        "job ", id, " has no committed checkpoint at step ", step, " in ", dir,
        " (committed: ", committed.empty() ? "none yet" : absl::StrJoin(committed, ", "), ")")));
  }
  absl::StatusOr<WholeCheckpoint> loaded = LoadWholeCheckpoint(store, step);
  if (!loaded.ok()) return LocalError(loaded.status());
  if (!WrittenBy(loaded->job, id)) {
    return LocalError(absl::NotFoundError(
        absl::StrCat("step ", step, " in ", dir, " was written by job ", loaded->job, ", not ", id,
                     " (the directory was used by both): furnace ", command, " ", loaded->job,
                     " --step ", step)));
  }
  return loaded;
}

// LoadLatestWholeCheckpoint's one read: from LATEST back past damaged steps.
absl::StatusOr<WholeCheckpoint> LoadNewestVerified(const train::CheckpointStore& store) {
  // The loader picks the newest step whose shard 0 verifies; a step whose other shards do not is
  // passed over here the same way, for the next older committed one.
  ASSIGN_OR_RETURN(train::LoadedCheckpoint first, store.LoadLatest(0, train::ShardParts::kParams));
  std::vector<std::string> skipped = std::move(first.skipped);
  int64_t step = first.step;
  absl::StatusOr<WholeCheckpoint> whole = Reassemble(store, std::move(first));
  while (!whole.ok()) {
    // Only damage passes a step over: a shard that could not be read (or another version) would
    // make the export an older step's without saying why it is not the newest.
    if (!train::IsDamage(whole.status())) return whole.status();
    skipped.push_back(std::string(whole.status().message()));
    ASSIGN_OR_RETURN(const std::vector<int64_t> committed, store.ListCommittedSteps());
    const auto older = std::lower_bound(committed.begin(), committed.end(), step);
    if (older == committed.begin()) {
      return absl::DataLossError(absl::StrCat("checkpoint: no usable checkpoint in ", store.dir(),
                                              ":\n  ", absl::StrJoin(skipped, "\n  ")));
    }
    step = *std::prev(older);
    absl::StatusOr<train::LoadedCheckpoint> next = store.Load(step, 0, train::ShardParts::kParams);
    whole = next.ok() ? Reassemble(store, *std::move(next)) : next.status();
  }
  whole->skipped.insert(whole->skipped.begin(), skipped.begin(), skipped.end());
  return whole;
}

}  // namespace

int64_t WholeCheckpoint::num_params() const {
  int64_t n = 0;
  for (const WholeTensor& t : tensors) n += static_cast<int64_t>(t.data.size());
  return n;
}

absl::Status TensorAssembler::AddShard(int shard, const std::vector<train::ParamInfo>& params,
                                       const float* data, int64_t n) {
  for (const train::ParamInfo& p : params) {
    const std::string where = absl::StrCat(where_, ", shard ", shard, ": parameter ", p.name);
    absl::StatusOr<std::vector<int64_t>> global = train::ParamGlobalShape(p);
    if (!global.ok()) {
      return absl::DataLossError(absl::StrCat(where, ": ", global.status().message()));
    }
    const int64_t numel = Numel(p.shape);
    if (p.offset < 0 || numel > n || p.offset > n - numel) {
      return absl::DataLossError(absl::StrCat(where, " [", p.offset, ", +", numel,
                                              ") lies outside the ", n, " stored values"));
    }
    // Every element of a tensor is on some shard, so none holds more than the shards together.
    if (Numel(*global) > max_elements_) {
      return absl::DataLossError(absl::StrCat(where, ": the whole tensor ", ShapeText(*global),
                                              " has more elements than all shards store (",
                                              max_elements_, ")"));
    }
    auto [it, inserted] = index_.emplace(p.name, slots_.size());
    if (inserted) {
      Slot slot;
      slot.tensor.name = p.name;
      slot.tensor.shape = *global;
      slot.tensor.data.assign(static_cast<size_t>(Numel(*global)), 0.0f);
      slot.covered.assign(slot.tensor.data.size(), false);
      slot.first_shard = shard;
      slots_.push_back(std::move(slot));
    }
    Slot& slot = slots_[it->second];
    if (slot.tensor.shape != *global) {
      return absl::DataLossError(absl::StrCat(where, ": the whole tensor is ", ShapeText(*global),
                                              " here but ", ShapeText(slot.tensor.shape),
                                              " on shard ", slot.first_shard));
    }
    int64_t differ = 0, overlap = 0, worst_at = 0;
    double worst = 0;
    const float* local = data + p.offset;
    for (int64_t i = 0; i < numel; ++i) {
      const auto g = static_cast<size_t>(p.GlobalIndex(i));
      if (!slot.covered[g]) {
        slot.covered[g] = true;
        slot.tensor.data[g] = local[i];
        continue;
      }
      ++overlap;
      if (SameValue(slot.tensor.data[g], local[i])) continue;
      const double rel = RelativeDifference(slot.tensor.data[g], local[i]);
      if (differ == 0 || rel > worst || std::isnan(rel)) {
        worst = rel;
        worst_at = static_cast<int64_t>(g);
      }
      ++differ;
    }
    if (differ > 0) {
      warnings_.push_back(absl::StrCat(
          where_, ": replicas of ", p.name, " disagree: shard ", shard, "'s copy differs in ",
          differ, " of ", overlap, " shared elements by more than ", kReplicaTolerance,
          " relative (the most, ", worst, ", at ", CoordText(worst_at, slot.tensor.shape),
          "); kept the copy read first"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<WholeTensor>> TensorAssembler::Finish() {
  std::vector<std::string> names;
  for (const Slot& slot : slots_) {
    const int64_t missing = std::count(slot.covered.begin(), slot.covered.end(), false);
    if (missing > 0) {
      const auto first = std::find(slot.covered.begin(), slot.covered.end(), false);
      return absl::DataLossError(absl::StrCat(
          where_, ": tensor ", slot.tensor.name, " ", ShapeText(slot.tensor.shape), ": ", missing,
          " of ", slot.covered.size(), " elements are on no shard (the first at ",
          CoordText(first - slot.covered.begin(), slot.tensor.shape), ")"));
    }
    names.push_back(slot.tensor.name);
  }
  const std::vector<OrderKey> keys = OrderKeys(names);
  std::vector<size_t> order(slots_.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return keys[a] < keys[b]; });
  std::vector<WholeTensor> out;
  out.reserve(order.size());
  for (size_t i : order) out.push_back(std::move(slots_[i].tensor));
  slots_.clear();
  index_.clear();
  return out;
}

absl::StatusOr<WholeCheckpoint> LoadWholeCheckpoint(const train::CheckpointStore& store,
                                                    int64_t step) {
  ASSIGN_OR_RETURN(train::LoadedCheckpoint first, store.Load(step, 0, train::ShardParts::kParams));
  return Reassemble(store, std::move(first));
}

absl::StatusOr<WholeCheckpoint> LoadLatestWholeCheckpoint(const train::CheckpointStore& store) {
  // Enough for any job that checkpoints less often than a read takes; a job that commits faster
  // than its checkpoint can be read (and keeps too few to read an older one) gets the error.
  constexpr int kMaxRereads = 20;
  absl::StatusOr<std::optional<int64_t>> before = store.LatestStep();
  for (int reread = 0;; ++reread) {
    absl::StatusOr<WholeCheckpoint> whole = LoadNewestVerified(store);
    if (whole.ok() || !before.ok() || reread == kMaxRereads) return whole;
    absl::StatusOr<std::optional<int64_t>> after = store.LatestStep();
    const bool moved =
        after.ok() && after->has_value() && (!before->has_value() || **after > **before);
    if (!moved) return whole;
    before = std::move(after);
  }
}

absl::StatusOr<WholeCheckpoint> LoadJobCheckpoint(const v1::JobDetail& job, int64_t step,
                                                  const char* command) {
  const std::string& dir = job.spec().checkpoint().dir();
  if (dir.empty()) {
    return LocalError(absl::FailedPreconditionError(absl::StrCat(
        "job ", job.summary().job_id(),
        " has no checkpoint directory (spec.checkpoint.dir is empty",
        job.summary().kind().empty() ? ""
                                     : absl::StrCat("; it is a ", job.summary().kind(), " job"),
        "): nothing to ", command)));
  }
  return LoadFrom(job, dir, step, command);
}

}  // namespace furnace::cli
