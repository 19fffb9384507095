#include "worker/train_rank.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "kernels/blas.h"
#include "proto/furnace/v1/job_paths.h"
#include "runtime/base/clock.h"
#include "runtime/base/path_root.h"
#include "runtime/base/status.h"
#include "runtime/comm/communicator.h"
#include "runtime/comm/in_flight.h"
#include "runtime/data/data_sources.h"
#include "runtime/data/sampler.h"
#include "runtime/device/backend.h"
#include "runtime/device/current_stream.h"
#include "runtime/device/device.h"
#include "runtime/memory/codec.h"
#include "runtime/memory/copy_engine.h"
#include "runtime/memory/policy.h"
#include "runtime/model/declared_bytes.h"
#include "runtime/model/gpt_moe.h"
#include "runtime/tensor/arena.h"
#include "runtime/tensor/host_pool.h"
#include "runtime/train/moe_schedules.h"
#include "runtime/train/peak_flops.h"
#include "runtime/train/run_settings.h"
#include "runtime/train/trainer.h"
#include "spdlog/spdlog.h"
#include "worker/fault_schedule.h"
#include "worker/rank_device.h"
#include "worker/rank_exit.h"
#include "worker/rank_groups.h"
#include "worker/rank_stop_signal.h"
#include "worker/rank_watchdog.h"
#include "worker/step_telemetry.h"

