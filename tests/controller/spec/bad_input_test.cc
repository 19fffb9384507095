// Every rejected input must say where (file:line:col), which field, what was given and what is
// allowed. Each case lists substrings the error message must contain.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "controller/spec/diagnostics.h"
#include "controller/spec/job_spec.h"
#include "tests/controller/spec/refusal_case.h"

namespace furnace::spec {
namespace {

using BadCase = testing_util::RefusalCase;

// Prepended to most cases (lines 1-2), so their own lines start at 3.
constexpr char kHead[] = "name: j\nkind: train\n";

std::string H(std::string body) { return kHead + body; }

std::vector<BadCase> Cases() {
  return {
      // Syntax and document shape.
      {"malformed_flow",
       H("model: {d_model: 8\n"),
       {"job.yaml:4:1: malformed YAML: end of map flow not found"}},
      {"malformed_indent", "name: j\n  kind: train\n", {"job.yaml:2:7: malformed YAML: "}},
      {"empty_file", "", {"job.yaml:1:1: the job file is empty"}},
      {"only_comments", "# nothing\n", {"job.yaml:1:1: the job file is empty"}},
      // yaml-cpp 0.7's LoadAll looped forever (allocating) on these (found by tests/fuzz).
      {"lone_comma", "# a job\n  ,\n", {"job.yaml:2:3: malformed YAML: no document could be read"}},
      {"leading_comma", ",name: j\nkind: train\n", {"job.yaml:1:1: malformed YAML: no document"}},
      {"top_level_list", "- name: j\n", {"job.yaml:1:1: top level: expected a mapping", "a list"}},
      {"top_level_scalar", "hello\n", {"job.yaml:1:1: top level: expected a mapping", "'hello'"}},
      {"two_documents",
       "name: j\nkind: train\n---\nname: k\n",
       {"job.yaml:4:1: a job file holds one YAML document"}},
      {"duplicate_key",
       H("train:\n  steps: 1\n  steps: 2\n"),
       {"job.yaml:5:3: train.steps: duplicate field (first set on line 4)"}},

      // Required fields.
      {"missing_name_and_kind",
       "model:\n  d_model: 8\n",
       {"job.yaml:1:1: name: required field is missing",
        "job.yaml:1:1: kind: required field is missing (allowed: commcheck, train)"}},
      {"bad_name",
       "name: My_Job\nkind: train\n",
       {"job.yaml:1:7: name: invalid job name (got 'My_Job'; allowed:",
        "[a-z0-9][a-z0-9_-]{0,62}"}},
      {"name_too_long",
       "name: " + std::string(64, 'a') + "\nkind: train\n",
       {"job.yaml:1:7: name: invalid job name"}},
      {"unknown_kind",
       "name: j\nkind: trian\n",
       {"job.yaml:2:7: kind: unknown value; did you mean 'train'? (got 'trian'; allowed: "
        "commcheck, train)"}},

      // Unknown fields, with suggestions and the allowed keys.
      {"unknown_top_level",
       H("modle:\n  d_model: 8\n"),
       {"job.yaml:3:1: modle: unknown field; did you mean 'model'? (allowed: name, kind, model, "
        "parallel, moe, memory, train, data, checkpoint, eval, recovery, resources, commcheck, "
        "fault)"}},
      {"unknown_multiline_key",  // one problem a line, even for a key that spans lines
       H("\"gp\\nus\": 8\n"),
       {"job.yaml:3:1: gp\\nus: unknown field"}},
      {"unknown_top_level_no_guess",
       H("gpus: 8\n"),
       {"job.yaml:3:1: gpus: unknown field (allowed: name, kind, model,"}},
      {"unknown_nested",
       H("moe:\n  topk: 2\n"),
       {"job.yaml:4:3: moe.topk: unknown field; did you mean 'top_k'? (allowed: experts, top_k, "
        "capacity_factor, schedule, normalize_topk, aux_alpha, spikes)"}},
      {"unknown_deeply_nested",
       H("recovery:\n  backoff:\n    intial_s: 2\n"),
       {"job.yaml:5:5: recovery.backoff.intial_s: unknown field; did you mean 'initial_s'? "
        "(allowed: initial_s, max_s, multiplier)"}},

      // Wrong types.
      {"string_for_int",
       H("model:\n  d_model: abc\n"),
       {"job.yaml:4:12: model.d_model: expected an integer, got 'abc' (allowed: 1..1048576)"}},
      {"float_for_int",
       H("train:\n  steps: 1.5\n"),
       {"job.yaml:4:10: train.steps: expected an integer, got '1.5'"}},
      {"bool_for_int",
       H("train:\n  seed: true\n"),
       {"job.yaml:4:9: train.seed: expected an integer, got 'true'"}},
      {"quoted_int",
       H("train:\n  steps: \"100\"\n"),
       {"job.yaml:4:10: train.steps: expected an integer, got the quoted string \"100\""}},
      {"list_for_int",
       H("train:\n  steps: [1]\n"),
       {"job.yaml:4:10: train.steps: expected an integer, got a list"}},
      {"empty_value_for_int",
       H("train:\n  steps:\n"),
       {"job.yaml:4:3: train.steps: expected an integer, got an empty value"}},
      {"int_for_bool",
       H("checkpoint:\n  async: 1\n"),
       {"job.yaml:4:10: checkpoint.async: expected true or false, got '1' (allowed: true, false)"}},
      {"yes_for_bool",
       H("moe:\n  normalize_topk: yes\n"),
       {"job.yaml:4:19: moe.normalize_topk: expected true or false, got 'yes'"}},
      {"string_for_number",
       H("train:\n  lr: fast\n"),
       {"job.yaml:4:7: train.lr: expected a number, got 'fast' (allowed: > 0)"}},
      {"scalar_for_section",
       H("model: 5\n"),
       {"job.yaml:3:8: model: expected a mapping of fields (got '5')"}},
      {"mapping_for_string",
       H("checkpoint:\n  dir: {a: 1}\n"),
       {"job.yaml:4:8: checkpoint.dir: expected a string, got a mapping"}},
      {"scalar_for_list",
       H("commcheck:\n  collectives: allreduce\n"),
       {"job.yaml:4:16: commcheck.collectives: expected a list, got 'allreduce'"}},

      // Out of range.
      {"negative_dp",
       H("parallel:\n  dp: -2\n"),
       {"job.yaml:4:7: parallel.dp: must be >= 1 (got -2; allowed: 1..1048576)"}},
      {"zero_layers",
       H("model:\n  layers: 0\n"),
       {"job.yaml:4:11: model.layers: must be >= 1 (got 0; allowed: 1..65536)"}},
      {"uint32_overflow",
       H("train:\n  steps: 4294967296\n"),
       {"job.yaml:4:10: train.steps: must be <= 4294967295 (got 4294967296; allowed: "
        "1..4294967295)"}},
      // Sizes the runtime holds in 32-bit ints: bounded per field, and their products checked.
      {"d_model_beyond_int",
       H("model:\n  d_model: 3000000000\n  heads: 1\n"),
       {"job.yaml:4:12: model.d_model: must be <= 1048576 (got 3000000000; allowed: 1..1048576)"}},
      {"layers_beyond_any_model",
       H("model:\n  layers: 3000000000\n"),
       {"model.layers: must be <= 65536 (got 3000000000; allowed: 1..65536)"}},
      {"routed_tokens_beyond_int",
       H("model:\n  seq_len: 65536\nparallel:\n  micro_batch: 65536\n"),
       {"job.yaml:6:16: parallel.micro_batch: inconsistent sizes: a micro-batch's routed token "
        "copies (micro_batch * seq_len * top_k) are too many (got 65536 * 65536 * 2 = 8589934592; "
        "allowed: micro_batch * seq_len * top_k <= 2147483647)"}},
      {"sequences_beyond_int",
       H("parallel:\n  micro_batch: 4096\n  micro_batches: 1048576\n"),
       {"parallel.micro_batches: inconsistent sizes: a step's sequences (dp * micro_batches * "
        "micro_batch) are too many (got 1 * 1048576 * 4096 = 4294967296"}},
      {"zero_lr",
       H("train:\n  lr: 0\n"),
       {"job.yaml:4:7: train.lr: out of range (got 0; allowed: > 0)"}},
      {"probability_above_one",
       H("moe:\n  spikes:\n    probability: 1.5\n"),
       {"job.yaml:5:18: moe.spikes.probability: out of range (got 1.5; allowed: [0, 1])"}},
      {"offload_ratio_above_one",
       H("memory:\n  policy: offload\n  offload_ratio: 1.5\n"),
       {"job.yaml:5:18: memory.offload_ratio: out of range (got 1.5; allowed: (0, 1])"}},
      {"negative_offload_ratio",
       H("memory:\n  offload_ratio: -0.25\n"),
       {"job.yaml:4:18: memory.offload_ratio: out of range (got -0.25; allowed: (0, 1])"}},
      {"negative_host_link",
       H("memory:\n  host_link_gbps: -64\n"),
       {"job.yaml:4:19: memory.host_link_gbps:", "(got -64;"}},
      {"host_link_too_slow",
       H("memory:\n  policy: offload\n  host_link_gbps: 0.000001\n"),
       {"job.yaml:5:19: memory.host_link_gbps: a host link this slow would stall every step on "
        "its copies (got 1e-06; allowed: 0 (unpaced), or at least 0.001 (1 MB/s))"}},
      {"negative_spike_probability",
       H("moe:\n  spikes:\n    probability: -0.1\n"),
       {"job.yaml:5:18: moe.spikes.probability: out of range (got -0.1; allowed: [0, 1])"}},
      {"spike_ratio_below_one",
       H("moe:\n  spikes:\n    max_ratio: 0.5\n"),
       {"job.yaml:5:16: moe.spikes.max_ratio: out of range (got 0.5; allowed: >= 1)"}},
      {"negative_spike_ratio",
       H("moe:\n  spikes:\n    max_ratio: -2\n"),
       {"job.yaml:5:16: moe.spikes.max_ratio: out of range (got -2; allowed: >= 1)"}},
      // At max_ratio = experts / top_k every token is forced onto one expert: the bound.
      {"spike_ratio_above_experts_over_top_k",
       H("moe:\n  experts: 4\n  top_k: 2\n  spikes: {probability: 0.1, max_ratio: 2.5}\n"),
       {"job.yaml:6:", "moe.spikes.max_ratio: must be <= moe.experts / moe.top_k (= 4 / 2 = 2)",
        "(got 2.5; allowed: [1, 2])"}},
      {"spike_ratio_above_default_experts",
       H("moe:\n  top_k: 2\n  spikes:\n    max_ratio: 5\n    probability: 0.5\n"),
       {"job.yaml:6:16: moe.spikes.max_ratio: must be <= moe.experts / moe.top_k (= 8 / 2 = 4)",
        "(got 5; allowed: [1, 4])"}},
      {"exit_code_too_big",
       H("fault:\n  exit_code: 256\n"),
       {"job.yaml:4:14: fault.exit_code: must be <= 255 (got 256; allowed: 1..255)"}},
      {"step_factor_one",
       H("commcheck:\n  step_factor: 1\n"),
       {"commcheck.step_factor: must be >= 2 (got 1; allowed: 2..4294967295)"}},

      // Enums and lists.
      {"unknown_schedule",
       H("moe:\n  schedule: deepsped\n"),
       {"job.yaml:4:13: moe.schedule: unknown value; did you mean 'deepspeed'? (got 'deepsped'; "
        "allowed: deepspeed, s1, s2, auto)"}},
      {"unknown_policy",
       H("memory:\n  policy: lazy\n"),
       {"job.yaml:4:11: memory.policy: unknown value (got 'lazy'; allowed: none, full_recompute, "
        "selective, offload, adaptive)"}},
      {"unknown_fault_mode",
       H("fault:\n  mode: boom\n"),
       {"fault.mode: unknown value (got 'boom'; allowed: \"\", crash, hang, exit, health_check)"}},
      {"bad_order",
       H("parallel:\n  order: tp-dp-dp\n"),
       {"job.yaml:4:10: parallel.order: must name tp, dp and pp once each", "got 'tp-dp-dp'",
        "allowed: tp-dp-pp,"}},
      {"duplicate_collective",
       H("commcheck:\n  collectives: [allreduce, alltoall, allreduce]\n"),
       {"job.yaml:4:38: commcheck.collectives[2]: duplicate value (got 'allreduce'; allowed: a "
        "non-empty list of distinct values from: allreduce, allgather, alltoall, broadcast)"}},
      {"unknown_collective",
       H("commcheck:\n  collectives:\n    - allreduse\n"),
       {"job.yaml:5:7: commcheck.collectives[0]: unknown value; did you mean 'allreduce'?"}},
      {"empty_collectives",
       H("commcheck:\n  collectives: []\n"),
       {"job.yaml:4:16: commcheck.collectives: must not be empty"}},

      // Sizes.
      {"bad_unit",
       H("memory:\n  device_budget: 4XB\n"),
       {"job.yaml:4:18: memory.device_budget: unknown size unit 'XB' (got '4XB'; allowed:",
        "KiB, MiB, GiB"}},
      {"negative_size",
       H("memory:\n  device_budget: -1\n"),
       {"job.yaml:4:18: memory.device_budget: size must not be negative (got '-1'"}},
      {"fractional_bytes",
       H("commcheck:\n  min_bytes: 0.1KiB\n"),
       {"job.yaml:4:14: commcheck.min_bytes: not a whole number of bytes"}},
      {"size_not_multiple_of_4",
       H("commcheck:\n  min_bytes: 6\n"),
       {"job.yaml:4:14: commcheck.min_bytes: must be a multiple of 4 bytes (got 6;"}},
      {"size_zero",
       H("commcheck:\n  min_bytes: 0\n"),
       {"job.yaml:4:14: commcheck.min_bytes: must be >= 4 (got '0'; allowed: 4..1GiB"}},
      {"size_above_1gib",
       H("commcheck:\n  max_bytes: 2GiB\n"),
       {"job.yaml:4:14: commcheck.max_bytes: must be <= 1GiB (got '2GiB'; allowed: 4..1GiB"}},
      {"min_bytes_above_max",
       H("commcheck:\n  min_bytes: 1MiB\n  max_bytes: 64KiB\n"),
       {"job.yaml:4:14: commcheck.min_bytes: must be <= commcheck.max_bytes (= 64KiB) (got 1MiB; "
        "allowed: 4..64KiB)"}},

      // Inconsistent sizes across fields.
      {"workers_vs_world",
       H("parallel:\n  dp: 2\n  tp: 2\nresources:\n  workers: 3\n"),
       {"job.yaml:7:12: resources.workers: inconsistent sizes: resources.workers must equal "
        "parallel.pp * parallel.dp * parallel.tp (got 3; allowed: 4 = pp 1 * dp 2 * tp 2)"}},
      {"ep_esp_not_dividing_dp_tp",
       H("parallel:\n  dp: 2\n  ep: 4\n"),
       {"job.yaml:5:7: parallel.ep: inconsistent sizes: ep * esp must divide dp * tp (got ep * "
        "esp = 4 * 1 = 4, dp * tp = 2 * 1 = 2; allowed: ep * esp in {1, 2})"}},
      {"esp_not_dividing",
       H("parallel:\n  dp: 4\n  esp: 3\n"),
       {"job.yaml:5:8: parallel.esp: inconsistent sizes: ep * esp must divide dp * tp"}},
      {"world_too_large",
       H("parallel:\n  dp: 65536\n  tp: 65536\n"),
       {"job.yaml:4:7: parallel.dp: inconsistent sizes: pp * dp * tp is too large (got 1 * 65536 * "
        "65536 = 4294967296; allowed: pp * dp * tp <= 2147483647)"}},
      {"heads_mod_tp",
       H("model:\n  d_model: 96\n  heads: 4\nparallel:\n  tp: 3\n"),
       {"job.yaml:7:7: parallel.tp: inconsistent sizes: must divide model.heads (= 4) (got 3; "
        "allowed: 1, 2, 4)"}},
      {"experts_mod_ep",
       H("parallel:\n  dp: 4\n  ep: 4\nmoe:\n  experts: 6\n"),
       {"job.yaml:5:7: parallel.ep: inconsistent sizes: must divide moe.experts (= 6) (got 4; "
        "allowed: 1, 2, 3, 6)"}},
      {"pp_above_layers",
       H("parallel:\n  pp: 3\n"),
       {"job.yaml:4:7: parallel.pp: inconsistent sizes: must be <= model.layers (= 2)",
        "(got 3; allowed: 1..2)"}},
      {"expert_ffn_mod_esp",
       H("model:\n  expert_ffn: 100\nparallel:\n  dp: 8\n  esp: 8\n"),
       {"job.yaml:7:8: parallel.esp: inconsistent sizes: must divide model.expert_ffn (= 100)"}},
      {"d_model_mod_heads",
       H("model:\n  d_model: 30\n"),
       {"job.yaml:4:12: model.d_model: inconsistent sizes: must be a multiple of model.heads (= 4) "
        "(got 30; allowed: multiples of 4)"}},
      {"top_k_above_experts",
       H("moe:\n  experts: 4\n  top_k: 5\n"),
       {"job.yaml:5:10: moe.top_k: must be <= moe.experts (= 4) (got 5; allowed: 1..4)"}},
      {"default_top_k_above_experts",
       H("moe:\n  experts: 1\n"),
       {"job.yaml:4:12: moe.top_k: must be <= moe.experts (= 1) (got 2, the default; allowed: "
        "1..1)"}},
      {"fault_rank_outside_world",
       H("parallel:\n  dp: 2\nfault:\n  mode: crash\n  rank: 2\n"),
       {"job.yaml:7:9: fault.rank: must be < the world size pp * dp * tp (= 2) (got 2; allowed: "
        "0..1)"}},
      {"warmup_above_steps",
       H("train:\n  steps: 10\n  warmup: 20\n"),
       {"job.yaml:5:11: train.warmup: must be <= train.steps (= 10) (got 20; allowed: 0..10)"}},
      {"min_lr_above_lr",
       H("train:\n  lr: 0.001\n  min_lr: 0.01\n"),
       {"job.yaml:5:11: train.min_lr: must be <= train.lr (= 0.001)"}},
      // Accepted means used: a field another field's setting leaves unused is refused.
      {"min_lr_with_a_constant_schedule",
       H("train:\n  schedule: constant\n  min_lr: 0\n"),
       {"train.min_lr: only used by train.schedule cosine (the floor it decays to) (got 0 with "
        "schedule constant; allowed: omit it, or set train.schedule: cosine)"}},
      {"data_seed_with_a_token_file",
       H("data:\n  source: tokens\n  path: /d/t.tok\n  seed: 3\n"),
       {"data.seed: only used when data.source is markov"}},
      {"spike_fields_without_spikes",
       H("moe:\n  spikes:\n    seed: 3\n"),
       {"moe.spikes.seed: only used when moe.spikes.probability > 0 (no spike is injected at 0)"}},
      {"commcheck_micro_batches",
       "name: c\nkind: commcheck\nparallel:\n  micro_batches: 4\n",
       {"job.yaml:4:18: parallel.micro_batches: applies to train jobs only"}},
      {"commcheck_shrink_ep",
       "name: c\nkind: commcheck\nparallel: {dp: 4}\nrecovery:\n  shrink:\n    - {dp: 2, ep: 2}\n",
       {"recovery.shrink[0].ep: applies to train jobs only"}},
      {"fault_after_the_last_step",
       H("train: {steps: 10}\nfault: {mode: crash, at_step: 11}\n"),
       {"fault.at_step: must be <= the job's last step (train.steps = 10): the fault would never "
        "be injected (got 11; allowed: 0..10)"}},
      {"fault_after_the_last_round",
       "name: c\nkind: commcheck\ncommcheck: {rounds: 2}\nfault: {mode: exit, at_step: 3}\n",
       {"fault.at_step: must be <= the job's last round (commcheck.rounds = 2)"}},
      {"mean_steps_without_a_mode",
       H("fault:\n  mean_steps: 50\n"),
       {"fault.mean_steps: only used with fault.mode (no fault is injected without one)"}},
      {"fault_fields_without_a_mode",
       H("fault:\n  rank: 0\n  at_step: 3\n"),
       {"fault.rank: only used with fault.mode (no fault is injected without one)"}},
      {"backoff_max_below_initial",
       H("recovery:\n  backoff:\n    initial_s: 60\n"),
       {"job.yaml:5:16: recovery.backoff.max_s: must be >= recovery.backoff.initial_s (= 60) (got "
        "30, the default; allowed: >= 60)"}},
      {"tokens_without_path",
       H("data:\n  source: tokens\n"),
       {"job.yaml:4:11: data.path: required when data.source is tokens (allowed: the path of a "
        "token file)"}},
      {"path_with_markov",
       H("data:\n  path: /x\n"),
       {"job.yaml:4:9: data.path: only used when data.source is tokens"}},
      {"indexed_without_path",
       H("data:\n  source: indexed\n"),
       {"job.yaml:4:11: data.path: required when data.source is indexed (or data.blend) "
        "(allowed: an indexed-dataset prefix (PREFIX.bin and PREFIX.idx))"}},
      {"source_not_allowed",
       H("data:\n  source: megatron\n"),
       {"data.source:", "megatron", "markov, tokens, indexed"}},
      {"blend_with_tokens",
       H("data:\n  source: tokens\n  path: /t\n  blend: [{path: /a, weight: 1}]\n"),
       {"data.blend: only used when data.source is indexed"}},
      {"blend_and_path",
       H("data:\n  source: indexed\n  path: /p\n  blend: [{path: /a, weight: 1}]\n"),
       {"data.blend: give either data.path or data.blend, not both"}},
      {"blend_weight_not_positive",
       H("data:\n  source: indexed\n  blend: [{path: /a, weight: 0}]\n"),
       {"data.blend[0].weight:", "allowed: > 0"}},
      {"blend_share_below_a_slot",
       H("data:\n  source: indexed\n  blend: [{path: /a, weight: 1}, {path: /b, weight: 1e-5}]\n"),
       {"job.yaml:5:53: data.blend[1].weight: is below 1/4096 of the blend, the smallest share it "
        "lays out (got 1e-05 of 1.00001 in all; allowed: a weight >= 1/4096 of the weights' sum)"}},
      // Half a slot was rounded up to one (twice its weight's share) by the largest remainder.
      {"blend_share_half_a_slot",
       H("data:\n  source: indexed\n  blend: [{path: /a, weight: 1}, {path: /b, weight: 8000}]\n"),
       {"data.blend[0].weight: is below 1/4096 of the blend"}},
      {"blend_weights_overflow",
       H("data:\n  source: indexed\n  blend: [{path: /a, weight: 1e308}, {path: /b, weight: "
         "1e308}]\n"),
       {"data.blend: the weights' sum is not a finite number (got inf; allowed: positive weights "
        "whose sum is finite; only their ratios matter)"}},
      {"validation_is_a_blend_path",
       H("data:\n  source: indexed\n  blend: [{path: /a}, {path: /b}]\n"
         "  validation: {path: /b}\n"),
       {"data.validation.path: is the training data (data.blend[1].path): its loss would be "
        "measured on what is trained on"}},
      {"validation_fraction_too_large",
       H("data:\n  source: tokens\n  path: /t\n  validation: {fraction: 0.7}\n"),
       {"data.validation.fraction:", "0.7", "(0, 0.5]"}},
      {"validation_fraction_and_path",
       H("data:\n  source: tokens\n  path: /t\n  validation: {fraction: 0.1, path: /v}\n"),
       {"data.validation.fraction: give either data.validation.fraction or "
        "data.validation.path, not both"}},
      {"validation_with_markov",
       H("data:\n  validation: {fraction: 0.1}\n"),
       {"data.validation.fraction: not used with data.source markov"}},
      {"eval_without_batches",
       H("eval:\n  every: 10\n"),
       {"job.yaml:4:10: eval.batches: must be >= 1 when eval.every is set (got 0, the default; "
        "allowed: 1 or more held-out micro-batches"}},
      {"eval_batches_without_every",
       H("eval:\n  batches: 4\n"),
       {"job.yaml:4:12: eval.batches: only used when eval.every > 0"}},
      {"eval_on_token_data_without_validation",
       H("data:\n  source: tokens\n  path: /x\neval:\n  every: 10\n  batches: 2\n"),
       {"eval.every: needs held-out data: data.source tokens needs data.validation", "(got 10;"}},
      {"tokenizer_with_markov",
       H("data:\n  tokenizer: byte\n"),
       {"job.yaml:4:14: data.tokenizer: only used with token data",
        "omit it, or set "
        "data.source: tokens"}},
      {"tokenizer_with_indexed",
       H("data:\n  source: indexed\n  path: /p\n  tokenizer: byte\n"),
       {"data.tokenizer: only used with token data", "'byte' with source indexed"}},
      {"tokenizer_empty",
       H("data:\n  source: tokens\n  path: /x\n  tokenizer: \"\"\n"),
       {"job.yaml:6:14: data.tokenizer: empty", "byte, or the path of a SentencePiece"}},
      {"validation_is_the_training_data",
       H("data:\n  source: tokens\n  path: /d/t.tokens\n  validation: {path: /d/t.tokens}\n"),
       {"data.validation.path: is the training data: its loss would be measured on what is "
        "trained on",
        "(got '/d/t.tokens';", "allowed: a held-out file, or data.validation.fraction"}},
      {"markov_vocab_too_large",
       H("model:\n  vocab: 50304\n"),
       {"model.vocab: too large for data.source markov (a dense vocab x vocab chain in every "
        "rank; at most 4096)",
        "(got 50304 (37.7 GiB a rank);",
        "allowed: model.vocab <= 4096, or data.source: tokens (furnace data prepare) or indexed"}},
      // Settings that would be accepted and never act.
      {"moe_every_above_layers",
       H("model:\n  layers: 2\n  moe_every: 5\n"),
       {"job.yaml:5:14: model.moe_every: must be <= model.layers (= 2): layer l is MoE when "
        "(l + 1) is a multiple of moe_every, so no layer would be (got 5; allowed: 1..2)"}},
      {"dense_ffn_without_a_dense_layer",
       H("model:\n  dense_ffn: 128\n"),
       {"job.yaml:4:14: model.dense_ffn: only used by dense layers, and with model.moe_every 1 "
        "every layer is MoE"}},
      {"health_check_fault_on_one_rank",
       H("fault:\n  mode: health_check\n"),
       {"fault.mode: health_check needs two or more ranks"}},
      {"health_check_fault_without_the_check",
       H("parallel:\n  dp: 2\nrecovery:\n  health_check_s: 0\nfault:\n  mode: health_check\n"),
       {"fault.mode: health_check needs recovery.health_check_s > 0"}},
      {"health_check_fault_at_a_step",
       H("parallel:\n  dp: 2\nfault:\n  mode: health_check\n  at_step: 5\n"),
       {"job.yaml:7:12: fault.at_step: not used by fault.mode health_check"}},
      {"exit_code_of_a_crash",
       H("fault:\n  mode: crash\n  exit_code: 7\n"),
       {"job.yaml:5:14: fault.exit_code: only used by fault.mode exit (this fault is crash)"}},
      {"adaptive_without_a_budget",
       H("memory:\n  policy: adaptive\n  codec: fp8\n"),
       {"job.yaml:4:11: memory.device_budget: memory.policy adaptive needs a budget",
        "(got 0, the default;"}},
      {"offload_of_nothing",
       H("memory:\n  policy: offload\n  offload_ratio: 0\n"),
       {"memory.offload_ratio: out of range (got 0; allowed: (0, 1])"}},
      {"checkpoint_interval_past_the_end",
       H("train:\n  steps: 10\ncheckpoint:\n  dir: /c\n  every: 50\n"),
       {"job.yaml:7:10: checkpoint.every: must be <= train.steps (= 10): the interval would never "
        "be reached (got 50; allowed: 1..10, or 0 (only the final checkpoint), or auto)"}},
      {"eval_interval_past_the_end",
       H("train:\n  steps: 10\neval:\n  every: 100\n  batches: 2\n"),
       {"eval.every: must be <= train.steps (= 10)",
        "allowed: 1..10 (10: once, after the last step), or 0 (off)"}},
      {"byte_tokenizer_small_vocab",
       H("model:\n  vocab: 100\ndata:\n  source: tokens\n  path: /x\n  tokenizer: byte\n"),
       {"model.vocab: the byte tokenizer's ids go up to 255",
        "allowed: >= 256 with "
        "data.tokenizer: byte"}},
  };
}

class BadInputTest : public testing::TestWithParam<BadCase> {};

TEST_P(BadInputTest, ReportsFileLineFieldAndAllowed) { testing_util::ExpectRefused(GetParam()); }

INSTANTIATE_TEST_SUITE_P(Table, BadInputTest, testing::ValuesIn(Cases()), testing_util::CaseName);

TEST(BadInputTest, ReportsEveryProblemOncePerLineInFileOrder) {
  absl::StatusOr<furnace::v1::JobSpec> spec = ParseJobYaml(R"(name: j
kind: train
parallel:
  dp: -2
  tpp: 2
moe:
  schedule: fast
train:
  steps: abc
resources:
  device: tpu
)",
                                                           "job.yaml");
  ASSERT_FALSE(spec.ok());
  std::vector<std::string> lines = absl::StrSplit(spec.status().message(), '\n');
  ASSERT_EQ(lines.size(), 5u) << spec.status();
  EXPECT_EQ(lines[0].rfind("job.yaml:4:7: parallel.dp: must be >= 1", 0), 0u) << lines[0];
  EXPECT_EQ(lines[1].rfind("job.yaml:5:3: parallel.tpp: unknown field", 0), 0u) << lines[1];
  EXPECT_EQ(lines[2].rfind("job.yaml:7:13: moe.schedule: unknown value", 0), 0u) << lines[2];
  EXPECT_EQ(lines[3].rfind("job.yaml:9:10: train.steps: expected an integer", 0), 0u) << lines[3];
  EXPECT_EQ(lines[4].rfind("job.yaml:11:11: resources.device: unknown value", 0), 0u) << lines[4];
}

TEST(BadInputTest, FieldWithItsOwnErrorSkipsCrossChecks) {
  // parallel.tp is invalid on its own; no second "inconsistent sizes" message about it.
  absl::StatusOr<furnace::v1::JobSpec> spec = ParseJobYaml(
      "name: j\nkind: train\nparallel:\n  tp: x\nresources:\n  workers: 1\n", "job.yaml");
  ASSERT_FALSE(spec.ok());
  std::vector<std::string> lines = absl::StrSplit(spec.status().message(), '\n');
  EXPECT_EQ(lines.size(), 1u) << spec.status();

  // A refused eval.every (read as 0 after its error) does not make eval.batches "unused".
  spec = ParseJobYaml(H("eval:\n  every: -1\n  batches: 4\n"), "job.yaml");
  ASSERT_FALSE(spec.ok());
  lines = absl::StrSplit(spec.status().message(), '\n');
  EXPECT_EQ(lines.size(), 1u) << spec.status();
  EXPECT_NE(lines[0].find("eval.every: must be >= 0"), std::string::npos) << spec.status();

  // Nor does a misspelt data.source make data.path unused.
  spec = ParseJobYaml(H("data:\n  source: token\n  path: /d/t.tok\n"), "job.yaml");
  ASSERT_FALSE(spec.ok());
  lines = absl::StrSplit(spec.status().message(), '\n');
  EXPECT_EQ(lines.size(), 1u) << spec.status();
  EXPECT_NE(lines[0].find("data.source:"), std::string::npos) << spec.status();
}

// The bytes a status message takes in gRPC's grpc-message header (percent-encoded).
size_t WireBytes(const std::string& text) {
  size_t n = 0;
  for (const char c : text) n += (c < 0x20 || c > 0x7e || c == '%') ? 3 : 1;
  return n;
}

// A refusal reaches the client whatever the file: gRPC refuses a status message that makes its
// headers exceed 8 KiB, so the listed problems stop at 50 and about 4 KB, and the rest are counted.
// A file of 60,000 unknown keys (under the 1 MiB limit) is checked in one pass: keys are indexed,
// not searched (each key against those before it took 13 s for a 1 MiB file).
TEST(BadInputTest, ThousandsOfProblemsAreCountedNotAllListed) {
  constexpr int kKeys = 60000;
  std::string text = H("model:\n");
  for (int i = 0; i < kKeys; ++i) absl::StrAppend(&text, "  k", i, ": 1\n");
  ASSERT_LT(text.size(), kMaxJobFileBytes);
  absl::StatusOr<furnace::v1::JobSpec> spec = ParseJobYaml(text, "job.yaml");
  ASSERT_FALSE(spec.ok());
  const std::string message(spec.status().message());
  EXPECT_LT(WireBytes(message), 4096u);
  std::vector<std::string> lines = absl::StrSplit(message, '\n');
  ASSERT_GE(lines.size(), 2u);
  ASSERT_LE(lines.size(), Diagnostics::kMaxListedProblems + 1);
  EXPECT_EQ(lines[0].rfind("job.yaml:4:3: model.k0: unknown field", 0), 0u) << lines[0];
  const size_t listed = lines.size() - 1;
  EXPECT_EQ(lines.back(), absl::StrCat("job.yaml: ... and ", kKeys - listed,
                                       " more problems not shown (fix these and check again)"));

  // The same key 60,000 times: every repeat is a duplicate, found as fast.
  text = H("train:\n");
  for (int i = 0; i < kKeys; ++i) absl::StrAppend(&text, "  steps: ", i + 1, "\n");
  spec = ParseJobYaml(text, "job.yaml");
  ASSERT_FALSE(spec.ok());
  lines = absl::StrSplit(spec.status().message(), '\n');
  EXPECT_EQ(lines[0], "job.yaml:5:3: train.steps: duplicate field (first set on line 4)");
  EXPECT_EQ(
      lines.back().rfind(
          absl::StrCat("job.yaml: ... and ", kKeys - 1 - (lines.size() - 1), " more problems"), 0),
      0u)
      << lines.back();
}

// Up to the cap every problem is listed, and a long quoted value cannot take the whole message.
TEST(BadInputTest, ListsUpToFiftyProblemsAndCutsLongLines) {
  std::string text = H("resources:\n  device: '" + std::string(20000, 'x') + "'\nmodel:\n");
  for (int i = 0; i < 10; ++i) absl::StrAppend(&text, "  k", i, ": 1\n");
  absl::StatusOr<furnace::v1::JobSpec> spec = ParseJobYaml(text, "job.yaml");
  ASSERT_FALSE(spec.ok());
  const std::string message(spec.status().message());
  EXPECT_LT(WireBytes(message), 4096u);
  std::vector<std::string> lines = absl::StrSplit(message, '\n');
  ASSERT_GE(lines.size(), 2u);
  EXPECT_EQ(lines[0].rfind("job.yaml:4:11: resources.device: unknown value", 0), 0u) << lines[0];
  EXPECT_LE(lines[0].size(), Diagnostics::kMaxLineBytes);
  EXPECT_EQ(lines[0].substr(lines[0].size() - 3), "...");
  EXPECT_EQ(lines[1].rfind("job.yaml:6:3: model.k0: unknown field", 0), 0u) << lines[1];

  text = H("model:\n");
  for (int i = 0; i < 8; ++i) absl::StrAppend(&text, "  k", i, ": 1\n");
  spec = ParseJobYaml(text, "job.yaml");
  ASSERT_FALSE(spec.ok());
  lines = absl::StrSplit(spec.status().message(), '\n');
  EXPECT_EQ(lines.size(), 8u) << spec.status();  // all of them, no count
}

}  // namespace
}  // namespace furnace::spec
