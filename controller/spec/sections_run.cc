// Sections describing how the job runs: train, data, checkpoint, recovery, resources, commcheck,
// fault.
#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/str_cat.h"
#include "controller/spec/scalars.h"
#include "controller/spec/sections.h"

namespace furnace::spec {
namespace {

uint32_t U32(std::optional<uint64_t> v, uint32_t fallback) {
  return v ? static_cast<uint32_t>(*v) : fallback;
}

constexpr uint64_t kKiB = 1024;
constexpr uint64_t kMiB = 1024 * kKiB;
constexpr uint64_t kGiB = 1024 * kMiB;
// checkpoint.stop_grace_s when the file leaves it out: a step and a checkpoint of most jobs.
constexpr double kDefaultCheckpointStopGraceS = 30;

}  // namespace

void ReadTrain(MapReader& s, furnace::v1::TrainSpec* out) {
  out->set_steps(U32(s.Integer("steps", 1, kMaxU32), 100));
  out->set_lr(s.Number("lr", Above(0)).value_or(3e-4));
  // Upper bound (lr) is a cross-field check.
  out->set_min_lr(s.Number("min_lr", AtLeast(0)).value_or(0.1 * out->lr()));
  // Upper bound (steps) is a cross-field check.
  out->set_warmup(U32(s.Integer("warmup", 0, kMaxU32), 0));
  out->set_schedule(s.Enum("schedule", {"cosine", "constant"}).value_or("cosine"));
  out->set_clip(s.Number("clip", AtLeast(0)).value_or(1.0));
  out->set_seed(s.Integer("seed", 0, kMaxU64).value_or(0));
  out->set_weight_decay(s.Number("weight_decay", AtLeast(0)).value_or(0.1));
  s.ReportUnknownKeys();
}

void ReadData(MapReader& s, furnace::v1::DataSpec* out) {
  out->set_source(s.Enum("source", {"markov", "tokens", "indexed"}).value_or("markov"));
  // Required iff source is tokens or indexed (or a blend instead): cross-field checks.
  out->set_path(s.String("path").value_or(""));
  out->set_seed(s.Integer("seed", 0, kMaxU64).value_or(0));
  // `byte` or a SentencePiece model path; checked against the token file by the worker.
  out->set_tokenizer(s.String("tokenizer").value_or(""));
  if (auto blend = s.SectionList("blend")) {
    for (MapReader& b : *blend) {
      furnace::v1::DataBlendSpec* entry = out->add_blend();
      entry->set_path(b.String("path").value_or(""));
      entry->set_weight(b.Number("weight", Above(0)).value_or(1.0));
      b.ReportUnknownKeys();
    }
  }
  MapReader validation = s.Section("validation");
  furnace::v1::DataValidationSpec* v = out->mutable_validation();
  v->set_fraction(validation.Number("fraction", NumberRange{.min = 0, .min_open = true, .max = 0.5})
                      .value_or(0));
  v->set_path(validation.String("path").value_or(""));
  validation.ReportUnknownKeys();
  if (v->fraction() == 0 && v->path().empty()) out->clear_validation();
  s.ReportUnknownKeys();
}

void ReadEval(MapReader& s, furnace::v1::EvalSpec* out) {
  out->set_every(U32(s.Integer("every", 0, kMaxU32), 0));
  // Required (>= 1) when every > 0: a cross-field check.
  out->set_batches(U32(s.Integer("batches", 1, kMaxCount), 0));
  s.ReportUnknownKeys();
}

void ReadCheckpoint(MapReader& s, furnace::v1::CheckpointSpec* out) {
  out->set_dir(s.String("dir").value_or(""));
  // `every: auto`: Young/Daly from the measured stall and the observed failures (every_auto).
  bool every_auto = false;
  out->set_every(U32(s.IntegerOrWord("every", 0, kMaxU32, "auto", &every_auto), 0));
  out->set_every_auto(every_auto);
  out->set_keep(U32(s.Integer("keep", 1, kMaxCount), 2));
  out->set_async(s.Bool("async").value_or(false));
  out->set_override_settings(s.Bool("override_settings").value_or(false));
  // A cancel or a drain lets the ranks checkpoint the step in progress this long; 0: at once.
  out->set_stop_grace_s(
      s.Number("stop_grace_s", Between(0, 3600)).value_or(kDefaultCheckpointStopGraceS));
  s.ReportUnknownKeys();
}

void ReadRecovery(MapReader& s, furnace::v1::RecoverySpec* out) {
  out->set_max_restarts(U32(s.Integer("max_restarts", 0, kMaxU32), 3));
  MapReader backoff = s.Section("backoff");
  furnace::v1::BackoffSpec* b = out->mutable_backoff();
  b->set_initial_s(backoff.Number("initial_s", Seconds()).value_or(1.0));
  // Lower bound (initial_s) is a cross-field check.
  b->set_max_s(backoff.Number("max_s", Seconds()).value_or(30.0));
  b->set_multiplier(backoff.Number("multiplier", AtLeast(1)).value_or(2.0));
  backoff.ReportUnknownKeys();
  // Not given: the controller's --worker-timeout (0); given, it is the limit for the job's workers
  // either way (at least twice the heartbeat interval: checked at submit).
  out->set_heartbeat_timeout_s(s.Number("heartbeat_timeout_s", Seconds()).value_or(0.0));
  out->set_hang_timeout_s(s.Number("hang_timeout_s", Seconds()).value_or(60.0));
  out->set_start_timeout_s(s.Number("start_timeout_s", Seconds()).value_or(60.0));
  out->set_max_attempts_without_progress(
      U32(s.Integer("max_attempts_without_progress", 0, kMaxU32), 3));
  // A rank stuck in the check must be found by the check, not by the hang watchdog first (upper
  // bound: a cross-field check); the default leaves it room.
  out->set_health_check_s(s.Number("health_check_s", Seconds(/*zero_ok=*/true))
                              .value_or(std::min(10.0, out->hang_timeout_s() / 2)));
  out->set_exclude_s(s.Number("exclude_s", Seconds(/*zero_ok=*/true)).value_or(300.0));
  out->set_wait_for_workers_s(
      s.Number("wait_for_workers_s", Seconds(/*zero_ok=*/true)).value_or(300.0));
  // Sizes left out are the job's own: ResolveShrink fills them once parallel is read.
  if (auto layouts = s.SectionList("shrink")) {
    for (MapReader& l : *layouts) {
      furnace::v1::LayoutSpec* layout = out->add_shrink();
      layout->set_pp(U32(l.Integer("pp", 1, kMaxCount), 0));
      layout->set_dp(U32(l.Integer("dp", 1, kMaxCount), 0));
      layout->set_tp(U32(l.Integer("tp", 1, kMaxCount), 0));
      layout->set_ep(U32(l.Integer("ep", 1, kMaxCount), 0));
      layout->set_esp(U32(l.Integer("esp", 1, kMaxCount), 0));
      l.ReportUnknownKeys();
    }
  }
  s.ReportUnknownKeys();
}

void ResolveShrink(const furnace::v1::ParallelSpec& parallel, furnace::v1::RecoverySpec* out) {
  for (furnace::v1::LayoutSpec& l : *out->mutable_shrink()) {
    if (l.pp() == 0) l.set_pp(parallel.pp());
    if (l.dp() == 0) l.set_dp(parallel.dp());
    if (l.tp() == 0) l.set_tp(parallel.tp());
    if (l.ep() == 0) l.set_ep(parallel.ep());
    if (l.esp() == 0) l.set_esp(parallel.esp());
  }
}

// resources.time_limit_s: a year (0: none).
constexpr double kMaxTimeLimitS = 366.0 * 24 * 3600;

void ReadResources(MapReader& s, furnace::v1::ResourcesSpec* out) {
  out->set_workers(U32(s.Integer("workers", 1, kMaxU32), 0));
  out->set_device(s.Enum("device", {"cpu", "cuda", "emulated"}).value_or("cpu"));
  // Present only when the file says (0 included): a left-out limit is the controller's to fill in.
  if (const std::optional<double> limit = s.Number("time_limit_s", Between(0, kMaxTimeLimitS))) {
    out->set_time_limit_s(*limit);
  }
  s.ReportUnknownKeys();
}

void ReadCommcheck(MapReader& s, furnace::v1::CommcheckSpec* out) {
  // Sizes are float32 element counts on the wire, hence multiples of 4.
  for (const char* key : {"min_bytes", "max_bytes"}) {
    const uint64_t fallback = std::string_view(key) == "min_bytes" ? 4 * kKiB : 4 * kMiB;
    uint64_t bytes = fallback;
    if (const std::optional<uint64_t> given = s.Size(key, 4, kGiB); given) {
      if (*given % 4 == 0) {
        bytes = *given;
      } else {
        s.Report(key, Problem{"must be a multiple of 4 bytes", absl::StrCat(*given),
                              "multiples of 4 in 4..1GiB"});
      }
    }
    if (std::string_view(key) == "min_bytes") {
      out->set_min_bytes(bytes);
    } else {
      out->set_max_bytes(bytes);
    }
  }
  out->set_step_factor(U32(s.Integer("step_factor", 2, kMaxU32), 4));
  out->set_iters(U32(s.Integer("iters", 1, kMaxU32), 5));
  out->set_warmup_iters(U32(s.Integer("warmup_iters", 0, kMaxU32), 1));
  std::vector<std::string> collectives =
      s.EnumList("collectives", {"allreduce", "allgather", "alltoall", "broadcast"})
          .value_or(std::vector<std::string>{"allreduce", "allgather", "alltoall", "broadcast"});
  for (const std::string& c : collectives) out->add_collectives(c);
  out->set_rounds(U32(s.Integer("rounds", 1, kMaxU32), 1));
  out->set_timeout_s(s.Number("timeout_s", Seconds()).value_or(30.0));
  s.ReportUnknownKeys();
}

void ReadFault(MapReader& s, furnace::v1::FaultSpec* out) {
  out->set_mode(s.Enum("mode", {"", "crash", "hang", "exit", "health_check"}).value_or(""));
  // Upper bound (world size) is a cross-field check.
  out->set_rank(static_cast<int32_t>(s.Integer("rank", 0, INT32_MAX).value_or(0)));
  out->set_at_step(U32(s.Integer("at_step", 0, kMaxU32), 0));
  out->set_every_attempt(s.Bool("every_attempt").value_or(false));
  out->set_exit_code(static_cast<int32_t>(s.Integer("exit_code", 1, 255).value_or(1)));
  out->set_worker(s.String("worker").value_or(""));
  // Exclusive with at_step and train jobs only: cross-field checks.
  out->set_mean_steps(U32(s.Integer("mean_steps", 0, kMaxU32), 0));
  s.ReportUnknownKeys();
}

}  // namespace furnace::spec