namespace furnace::worker {
namespace {

// The job's data section as the data layer's config (runtime/data/data_sources.h).
data::DataSourceConfig DataSourceConfigFrom(const furnace::v1::DataSpec& spec, int64_t vocab) {
  data::DataSourceConfig d;
  d.source = spec.source();
  d.markov_seed = spec.seed();
  d.model_vocab = vocab;
  if (!spec.path().empty()) d.paths.push_back({spec.path(), 1.0});
  for (const furnace::v1::DataBlendSpec& b : spec.blend())
    d.paths.push_back({b.path(), b.weight()});
  d.tokenizer = spec.tokenizer();
  d.validation_fraction = spec.validation().fraction();
  if (!spec.validation().path().empty())
    d.validation_paths.push_back({spec.validation().path(), 1.0});
  return d;
}

model::ModelConfig ModelConfigFrom(const furnace::v1::JobSpec& spec) {
  model::ModelConfig c;
  c.vocab = static_cast<int>(spec.model().vocab());
  c.seq_len = static_cast<int>(spec.model().seq_len());
  c.d_model = static_cast<int>(spec.model().d_model());
  c.heads = static_cast<int>(spec.model().heads());
  c.layers = static_cast<int>(spec.model().layers());
  c.dense_ffn = static_cast<int>(spec.model().dense_ffn());
  c.moe_every = static_cast<int>(spec.model().moe_every());
  c.expert_ffn = static_cast<int>(spec.model().expert_ffn());
  c.recompute_attention_probs = spec.model().attention_probs() == "recomputed";
  c.experts = static_cast<int>(spec.moe().experts());
  c.top_k = static_cast<int>(spec.moe().top_k());
  c.capacity_factor = spec.moe().capacity_factor();
  c.normalize_topk = spec.moe().normalize_topk();
  c.aux_alpha = spec.moe().aux_alpha();
  c.spikes.probability = spec.moe().spikes().probability();
  c.spikes.max_ratio = spec.moe().spikes().max_ratio();
  c.spikes.seed = spec.moe().spikes().seed();
  return c;
}

train::TrainConfig TrainConfigFrom(const furnace::v1::JobSpec& spec, double peak_flops) {
  const auto& t = spec.train();
  train::TrainConfig c;
  c.steps = t.steps();
  c.micro_batches = static_cast<int>(spec.parallel().micro_batches());
  c.seed = t.seed();
  c.schedule.kind = t.schedule() == "constant" ? train::LrSchedule::Kind::kConstant
                                               : train::LrSchedule::Kind::kCosine;
  c.schedule.lr = t.lr();
  c.schedule.min_lr = t.min_lr();
  c.schedule.warmup_steps = t.warmup();
  c.schedule.max_steps = t.steps();
  c.adamw.weight_decay = t.weight_decay();
  c.clip = t.clip();
  c.peak_flops = peak_flops;
  c.checkpoint.dir = spec.checkpoint().dir();
  c.checkpoint.every = spec.checkpoint().every();
  c.checkpoint.keep = static_cast<int>(spec.checkpoint().keep());
  c.checkpoint.async = spec.checkpoint().async();
  c.model_settings = ModelConfigFrom(spec).RecordedSettings();
  c.override_checkpoint_settings = spec.checkpoint().override_settings();
  c.eval.every = spec.eval().every();
  c.eval.batches = static_cast<int>(spec.eval().batches());
  return c;
}

// Why this rank ends, for its last telemetry record and its exit code.
// What the MoE layers run and, under auto, why: the fit (calibrated or cached) and each
// schedule's predicted forward and backward time for the layers' shape. Rank 0 logs at info.
void LogMoeSchedules(const std::string& requested, const train::MoeScheduleChoice& choice,
                     const model::GptMoe& model, bool reporter) {
  const auto log = [reporter](const std::string& line) {
    if (reporter) {
      spdlog::info("{}", line);
    } else {
      spdlog::debug("{}", line);
    }
  };
  const std::vector<std::string> ran = model.MoeScheduleNames();
  if (ran.empty()) return;  // no MoE layer on this model
  const std::string ran_text = ran.front();
  if (!requested.empty() && requested != "auto" && requested != ran_text) {
    // s1 or s2 with tp 1: every schedule is the same computation.
    log(absl::StrCat("moe.schedule ", requested, ": tp 1, nothing to pause: the MoE layers run as ",
                     ran_text));
  }
  if (requested != "auto") {
    const moe::Schedule s = model.MoeSchedules().front();
    const bool sliced = model.SlicedExperts(s);
    log(absl::StrCat("moe schedule ", ran_text, " on every MoE layer; forward ",
                     moe::OpListString(moe::ForwardOps(s, sliced)), "; backward ",
                     moe::OpListString(moe::BackwardOps(s, sliced))));
    return;
  }
  if (!choice.cache_error.empty()) {
    spdlog::warn(
        "moe schedule auto: the cost profile could not be cached ({}): a restarted attempt "
        "calibrates again and may choose other schedules, so it would not continue bit for bit",
        choice.cache_error);
  }
  if (choice.profile.has_value()) {
    const moe::CostProfile& p = *choice.profile;
    log(absl::StrFormat("moe schedule auto: cost profile %s (%s, calibration %.2f s)", p.source,
                        choice.from_cache ? absl::StrCat("cached in ", choice.cache_path)
                                          : std::string("measured now"),
                        p.seconds_spent));
    for (moe::CollectiveKind kind : moe::kAllCollectiveKinds) {
      for (moe::OpGroup group : moe::kCommGroups) {
        const moe::AlphaBeta& f = p.at(kind, group);
        if (f.points == 0) continue;
        // beta 0: times that did not grow with size (latency-bound), fitted as a flat cost.
        const std::string bandwidth =
            f.beta > 0 ? absl::StrFormat("%.2f GB/s", 1e-9 / f.beta)
                       : std::string("no per-byte cost measured (flat: latency-bound sizes)");
        log(absl::StrFormat("  fit %s over %s: alpha %.1f us, %s, r2 %.4f (%d points)",
                            moe::CollectiveKindName(kind), moe::OpGroupName(group), f.alpha * 1e6,
                            bandwidth, f.r2, f.points));
      }
    }
  }
  if (choice.choice.has_value()) {
    for (const moe::Prediction& pr : choice.choice->all) {
      log(absl::StrFormat("  predicted %s: forward %.3f ms, backward %.3f ms",
                          moe::ScheduleName(pr.schedule), pr.forward_s * 1e3, pr.backward_s * 1e3));
    }
    if (!choice.choice->measured_s.empty()) {
      log(absl::StrCat("  measured on these ranks ",
                       choice.trial_from_cache ? absl::StrCat("by an earlier attempt (cached in ",
                                                              choice.trial_cache_path, ")")
                                               : std::string("now (the trial of the MoE layer)")));
    }
    log(absl::StrCat("moe schedule auto -> ", ran_text, " on every MoE layer (",
                     choice.choice->reason, ")"));
  }
}

// checkpoint.every auto: the Young/Daly interval with what the controller measured
// (RankTask.checkpoint_hint). A task without a hint (a controller that sent none) gets the
// controller's prior MTBF, one day (controller/store/goodput.h: kMtbfPriorSeconds).
void ConfigureAutoInterval(const furnace::v1::RankTask& task, train::CheckpointConfig& config) {
  constexpr double kMtbfWithoutHintSeconds = 24 * 3600.0;
  const furnace::v1::CheckpointHint& hint = task.checkpoint_hint();
  config.every_auto = true;
  config.auto_hint.mtbf_seconds =
      hint.mtbf_seconds() > 0 ? hint.mtbf_seconds() : kMtbfWithoutHintSeconds;
  config.auto_hint.stall_seconds = hint.stall_seconds();
  config.auto_hint.step_seconds = hint.step_seconds();
  if (task.rank() != 0) return;
  spdlog::info(
      "checkpoint.every auto: MTBF {:.1f} s ({}), checkpoint stall {}, step time {}; the "
      "interval is sqrt(2 * stall * MTBF) in steps, re-evaluated as the ranks measure",
      config.auto_hint.mtbf_seconds,
      hint.mtbf_seconds() <= 0 ? std::string("no hint from the controller: the prior")
      : hint.mtbf_basis() == "cluster"
          ? std::string("this cluster's failure rate for this job's ranks: no failure of it yet")
      : hint.mtbf_from_prior() ? std::string("the prior: no failure yet")
                               : absl::StrCat(hint.failures(), " failure(s) observed"),
      hint.stall_seconds() > 0 ? absl::StrFormat("%.1f ms measured", hint.stall_seconds() * 1e3)
                               : std::string("not measured yet (checkpoint after the first step)"),
      hint.step_seconds() > 0 ? absl::StrFormat("%.1f ms", hint.step_seconds() * 1e3)
                              : std::string("not measured yet"));
}

// The CPUs this process may run on (its affinity mask; 1 when it cannot be read).
int AllowedCpus() {
  cpu_set_t cpus;
  CPU_ZERO(&cpus);
  return sched_getaffinity(0, sizeof(cpus), &cpus) == 0 ? std::max(1, CPU_COUNT(&cpus)) : 1;
}

// The machine's SGEMM peak for MFU, measured once per machine (train::MachinePeakFlops) and kept
// in the user's cache directory ($XDG_CACHE_HOME/furnace, else ~/.cache/furnace), keyed by the
// host and the CPUs this process may run on: measuring costs seconds of start-up (three 2048^3
// SGEMMs), which every attempt and job used to pay again, and a figure measured while other ranks
// measured too was up to 2x low (MFU not comparable between jobs, nor across a restart). Without
// a usable cache directory: measured here.
double PeakFlops(bool* cached, std::string* where) {
  *cached = false;
  std::string dir;
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x != nullptr && *x != '\0') {
    dir = (std::filesystem::path(x) / "furnace").string();
  } else if (const char* h = std::getenv("HOME"); h != nullptr && *h != '\0') {
    dir = (std::filesystem::path(h) / ".cache" / "furnace").string();
  }
  if (dir.empty()) return train::MeasureSgemmPeakFlops();
  char host[256] = {};
  if (gethostname(host, sizeof(host) - 1) != 0) std::snprintf(host, sizeof(host), "localhost");
  // Another CPU allowance (a container's cpuset, a resized VM) is another machine for this.
  const int allowed = AllowedCpus();
  absl::StatusOr<double> peak = train::MachinePeakFlops(
      dir, absl::StrCat(host, ".", allowed, "cpu"), [] { return train::MeasureSgemmPeakFlops(); },
      cached);
  if (!peak.ok()) {
    spdlog::warn("{}: measuring without it", std::string(peak.status().message()));
    return train::MeasureSgemmPeakFlops();
  }
  *where = dir;
  return *peak;
}

// The share of one CPU a one-thread rank gets when `ranks_on_host` ranks share this host's CPUs
// (1 when they do not outnumber them; 0: not known, 1). Only where this process may run on every
// CPU of the host: a rank pinned to some (taskset, a cpuset, Slurm's --cpu-bind) may have them to
// itself, and the ranks' masks are not known here, so it counts one CPU's peak as before.
double CpuShare(uint32_t ranks_on_host) {
  if (ranks_on_host <= 1) return 1;
  const long online = sysconf(_SC_NPROCESSORS_ONLN);
  if (online <= 0 || AllowedCpus() < online) return 1;
  return std::min(1.0, static_cast<double>(AllowedCpus()) / ranks_on_host);
}

int Fail(Progress& progress, uint64_t step, int code, const std::string& message) {
  spdlog::error("{}", message);
  progress.Emit("failed", step, message);
  return code;
}

// An error of the data itself, at start-up or met as it is read: the user's to fix, never
// retried. DataLoss: the file is damaged (corrupt data); else it does not fit the job (bad input).
// A file that is there but could not be read now (Unavailable: a network file system's fault, a
// mount not ready on this node, a file cut short since it was opened; data_file.h) is no fault
// of the data: an error exit, which the controller retries.
int FailOnData(Progress& progress, uint64_t step, const absl::Status& status) {
  if (absl::IsUnavailable(status)) {
    return Fail(progress, step, kRankExitError, absl::StrCat("data: ", status.message()));
  }
  const bool corrupt = absl::IsDataLoss(status);
  return Fail(progress, step, corrupt ? kRankExitCorruptData : kRankExitBadInput,
              absl::StrCat(corrupt ? "data file corrupt: " : "data: ", status.message()));
}

}  // namespace

