// What becomes of every field of furnace.v1.JobSpec once the spec has accepted it: accepted means
// implemented. Each leaf field (by its YAML path) is
//   kUsed:                 read by the worker, the controller or the runtime (outside this folder:
//                          validating a field is not using it); `evidence` is a piece of the code
//                          that reads it;
//   kRefusedUnlessDefault: part of the schema but not of this build's runtime; the spec refuses
//                          any value but the default (cross_checks.cc), and `evidence` is a value
//                          it refuses in a train job;
//   kMustMatch:            redundant with other fields and refused unless it agrees with them;
//                          `evidence` is a value that disagrees with the defaults.
// A used field of which only some values are built also names, in `refused`, a value the spec
// refuses in a train job.
// tests/controller/spec/field_uses_test.cc walks the proto descriptor and fails on a field missing
// here, on evidence not found in the sources, and on a refused value that is accepted. When a
// field's feature lands, its refusal goes and its entry becomes kUsed.
#pragma once

#include <string_view>

namespace furnace::spec {

enum class FieldUse { kUsed, kRefusedUnlessDefault, kMustMatch };

struct JobSpecField {
  std::string_view path;
  FieldUse use;
  std::string_view evidence;
  std::string_view refused = {};
};

inline constexpr JobSpecField kJobSpecFields[] = {
    {"name", FieldUse::kUsed, "spec.name()"},
    {"kind", FieldUse::kUsed, "spec().kind()"},

    {"model.vocab", FieldUse::kUsed, "model().vocab()"},
    {"model.seq_len", FieldUse::kUsed, "model().seq_len()"},
    {"model.d_model", FieldUse::kUsed, "model().d_model()"},
    {"model.heads", FieldUse::kUsed, "model().heads()"},
    {"model.layers", FieldUse::kUsed, "model().layers()"},
    {"model.dense_ffn", FieldUse::kUsed, "model().dense_ffn()"},
    {"model.precision", FieldUse::kUsed, "model().precision()", "bf16"},
    {"model.moe_every", FieldUse::kUsed, "model().moe_every()"},
    {"model.expert_ffn", FieldUse::kUsed, "model().expert_ffn()"},
    {"model.attention_probs", FieldUse::kUsed, "model().attention_probs()"},

    {"parallel.pp", FieldUse::kUsed, "p.pp()"},
    {"parallel.dp", FieldUse::kUsed, "p.dp()"},
    {"parallel.tp", FieldUse::kUsed, "p.tp()"},
    {"parallel.ep", FieldUse::kUsed, "p.ep()"},
    {"parallel.esp", FieldUse::kUsed, "p.esp()"},
    {"parallel.micro_batch", FieldUse::kUsed, "parallel().micro_batch()"},
    {"parallel.micro_batches", FieldUse::kUsed, "parallel().micro_batches()"},
    {"parallel.order", FieldUse::kUsed, "p.order()"},

    {"moe.experts", FieldUse::kUsed, "moe().experts()"},
    {"moe.top_k", FieldUse::kUsed, "moe().top_k()"},
    {"moe.capacity_factor", FieldUse::kUsed, "moe().capacity_factor()"},
    {"moe.schedule", FieldUse::kUsed, "moe().schedule()"},
    {"moe.normalize_topk", FieldUse::kUsed, "moe().normalize_topk()"},
    {"moe.aux_alpha", FieldUse::kUsed, "moe().aux_alpha()"},
    {"moe.spikes.probability", FieldUse::kUsed, "spikes().probability()"},
    {"moe.spikes.max_ratio", FieldUse::kUsed, "spikes().max_ratio()"},
    {"moe.spikes.seed", FieldUse::kUsed, "spikes().seed()"},

    // Every policy runs (worker/train_rank.cc).
    {"memory.policy", FieldUse::kUsed, "memory().policy()"},
    {"memory.device_budget", FieldUse::kUsed, "memory().device_budget()"},
    {"memory.offload_ratio", FieldUse::kUsed, "memory().offload_ratio()"},
    {"memory.host_link_gbps", FieldUse::kUsed, "memory().host_link_gbps()"},
    {"memory.codec", FieldUse::kUsed, "memory().codec()"},

    {"train.steps", FieldUse::kUsed, "train().steps()"},
    {"train.lr", FieldUse::kUsed, "t.lr()"},
    {"train.min_lr", FieldUse::kUsed, "t.min_lr()"},
    {"train.warmup", FieldUse::kUsed, "t.warmup()"},
    {"train.schedule", FieldUse::kUsed, "t.schedule()"},
    {"train.clip", FieldUse::kUsed, "t.clip()"},
    {"train.seed", FieldUse::kUsed, "train().seed()"},
    {"train.weight_decay", FieldUse::kUsed, "t.weight_decay()"},

    {"data.source", FieldUse::kUsed, "d.source = spec.source()"},
    {"data.path", FieldUse::kUsed, "d.paths.push_back({spec.path(), 1.0})"},
    {"data.seed", FieldUse::kUsed, "d.markov_seed = spec.seed()"},
    {"data.blend.path", FieldUse::kUsed, "b.path()"},
    {"data.blend.weight", FieldUse::kUsed, "b.weight()"},
    {"data.validation.fraction", FieldUse::kUsed, "validation().fraction()"},
    {"data.validation.path", FieldUse::kUsed, "validation().path()"},
    // The worker compares it with the token file's recorded tokenizer (worker/train_rank.cc).
    {"data.tokenizer", FieldUse::kUsed, "d.tokenizer = spec.tokenizer()"},

    {"eval.every", FieldUse::kUsed, "c.eval.every = spec.eval().every()"},
    {"eval.batches", FieldUse::kUsed, "c.eval.batches = static_cast<int>(spec.eval().batches())"},

    {"checkpoint.dir", FieldUse::kUsed, "checkpoint().dir()"},
    {"checkpoint.every", FieldUse::kUsed, "checkpoint().every()"},
    {"checkpoint.keep", FieldUse::kUsed, "checkpoint().keep()"},
    {"checkpoint.async", FieldUse::kUsed, "checkpoint().async()"},
    // Set by `every: auto` (checkpoint.every is then 0): the worker turns on the Young/Daly
    // interval (runtime/train/checkpoint_interval.h) with the controller's hint.
    {"checkpoint.every_auto", FieldUse::kUsed, "checkpoint().every_auto()"},
    // The trainer refuses or accepts a resume under other optimizer or model settings (trainer.cc).
    {"checkpoint.override_settings", FieldUse::kUsed, "checkpoint().override_settings()"},
    {"checkpoint.stop_grace_s", FieldUse::kUsed, "StopCheckpointGraceS("},

    {"recovery.max_restarts", FieldUse::kUsed, "recovery().max_restarts()"},
    {"recovery.backoff.initial_s", FieldUse::kUsed, "spec.initial_s()"},
    {"recovery.backoff.max_s", FieldUse::kUsed, "spec.max_s()"},
    {"recovery.backoff.multiplier", FieldUse::kUsed, "spec.multiplier()"},
    {"recovery.heartbeat_timeout_s", FieldUse::kUsed, "recovery().heartbeat_timeout_s()"},
    {"recovery.hang_timeout_s", FieldUse::kUsed, "recovery().hang_timeout_s()"},
    {"recovery.start_timeout_s", FieldUse::kUsed, "recovery().start_timeout_s()"},
    {"recovery.max_attempts_without_progress", FieldUse::kUsed,
     "recovery().max_attempts_without_progress()"},
    {"recovery.health_check_s", FieldUse::kUsed, "recovery().health_check_s()"},
    {"recovery.exclude_s", FieldUse::kUsed, "recovery().exclude_s()"},
    {"recovery.wait_for_workers_s", FieldUse::kUsed, "recovery().wait_for_workers_s()"},
    // The layouts a recovering job may shrink to (controller/store/placement.cc).
    {"recovery.shrink.pp", FieldUse::kUsed, "layout.pp()"},
    {"recovery.shrink.dp", FieldUse::kUsed, "layout.dp()"},
    {"recovery.shrink.tp", FieldUse::kUsed, "layout.tp()"},
    {"recovery.shrink.ep", FieldUse::kUsed, "layout.ep()"},
    {"recovery.shrink.esp", FieldUse::kUsed, "layout.esp()"},

    // The ranks are pp * dp * tp; resources.workers, when written, must say the same.
    {"resources.workers", FieldUse::kMustMatch, "3"},
    // Used for placement (workers of that device kind) and by the rank, which trains on it.
    {"resources.device", FieldUse::kUsed, "resources().device()"},
    // The controller ends a job past it (controller/service/recovery.cc, Tick).
    {"resources.time_limit_s", FieldUse::kUsed, "resources().time_limit_s()"},

    {"commcheck.min_bytes", FieldUse::kUsed, "spec.min_bytes()"},
    {"commcheck.max_bytes", FieldUse::kUsed, "spec.max_bytes()"},
    {"commcheck.step_factor", FieldUse::kUsed, "spec.step_factor()"},
    {"commcheck.iters", FieldUse::kUsed, "spec.iters()"},
    {"commcheck.warmup_iters", FieldUse::kUsed, "spec.warmup_iters()"},
    {"commcheck.collectives", FieldUse::kUsed, "spec.collectives()"},
    {"commcheck.rounds", FieldUse::kUsed, "spec.rounds()"},
    {"commcheck.timeout_s", FieldUse::kUsed, "spec.timeout_s()"},

    {"fault.mode", FieldUse::kUsed, "fault.mode()"},
    {"fault.rank", FieldUse::kUsed, "fault.rank()"},
    {"fault.at_step", FieldUse::kUsed, "fault.at_step()"},
    {"fault.every_attempt", FieldUse::kUsed, "fault.every_attempt()"},
    {"fault.exit_code", FieldUse::kUsed, "fault.exit_code()"},
    {"fault.worker", FieldUse::kUsed, "fault.worker()"},
    {"fault.mean_steps", FieldUse::kUsed, "fault.mean_steps()"},
};

}  // namespace furnace::spec