int RunTrainRank(const furnace::v1::RankTask& task, Progress& progress, RankDevice& rank_device) {
  // Every file the job names is resolved under this worker's roots (--data-root,
  // --checkpoint-root) before anything opens it, realpath-based, so a path the controller let
  // through (its own roots, or none) or a symlink planted since submit cannot lead outside.
  furnace::v1::JobSpec confined = task.spec();
  if (absl::Status s = ConfineFields(task.data_root(), task.checkpoint_root(),
                                     furnace::v1::JobPathFields(confined));
      !s.ok()) {
    return Fail(progress, 0, kRankExitBadInput, std::string(s.message()));
  }
  const furnace::v1::JobSpec& spec = confined;
  progress.set_total_steps(spec.train().steps());
  kernels::cpu::SetBlasThreads(1);  // one BLAS thread per rank (ranks share the machine's cores)
  // When each part of the start-up ended (the controller's recovery phases), and the watchdog
  // that reports a phase overrunning its timeout with the collective it is blocked in.
  furnace::v1::RankStartupTimes startup;
  startup.set_process_start_unix(RealClock().UnixSeconds());
  const model::ModelConfig config = ModelConfigFrom(spec);
  const data::DataSourceConfig data_config = DataSourceConfigFrom(spec.data(), config.vocab);
  WatchdogTimeouts timeouts = WatchdogTimeoutsFor(spec.recovery());
  timeouts.eval_s = EvalTimeoutS(timeouts, spec.eval().batches(), spec.parallel().dp(),
                                 spec.parallel().micro_batches());
  // Datasets' indexes and fingerprints are read at start-up: the start-up budget grows with them.
  const data::DataReadsAtOpen reads = data::DataReadAtOpen(data_config);
  if (const double scan_s = DataScanAllowanceS(reads.sequential_bytes, reads.scattered_reads);
      scan_s >= 1) {
    timeouts.startup_s += scan_s;
    if (task.rank() == 0) {
      spdlog::info(
          "data: {:.2f} GiB of dataset indexes and {} scattered tokens are read before training; "
          "the start-up watchdog allows {:.0f} s more for it ({:.0f} s in all)",
          static_cast<double>(reads.sequential_bytes) / (1ull << 30), reads.scattered_reads, scan_s,
          timeouts.startup_s);
    }
  }
  RankWatchdog watchdog(timeouts, RealClock(), comm::ProcessInFlight());
  watchdog.EnterStartup("data");
  const WatchdogThread watchdog_thread(
      watchdog,
      [&progress](const furnace::v1::RankWatchdogRecord& r) { progress.EmitWatchdog(r); });

  if (absl::Status s = config.Validate(); !s.ok()) {
    return Fail(progress, 0, kRankExitBadInput, absl::StrCat("model: ", s.message()));
  }

  // Data first: a bad token file or indexed dataset is the user's to fix and is refused before
  // anything else.
  data::SamplerConfig sc;
  sc.batch = static_cast<int>(spec.parallel().micro_batch());
  sc.seq_len = config.seq_len;
  sc.seed = spec.train().seed();
  sc.global_batch = int64_t{sc.batch} * spec.parallel().micro_batches() * spec.parallel().dp();
  absl::StatusOr<data::Samplers> samplers = data::MakeSamplers(data_config, sc);
  if (!samplers.ok()) return FailOnData(progress, 0, samplers.status());
  const double entropy_floor = samplers->entropy_floor;
  spdlog::info("data: {}", samplers->description);
  // An evaluation reads eval.batches micro-batches of held-out sequences from the start of the
  // held-out data; more than it has wraps around and counts some twice (said, not refused: the
  // loss is still a held-out loss, weighted). One dataset only: a blend's held-out positions go to
  // its datasets by weight, and which of them wraps is not this count's to say.
  if (samplers->validation != nullptr && spec.eval().every() > 0 && task.rank() == 0 &&
      spec.data().blend_size() == 0) {
    const int64_t windows = samplers->validation->PositionAt(0).epoch_sequences;
    const int64_t read = int64_t{spec.eval().batches()} * spec.parallel().micro_batch();
    if (windows > 0 && read > windows) {
      spdlog::warn(
          "eval: {} held-out sequences an evaluation (eval.batches {} x parallel.micro_batch "
          "{}), but the held-out data has {}: {} of them are repeats, which count more than once "
          "in the eval loss; lower eval.batches to {} or hold out more data",
          read, spec.eval().batches(), spec.parallel().micro_batch(), windows, read - windows,
          std::max<int64_t>(1, windows / spec.parallel().micro_batch()));
    }
  }

  // The device (rank_main.cc made it from resources.device; its compute stream is this thread's:
  // the model, the trainer and the collectives' staging enqueue on it) and its backend at
  // model.precision (refused here naming the fields). It outlives everything below.
  device::Device& dev = *rank_device.device;
  if (absl::StatusOr<const device::Backend*> b = device::BackendFor(dev, rank_device.precision);
      !b.ok()) {
    // A setting with no backend is bad input; the GPU failing to load the kernels is not.
    const bool bad_input =
        absl::IsInvalidArgument(b.status()) || absl::IsFailedPrecondition(b.status());
    return Fail(progress, 0, bad_input ? kRankExitBadInput : kRankExitError,
                absl::StrCat(rank_device.precision == device::Precision::kBf16
                                 ? "model.precision bf16 with resources.device "
                                 : "resources.device ",
                             spec.resources().device(), ": ", b.status().message()));
  }

  // The layout: refused as bad input before any rendezvous when it does not fit the model.
  const bool parallel = task.world_size() > 1;
  std::unique_ptr<train::RankLayout> layout;
  if (parallel) {
    absl::StatusOr<topology::Topology> topo = TopologyFromTask(task, config);
    if (!topo.ok()) {
      return Fail(progress, 0, kRankExitBadInput,
                  absl::StrCat("parallel: ", topo.status().message()));
    }
    progress.Emit("rendezvous", 0);
    watchdog.EnterStartup("rendezvous");
    auto connected = ConnectRankGroups(
        task, *topo, config, [&progress] { progress.Emit("rendezvous", 0); }, dev);
    if (!connected.ok()) {
      return Fail(progress, 0, kRankExitError,
                  absl::StrCat("rendezvous failed: ", connected.status().ToString()));
    }
    layout = std::move(*connected);
    watchdog.EnterStartup("model");
    const model::ModelShard& sh = layout->shard;
    spdlog::info(
        "layout pp={} dp={} tp={} ep={} esp={}: stage {} (layers {}..{}), dp rank {}, "
        "tp rank {}, ep rank {}, esp rank {}",
        topo->sizes().pp, topo->sizes().dp, topo->sizes().tp, topo->sizes().ep, topo->sizes().esp,
        sh.stage, sh.first_layer, sh.last_layer - 1, sh.dp_rank, sh.tp_rank, sh.ep_rank,
        sh.esp_rank);
  }

  startup.set_rendezvous_unix(parallel ? RealClock().UnixSeconds() : startup.process_start_unix());
  // The activation arena, the pinned host pool and the copy engine on the rank's device.
  tensor::DeviceArena arena(dev, spec.memory().device_budget());
  // memory.policy offload: the copy engine and host pool the model offloads through (declared
  // before the model, which must not outlive them).
  std::unique_ptr<memory::CopyEngine> copy_engine;
  tensor::HostPool host_pool(dev, 0);
  auto model = model::GptMoe::Create(
      config, spec.train().seed(), dev, arena, parallel ? layout->shard : model::ModelShard{},
      parallel ? layout->model_groups() : model::ParallelGroups{}, rank_device.precision);
  if (!model.ok()) {
    return Fail(progress, 0, kRankExitError, absl::StrCat("model: ", model.status().message()));
  }
  // memory.policy: the spec refuses what this build does not run; a task that still carries it
  // gets the parser's refusal here.
  absl::StatusOr<memory::MemoryPolicy> policy = memory::ParseMemoryPolicy(spec.memory().policy());
  if (!policy.ok()) {
    return Fail(progress, 0, kRankExitBadInput, std::string(policy.status().message()));
  }
  if (absl::Status set = (*model)->SetMemoryPolicy(*policy); !set.ok()) {
    return Fail(progress, 0, kRankExitError, absl::StrCat("memory policy: ", set.message()));
  }
  std::string moe_schedule_reason;  // auto's, for the step telemetry
  // moe.schedule: every MoE layer's schedule, the same on every rank (auto: calibrated on this
  // job's groups, or the profile an earlier attempt of the layout cached in checkpoint.dir).
  if (parallel) {
    watchdog.EnterStartup("moe schedules");
    absl::StatusOr<train::MoeScheduleChoice> choice = train::ChooseMoeSchedules(
        spec.moe().schedule(), **model, *layout, static_cast<int>(spec.parallel().micro_batch()),
        spec.checkpoint().dir());
    if (!choice.ok()) {
      return Fail(progress, 0,
                  absl::IsInvalidArgument(choice.status()) ? kRankExitBadInput : kRankExitError,
                  absl::StrCat("moe.schedule: ", choice.status().message()));
    }
    if (absl::Status set = (*model)->SetMoeSchedules(choice->per_layer); !set.ok()) {
      return Fail(progress, 0, kRankExitError, absl::StrCat("moe.schedule: ", set.message()));
    }
    LogMoeSchedules(spec.moe().schedule(), *choice, **model, task.rank() == 0);
    if (spec.moe().schedule() == "auto" && choice->choice.has_value()) {
      moe_schedule_reason = choice->choice->reason;
    }
  } else if (spec.moe().schedule() != "deepspeed" && task.rank() == 0) {
    // One process: no tensor parallelism, so every schedule is deepspeed's computation.
    spdlog::info(
        "moe.schedule {}: one rank (tp 1), nothing to pause: the MoE layers run as "
        "deepspeed",
        spec.moe().schedule());
  }
  // A budget below what any policy needs for one micro-batch would only run out of memory, restart
  // and escalate to the same end: refused before the first step, with the number needed. (`furnace
  // submit` checks it too, with the same function; the controller cannot: it does not link the
  // model, so a job another client sent is refused here.)
  // The bytes that fit any routing (set with a budget below them): an out-of-memory exit names
  // them, since no policy can fit a step whose routing needs more.
  std::optional<int64_t> routing_bound_short;
  if (const uint64_t budget = spec.memory().device_budget(); budget > 0) {
    const int64_t floor =
        (*model)->MinimumActivationBytes(static_cast<int>(spec.parallel().micro_batch()));
    if (static_cast<int64_t>(budget) < floor) {
      return Fail(progress, 0, kRankExitBadInput,
                  absl::StrCat("memory.device_budget: ", budget, " bytes is below ", floor,
                               " bytes, the least any memory policy needs on rank ", task.rank(),
                               " for one micro-batch of ", spec.parallel().micro_batch(),
                               " sequences (one module's forward, or its backward with all its "
                               "saved tensors back); raise memory.device_budget to at least ",
                               floor, " or lower parallel.micro_batch"));
    }
    // Above the floor a step can still need more where routing sends this rank more rows than
    // balanced (expert parallelism): said once, with the bound on the rows routing can send.
    const int B = static_cast<int>(spec.parallel().micro_batch());
    const std::optional<int64_t> bound = (*model)->RoutingBoundActivationBytes(B);
    if (bound.has_value() && static_cast<int64_t>(budget) < *bound) {
      routing_bound_short = *bound;
      const bool dropless = spec.moe().capacity_factor() <= 0;
      spdlog::warn(
          "memory.device_budget: {} bytes covers balanced routing ({} bytes needed) but not a "
          "step whose routing {} ({} bytes on rank {}): such a step runs out of activation memory "
          "whatever the policy; {} bytes leaves room for any routing{}",
          budget, floor,
          dropless ? "sends every token to this rank's experts"
                   : "sends this rank's experts the most rows their capacity allows",
          *bound, task.rank(), *bound,
          dropless ? " (dropless, moe.capacity_factor 0: a capacity factor below experts / "
                     "top_k would bound it lower)"
                   : "");
    } else if (!bound.has_value() && task.rank() == 0) {
      spdlog::info(
          "memory.device_budget: {} bytes covers balanced routing ({} bytes needed); with "
          "tensor parallelism the bound on the rows routing can send a rank is not computed, so "
          "a step routed far from balanced can need more",
          budget, floor);
    }
  }
  if (*policy == memory::MemoryPolicy::kOffload || *policy == memory::MemoryPolicy::kAdaptive) {
    memory::CopyEngineOptions copy_options;
    copy_options.host_link_gbps = spec.memory().host_link_gbps();
    auto engine = memory::CopyEngine::Create(dev, copy_options);
    if (!engine.ok()) {
      return Fail(progress, 0, kRankExitBadInput,
                  absl::StrCat("memory.host_link_gbps: ", engine.status().message()));
    }
    copy_engine = std::move(*engine);
  }
  const std::string link = spec.memory().host_link_gbps() > 0
                               ? absl::StrCat(spec.memory().host_link_gbps(), " GB/s")
                               : std::string("unpaced");
  if (*policy == memory::MemoryPolicy::kOffload) {
    const absl::Status set =
        (*model)->SetOffload(spec.memory().offload_ratio(), copy_engine.get(), &host_pool);
    if (!set.ok()) {
      return Fail(progress, 0, kRankExitBadInput,
                  absl::StrCat("memory.offload_ratio: ", set.message()));
    }
    spdlog::info(
        "memory policy offload: the expert buffers closest to {:.0f}% of each MoE layer's "
        "expert activation bytes to the host, link {}",
        100 * spec.memory().offload_ratio(), link);
  }
  if (*policy == memory::MemoryPolicy::kAdaptive) {
    model::GptMoe::AdaptiveOptions options;
    if (spec.memory().codec() == "bf16") options.codec = memory::Codec::kBf16;
    if (spec.memory().codec() == "fp8") options.codec = memory::Codec::kFp8E4M3;
    // The expert buffers whose rebuild re-runs the all-to-all are dropped by the ranks'
    // agreement (GptMoe::AdaptiveOptions::drop_group: a single-stage layout).
    if (parallel) options.drop_group = layout->runtime.world_group;
    const absl::Status set = (*model)->SetAdaptive(copy_engine.get(), &host_pool, options);
    if (!set.ok()) {
      return Fail(progress, 0, kRankExitError, absl::StrCat("memory policy: ", set.message()));
    }
    (*model)->SetPlannerLog([](const std::string& line) { spdlog::debug("{}", line); });
    spdlog::info(
        "memory policy adaptive: projects each MoE layer's peak after routing and acts only "
        "when it would not fit ({}); offload link {}; reduced precision {}",
        spec.memory().device_budget() == 0
            ? std::string("no budget set: it never will")
            : absl::StrCat("budget ", spec.memory().device_budget(),
                           " bytes; it plans to 98% of it, the 2% margin for what a projection "
                           "does not see, and the peak may use the whole budget"),
        link, spec.memory().codec());
  }
  spdlog::info("device {} ({}): training on the {} backend, precision {}", dev.name(),
               device::KindName(dev.kind()), (*model)->backend().name,
               device::PrecisionName((*model)->backend().precision));
  if (config.recompute_attention_probs) {
    const model::Dims micro{static_cast<int>(spec.parallel().micro_batch()),
                            config.seq_len,
                            config.d_model,
                            config.heads,
                            parallel ? layout->shard.tp : 1,
                            true};
    spdlog::info(
        "attention probabilities recomputed in backward (model.attention_probs recomputed): each "
        "layer keeps {} bytes of row statistics per micro-batch instead of {} bytes of "
        "probabilities",
        model::AttentionRowStatsBytes(micro), model::AttentionProbsBytes(micro));
  }
  if (config.spikes.enabled()) {
    spdlog::info(
        "routing spikes: {:.1f}% of the steps, busiest expert up to {:.2f}x the mean, seed {}",
        config.spikes.probability * 100, config.spikes.max_ratio, config.spikes.seed);
  }
  // The MFU peak: a GPU's datasheet figure at the GEMMs' precision; elsewhere (the CPU, and the
  // emulated device, which runs the CPU kernels) the machine's measured SGEMM.
  watchdog.EnterStartup("peak FLOPs measurement");
  double peak = 0;
  std::string peak_source;
  if (dev.kind() == device::Kind::kCuda) {
    peak = train::DatasheetPeakFlops(dev.name(), rank_device.precision, &peak_source);
  } else {
    bool peak_cached = false;
    std::string cache;
    peak = PeakFlops(&peak_cached, &cache);
    peak_source = absl::StrCat("CPU SGEMM 2048^3, 1 thread, ",
                               peak_cached ? "measured earlier on this machine" : "measured",
                               cache.empty() ? "" : absl::StrCat("; kept in ", cache));
    // Each rank computes on one thread; ranks of one host beyond its CPUs share them, so the
    // devices the job uses there are its CPUs, not a core per rank (MODEL.md: the peak of the
    // devices).
    const double share = CpuShare(task.ranks_on_host());
    if (share < 1) {
      peak *= share;
      absl::StrAppend(&peak_source,
                      absl::StrFormat("; %d ranks share this host's %d CPUs, %.2f CPU each",
                                      task.ranks_on_host(), AllowedCpus(), share));
    }
  }
  spdlog::info(
      "model: {} parameters on this rank, {:.1f} MFLOP per token; peak {:.1f} GFLOP/s ({}); "
      "activation budget {}; memory policy {}",
      (*model)->num_params(), (*model)->FlopsPerToken() / 1e6, peak / 1e9, peak_source,
      spec.memory().device_budget() == 0 ? std::string("unlimited")
                                         : absl::StrCat(spec.memory().device_budget(), " bytes"),
      memory::MemoryPolicyName(*policy));

  train::TrainConfig train_config = TrainConfigFrom(spec, peak);
  train_config.job_id = task.job_id();
  if (spec.checkpoint().every_auto()) ConfigureAutoInterval(task, train_config.checkpoint);
  // A background thread prepares this rank's next micro-batches while it computes.
  const int first_micro =
      (parallel ? layout->runtime.dp_rank : 0) * static_cast<int>(spec.parallel().micro_batches());
  const std::unique_ptr<data::Sampler> sampler = data::MakePrefetchingSampler(
      std::move(samplers->train), first_micro, static_cast<int>(spec.parallel().micro_batches()));
  // Held-out data for eval.every: the data layer's validation sampler (Markov: independent draws
  // on a stream of their own; token and indexed data: data.validation).
  std::unique_ptr<data::Sampler> held_out =
      spec.eval().every() > 0 ? std::move(samplers->validation) : nullptr;
  if (spec.eval().every() > 0 && held_out == nullptr) {
    return Fail(progress, 0, kRankExitBadInput,
                absl::StrCat("eval.every: no held-out data for data.source ", spec.data().source(),
                             " (set data.validation: a fraction of the data or its own files)"));
  }
  auto trainer = train::Trainer::Create(model->get(), sampler.get(), train_config, nullptr,
                                        parallel ? &layout->runtime : nullptr, held_out.get());
  if (!trainer.ok()) {
    return Fail(progress, 0, kRankExitBadInput,
                absl::StrCat("train: ", trainer.status().message()));
  }
  if (parallel) {
    watchdog.EnterStartup("data check");
    if (absl::Status same = (*trainer)->CheckSameData(); !same.ok()) {
      return Fail(progress, 0, absl::IsInvalidArgument(same) ? kRankExitBadInput : kRankExitError,
                  std::string(same.message()));
    }
  }
  startup.set_setup_unix(RealClock().UnixSeconds());
  if (!spec.checkpoint().dir().empty()) {
    // The largest rank's shard (parameters and both Adam moments), written at every checkpoint
    // and read back now: every rank waits for it, a checkpoint ending in a world-wide gather, so
    // every rank is allowed its time (a stage holding the embedding or more experts writes more).
    int64_t largest = (*model)->num_params();
    if (parallel) {
      comm::Communicator* world = layout->runtime.world_group;
      std::vector<int64_t> all(static_cast<size_t>(world->size()));
      if (absl::Status s = world->AllGather(&largest, all.data(), sizeof(int64_t)); !s.ok()) {
        return Fail(progress, 0, kRankExitError,
                    absl::StrCat("checkpoint shard sizes: ", s.message()));
      }
      largest = *std::max_element(all.begin(), all.end());
    }
    watchdog.AllowForCheckpointBytes(static_cast<uint64_t>(train::kShardHeaderBytes) +
                                     3 * sizeof(float) * static_cast<uint64_t>(largest));
  }
  watchdog.EnterStartup("checkpoint load");
  if (!spec.checkpoint().dir().empty()) {
    auto restored = (*trainer)->RestoreLatest();
    if (restored.ok()) {
      std::string account =
          absl::StrCat("resumed from the checkpoint of step ", restored->step, " (", restored->path,
                       ", written by ", restored->num_shards, " rank(s); rank ", task.rank(),
                       " read shard", restored->shards_read.size() == 1 ? " " : "s ",
                       absl::StrJoin(restored->shards_read, ", "), ")");
      if (restored->data.datasets.size() > 1) {  // a blend: each dataset has its own epochs
        absl::StrAppend(&account, "; data at ",
                        absl::StrJoin(restored->data.datasets, ", ",
                                      [](std::string* text, const data::DatasetPosition& d) {
                                        absl::StrAppend(text, d.path, " epoch ", d.epoch,
                                                        " sequence ", d.index_in_epoch, " of ",
                                                        d.epoch_sequences);
                                      }));
      } else if (restored->data.epoch_sequences > 0) {
        absl::StrAppend(&account, "; data at epoch ", restored->data.epoch, ", sequence ",
                        restored->data.index_in_epoch, " of ", restored->data.epoch_sequences);
      }
      if (const auto& changed = (*trainer)->settings_overridden(); !changed.empty()) {
        const std::string changes = train::DescribeChanges(changed);
        spdlog::warn(
            "continuing with this job's settings where the checkpoint's differ "
            "(checkpoint.override_settings): {}",
            changes);
        absl::StrAppend(&account, "; settings overridden: ", changes);
      }
      for (const auto& skipped : restored->skipped) {
        spdlog::warn("checkpoint skipped: {}", skipped);
        absl::StrAppend(&account, "; passed over: ", skipped);
      }
      spdlog::info("{}", account);
      progress.Emit("restored", static_cast<uint64_t>(restored->step), account);
    } else if (!absl::IsNotFound(restored.status())) {
      // A checkpoint of another model or seed is the user's to fix: retrying cannot help.
      const int code =
          absl::IsFailedPrecondition(restored.status()) ? kRankExitBadInput : kRankExitError;
      // The loader's messages mostly name the checkpoint already ("checkpoint: no usable ...").
      const absl::string_view why = restored.status().message();
      return Fail(progress, 0, code,
                  absl::StartsWith(why, "checkpoint") ? std::string(why)
                                                      : absl::StrCat("checkpoint: ", why));
    }
  }
  startup.set_checkpoint_load_unix(RealClock().UnixSeconds());
  const uint64_t start_step = static_cast<uint64_t>((*trainer)->step());
  progress.Emit("running", start_step, "", nullptr, nullptr, &startup);
  // The phase the rank enters after `completed` steps: the next step (with the checkpoint that
  // follows it inside Trainer::Run, when one is due), the final checkpoint, or nothing.
  const uint64_t total = spec.train().steps();
  const bool checkpoints = !spec.checkpoint().dir().empty();
  const auto watch_next = [&](uint64_t completed) {
    if (completed < total) {
      watchdog.EnterStep(completed + 1);
    } else if (checkpoints) {
      watchdog.EnterCheckpoint(completed, /*final=*/true);
    } else {
      watchdog.EnterFinishing(absl::StrCat("trained to step ", completed));
    }
  };
  watch_next(start_step);
  // Checkpoints (every N, auto, final) and evaluations are phases of their own, entered as they
  // start.
  const auto on_phase = [&](train::RunPhase phase, int64_t step) {
    const uint64_t after = static_cast<uint64_t>(step);
    if (phase == train::RunPhase::kCheckpoint) {
      watchdog.EnterCheckpoint(after, after == total);
    } else {
      watchdog.EnterEval(after);
    }
  };

  std::optional<int> fault_exit;
  uint64_t computed = 0;  // steps this attempt computed (fault.mean_steps counts them)
  // Static: SIGUSR1's thread may still act on it after this function returned (rank_stop_signal.h).
  static train::StopToken stop;
  size_t checkpoint_errors_logged = 0;
  size_t checkpoint_warnings_logged = 0;
  const auto on_step = [&](const train::StepStats& s) {
    // Global numbers (tokens, tokens per expert) are reported by rank 0 only: the controller sums
    // over ranks. Times, memory and bytes are this rank's.
    const bool reporter = task.rank() == 0;
    const furnace::v1::StepTelemetry telemetry =
        StepTelemetryOf(s, {.reporter = reporter,
                            .memory_budget_bytes = spec.memory().device_budget(),
                            .entropy_floor = entropy_floor,
                            .moe_schedule_reason = moe_schedule_reason});
    double worst = 0;
    for (double imbalance : s.imbalance) worst = std::max(worst, imbalance);
    const uint64_t done = static_cast<uint64_t>(s.step) + 1;
    progress.Emit("running", done, "", nullptr, &telemetry);
    if (reporter && (done == start_step + 1 || done % 10 == 0 || done == total)) {
      spdlog::info(
          "step {}/{}  loss {:.4f}  aux {:.4f}  {:.0f} tok/s  step {:.1f} ms  MFU {:.1f}%  "
          "imbalance {:.2f}{}  act peak {:.1f} MiB",
          done, total, s.loss, s.aux_loss, s.tokens_per_second, s.step_seconds * 1e3, s.mfu * 100,
          worst, s.routing_spike ? " (spike)" : "", s.activation_peak_bytes / 1048576.0);
    }
    if (!s.checkpoint_error.empty()) {
      spdlog::warn("{}", s.checkpoint_error);
      ++checkpoint_errors_logged;
    }
    const std::vector<std::string>& warnings = (*trainer)->checkpoint_warnings();
    for (; checkpoint_warnings_logged < warnings.size(); ++checkpoint_warnings_logged) {
      spdlog::warn("{}", warnings[checkpoint_warnings_logged]);
    }
    if (s.eval && reporter) {
      spdlog::info(
          "eval after step {}: held-out loss {:.4f} (perplexity {:.2f}) over {} batches, "
          "{} tokens, {:.1f} ms",
          done, s.eval->loss, s.eval->perplexity, s.eval->batches, s.eval->tokens,
          s.eval->seconds * 1e3);
    }
    if (s.checkpoint_interval_changed && reporter && s.checkpoint_interval_seconds == 0) {
      spdlog::info(
          "checkpoint.every auto: interval 1 step until a checkpoint has measured its stall");
    } else if (s.checkpoint_interval_changed && reporter) {
      const train::IntervalInputs& in = s.checkpoint_interval_inputs;
      spdlog::info(
          "checkpoint.every auto: interval {} steps ({:.2f} s = sqrt(2 * stall {:.1f} ms * MTBF "
          "{:.1f} s), step {:.1f} ms), from step {}",
          s.checkpoint_interval_steps, s.checkpoint_interval_seconds, in.stall_seconds * 1e3,
          in.mtbf_seconds, in.step_seconds * 1e3, done);
    }
    ++computed;
    fault_exit = MaybeInjectFault(task, done, progress);
    if (!fault_exit) fault_exit = MaybeInjectRandomFault(task, computed, done, progress);
    if (fault_exit) stop.RequestStop();
    watch_next(done);
  };
  SetStopSignalTarget(&stop);  // SIGUSR1 now stops after a step, with its checkpoint
  absl::Status status = (*trainer)->Run(on_step, &stop, on_phase);
  IgnoreStopSignal();
  // Steps as the logs count them: step() are done, so step() + 1 is the one that failed.
  const std::string failed_in = absl::StrCat("training failed in step ", (*trainer)->step() + 1);
  // The groups' teardown follows (it can block on a dead peer): watched, with the outcome.
  watchdog.EnterFinishing(status.ok() ? absl::StrCat("trained to step ", (*trainer)->step())
                                      : absl::StrCat(failed_in, ": ", status.message()));
  // Asynchronous checkpoints finished at the end of Run report no step of their own.
  const std::vector<std::string>& checkpoint_errors = (*trainer)->checkpoint_errors();
  for (size_t i = checkpoint_errors_logged; i < checkpoint_errors.size(); ++i) {
    spdlog::warn("{}", checkpoint_errors[i]);
  }
  const std::vector<std::string>& checkpoint_warnings = (*trainer)->checkpoint_warnings();
  for (size_t i = checkpoint_warnings_logged; i < checkpoint_warnings.size(); ++i) {
    spdlog::warn("{}", checkpoint_warnings[i]);
  }
  if (fault_exit) return *fault_exit;
  if (!status.ok()) {
    // The data's own errors met as it is read: a restart would meet them again at the same step.
    if (data::IsDataError(status)) {
      return FailOnData(progress, static_cast<uint64_t>((*trainer)->step()), status);
    }
    const bool oom = absl::IsResourceExhausted(status);
    std::string routing;
    if (oom && routing_bound_short.has_value()) {
      routing = absl::StrCat(" (memory.device_budget ", spec.memory().device_budget(),
                             " bytes covers balanced routing; ", *routing_bound_short,
                             " bytes fits any routing on rank ", task.rank(), ")");
    }
    return Fail(progress, static_cast<uint64_t>((*trainer)->step()),
                oom ? kRankExitOutOfMemory : kRankExitError,
                absl::StrCat(failed_in, ": ", status.ToString(), routing));
  }
  if ((*trainer)->stopped_on_request()) {
    // Not a success: the job's steps are not done (the agent asked; a SIGUSR1 from elsewhere is a
    // failure the controller restarts from this checkpoint).
    const std::string stopped = absl::StrFormat(
        "stopped on request (SIGUSR1) after step %d of %d%s", (*trainer)->step(), total,
        checkpoints ? ", its checkpoint written" : " (no checkpoint.dir: nothing kept)");
    spdlog::info("{}", stopped);
    progress.Emit("stopped", static_cast<uint64_t>((*trainer)->step()), stopped);
    return kRankExitStopped;
  }
  if (copy_engine != nullptr) {
    const memory::CopyEngineStats cs = copy_engine->stats();
    spdlog::info(
        "offload: {:.1f} MiB to the host, {:.1f} MiB back, copy thread busy {:.3f} s "
        "(link model {:.3f} s), {} late reloads",
        cs.bytes_to_host / 1048576.0, cs.bytes_to_device / 1048576.0, cs.busy_seconds,
        cs.modelled_seconds, cs.late_reloads);
  }
  if (*policy == memory::MemoryPolicy::kAdaptive) {
    const model::GptMoe::PlannerStats ps = (*model)->planner_stats();
    spdlog::info(
        "adaptive: {} decisions, {} emergency offloads, {} expert buffers dropped by the ranks' "
        "agreement{} ({:.3f} s in the agreements, {} plans made again), {:.1f} MiB recomputed; "
        "offloads last priced as hidden behind {:.0f}% of the compute ahead (less after late "
        "reloads)",
        ps.decisions, ps.emergency_offloads, ps.agreed_drops,
        parallel && layout->runtime.stages > 1 ? " (none on a pipeline)" : "", ps.agreement_seconds,
        ps.replans, (*model)->MemoryActions().recomputed_bytes / 1048576.0, 100 * ps.hidden_share);
  }
  const std::string done = absl::StrFormat("trained %d steps", (*trainer)->step());
  spdlog::info("{}", done);
  progress.Emit("done", static_cast<uint64_t>((*trainer)->step()), done);
  return kRankExitSuccess;
}

}  // namespace furnace::worker
