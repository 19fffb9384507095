#include "controller/spec/job_spec.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"

namespace furnace::spec {
namespace {

using furnace::v1::JobSpec;

JobSpec MustParse(std::string_view yaml) {
  absl::StatusOr<JobSpec> spec = ParseJobYaml(yaml, "job.yaml");
  EXPECT_TRUE(spec.ok()) << spec.status();
  return spec.ok() ? *spec : JobSpec();
}

TEST(JobSpecTest, CommcheckConfigParses) {
  absl::StatusOr<JobSpec> spec = LoadJobFile(FURNACE_SOURCE_DIR "/configs/commcheck.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->name(), "commcheck");
  EXPECT_EQ(spec->kind(), "commcheck");
  EXPECT_EQ(spec->parallel().dp(), 4u);
  EXPECT_EQ(spec->parallel().pp(), 1u);
  EXPECT_EQ(spec->parallel().tp(), 1u);
  EXPECT_EQ(WorldSize(*spec), 4u);
  EXPECT_EQ(spec->resources().workers(), 4u);
  const auto& cc = spec->commcheck();
  EXPECT_EQ(cc.min_bytes(), 4096u);
  EXPECT_EQ(cc.max_bytes(), 4u << 20);
  EXPECT_EQ(cc.step_factor(), 4u);
  EXPECT_EQ(cc.iters(), 5u);
  EXPECT_EQ(cc.warmup_iters(), 1u);
  EXPECT_EQ(cc.rounds(), 1u);
  EXPECT_DOUBLE_EQ(cc.timeout_s(), 30.0);
  ASSERT_EQ(cc.collectives_size(), 4);
  EXPECT_EQ(cc.collectives(0), "allreduce");
  EXPECT_EQ(cc.collectives(3), "broadcast");
  EXPECT_EQ(spec->fault().mode(), "");
}

TEST(JobSpecTest, MinimalFileGetsEveryDefault) {
  JobSpec s = MustParse("name: tiny\nkind: train\n");
  EXPECT_EQ(s.name(), "tiny");
  EXPECT_EQ(s.kind(), "train");

  const auto& m = s.model();
  EXPECT_EQ(m.vocab(), 256u);
  EXPECT_EQ(m.seq_len(), 64u);
  EXPECT_EQ(m.d_model(), 64u);
  EXPECT_EQ(m.heads(), 4u);
  EXPECT_EQ(m.layers(), 2u);
  EXPECT_EQ(m.dense_ffn(), 256u);
  EXPECT_EQ(m.moe_every(), 1u);
  EXPECT_EQ(m.expert_ffn(), 256u);

  const auto& p = s.parallel();
  EXPECT_EQ(p.pp(), 1u);
  EXPECT_EQ(p.dp(), 1u);
  EXPECT_EQ(p.tp(), 1u);
  EXPECT_EQ(p.ep(), 1u);
  EXPECT_EQ(p.esp(), 1u);
  EXPECT_EQ(p.micro_batch(), 1u);
  EXPECT_EQ(p.micro_batches(), 1u);
  EXPECT_EQ(p.order(), "tp-dp-pp");

  const auto& moe = s.moe();
  EXPECT_EQ(moe.experts(), 8u);
  EXPECT_EQ(moe.top_k(), 2u);
  EXPECT_DOUBLE_EQ(moe.capacity_factor(), 0.0);
  EXPECT_EQ(moe.schedule(), "deepspeed");
  EXPECT_TRUE(moe.normalize_topk());
  EXPECT_DOUBLE_EQ(moe.aux_alpha(), 0.01);
  EXPECT_DOUBLE_EQ(moe.spikes().probability(), 0.0);
  EXPECT_DOUBLE_EQ(moe.spikes().max_ratio(), 1.0);
  EXPECT_EQ(moe.spikes().seed(), 0u);

  EXPECT_EQ(s.memory().policy(), "none");
  EXPECT_EQ(s.memory().device_budget(), 0u);

  const auto& t = s.train();
  EXPECT_EQ(t.steps(), 100u);
  EXPECT_DOUBLE_EQ(t.lr(), 3e-4);
  EXPECT_DOUBLE_EQ(t.min_lr(), 3e-5);
  EXPECT_EQ(t.warmup(), 0u);
  EXPECT_EQ(t.schedule(), "cosine");
  EXPECT_DOUBLE_EQ(t.clip(), 1.0);
  EXPECT_EQ(t.seed(), 0u);
  EXPECT_DOUBLE_EQ(t.weight_decay(), 0.1);

  EXPECT_EQ(s.data().source(), "markov");
  EXPECT_EQ(s.data().path(), "");
  EXPECT_EQ(s.data().seed(), 0u);

  EXPECT_EQ(s.checkpoint().dir(), "");
  EXPECT_EQ(s.checkpoint().every(), 0u);
  EXPECT_EQ(s.checkpoint().keep(), 2u);
  EXPECT_FALSE(s.checkpoint().async());
  EXPECT_FALSE(s.checkpoint().override_settings());
  EXPECT_DOUBLE_EQ(s.checkpoint().stop_grace_s(), 30);

  const auto& r = s.recovery();
  EXPECT_EQ(r.max_restarts(), 3u);
  EXPECT_DOUBLE_EQ(r.backoff().initial_s(), 1.0);
  EXPECT_DOUBLE_EQ(r.backoff().max_s(), 30.0);
  EXPECT_DOUBLE_EQ(r.backoff().multiplier(), 2.0);
  EXPECT_DOUBLE_EQ(r.heartbeat_timeout_s(), 0.0);  // the controller's --worker-timeout
  EXPECT_DOUBLE_EQ(r.hang_timeout_s(), 60.0);
  EXPECT_DOUBLE_EQ(r.start_timeout_s(), 60.0);

  EXPECT_EQ(s.resources().workers(), 1u);
  EXPECT_EQ(s.resources().device(), "cpu");
  EXPECT_DOUBLE_EQ(s.resources().time_limit_s(), 0);  // no limit

  const auto& cc = s.commcheck();
  EXPECT_EQ(cc.min_bytes(), 4096u);
  EXPECT_EQ(cc.max_bytes(), 4u << 20);
  EXPECT_EQ(cc.step_factor(), 4u);
  EXPECT_EQ(cc.iters(), 5u);
  EXPECT_EQ(cc.warmup_iters(), 1u);
  ASSERT_EQ(cc.collectives_size(), 4);
  EXPECT_EQ(cc.collectives(0), "allreduce");
  EXPECT_EQ(cc.collectives(1), "allgather");
  EXPECT_EQ(cc.collectives(2), "alltoall");
  EXPECT_EQ(cc.collectives(3), "broadcast");
  EXPECT_EQ(cc.rounds(), 1u);
  EXPECT_DOUBLE_EQ(cc.timeout_s(), 30.0);

  const auto& f = s.fault();
  EXPECT_EQ(f.mode(), "");
  EXPECT_EQ(f.rank(), 0);
  EXPECT_EQ(f.at_step(), 0u);
  EXPECT_FALSE(f.every_attempt());
  EXPECT_EQ(f.exit_code(), 1);
}

TEST(JobSpecTest, DerivedDefaultsFollowTheirInputs) {
  JobSpec s = MustParse(R"(name: derived
kind: train
model: {d_model: 128, heads: 8}
moe: {top_k: 1}
train: {lr: 1.0e-3}
parallel: {pp: 2, dp: 3}
)");
  EXPECT_EQ(s.model().dense_ffn(), 512u);
  EXPECT_EQ(s.model().expert_ffn(), 512u);
  EXPECT_FALSE(s.moe().normalize_topk());
  EXPECT_DOUBLE_EQ(s.train().min_lr(), 1e-4);
  EXPECT_EQ(s.resources().workers(), 6u);
  EXPECT_EQ(WorldSize(s), 6u);
}

// Every field of the schema, set away from its default (controller/spec/field_uses.h: every field
// is implemented): FullJob() a train job with every field but the commcheck section's, which only
// a commcheck reads (kFullCommcheck; a train job refuses it).
constexpr char kFullCommcheck[] = R"(commcheck:
  min_bytes: 1KB
  max_bytes: 1GiB
  step_factor: 2
  iters: 1
  warmup_iters: 0
  collectives: [broadcast, alltoall]
  rounds: 3
  timeout_s: 0.5
)";

std::string FullJob() {
  return absl::StrReplaceAll(
      R"(name: full-job_1
kind: train
model:
  vocab: 512
  seq_len: 128
  d_model: 96
  heads: 6
  layers: 4
  dense_ffn: 100
  moe_every: 2
  expert_ffn: 200
  precision: bf16
parallel:
  pp: 2
  dp: 2
  tp: 2
  ep: 2
  esp: 2
  micro_batch: 4
  micro_batches: 8
  order: pp-dp-tp
moe:
  experts: 4
  top_k: 1
  capacity_factor: 1.25
  schedule: s2
  normalize_topk: true
  aux_alpha: 0
  spikes: {SPIKES}
memory: {policy: {POLICY}, device_budget: 512MiB, host_link_gbps: 55, codec: bf16}
train:
  steps: 50
  lr: 0.001
  warmup: 50
  schedule: constant
  clip: 0
  seed: 7
  weight_decay: 0
data: {source: tokens, path: /data/tokens.bin}
checkpoint: {dir: /ckpt, every: 10, keep: 1, async: true, override_settings: true}
recovery:
  max_restarts: 0
  backoff: {initial_s: 0.5, max_s: 0.5, multiplier: 1}
  heartbeat_timeout_s: 2.5
  hang_timeout_s: 5
  start_timeout_s: 7
resources: {workers: 8, device: {DEVICE}}
fault: {mode: exit, rank: 7, at_step: 3, every_attempt: true, exit_code: 255}
)",
      {{"{SPIKES}", "{probability: 0.5, max_ratio: 4, seed: 18446744073709551615}"},
       {"{POLICY}", "adaptive"},
       {"{DEVICE}", "emulated"}});
}

TEST(JobSpecTest, EveryFieldCanBeSet) {
  JobSpec s = MustParse(FullJob());
  EXPECT_EQ(s.name(), "full-job_1");
  EXPECT_EQ(s.model().dense_ffn(), 100u);
  EXPECT_EQ(s.model().expert_ffn(), 200u);
  EXPECT_EQ(s.parallel().order(), "pp-dp-tp");
  EXPECT_EQ(s.parallel().micro_batches(), 8u);
  EXPECT_DOUBLE_EQ(s.moe().capacity_factor(), 1.25);
  EXPECT_EQ(s.moe().schedule(), "s2");
  EXPECT_TRUE(s.moe().normalize_topk());
  EXPECT_DOUBLE_EQ(s.moe().spikes().probability(), 0.5);
  EXPECT_DOUBLE_EQ(s.moe().spikes().max_ratio(), 4.0);  // = experts / top_k, the largest allowed
  EXPECT_EQ(s.moe().spikes().seed(), 18446744073709551615u);
  EXPECT_EQ(s.memory().policy(), "adaptive");
  EXPECT_EQ(s.memory().device_budget(), 512ull << 20);
  EXPECT_DOUBLE_EQ(s.memory().host_link_gbps(), 55.0);
  EXPECT_EQ(s.memory().codec(), "bf16");
  EXPECT_EQ(s.train().schedule(), "constant");
  EXPECT_EQ(s.train().warmup(), 50u);
  // Fields that only another field's setting uses, set with it (FullJob sets the other one):
  // train.min_lr with the cosine schedule, data.seed with markov data.
  const JobSpec cosine =
      MustParse("name: m\nkind: train\ntrain: {min_lr: 0}\ndata: {source: markov, seed: 3}\n");
  EXPECT_DOUBLE_EQ(cosine.train().min_lr(), 0.0);
  EXPECT_EQ(cosine.data().seed(), 3u);
  EXPECT_EQ(s.data().path(), "/data/tokens.bin");
  EXPECT_TRUE(s.checkpoint().async());
  EXPECT_TRUE(s.checkpoint().override_settings());
  EXPECT_EQ(s.recovery().max_restarts(), 0u);
  EXPECT_DOUBLE_EQ(s.recovery().backoff().max_s(), 0.5);
  EXPECT_EQ(s.resources().workers(), 8u);
  EXPECT_EQ(s.resources().device(), "emulated");
  EXPECT_EQ(s.model().precision(), "bf16");
  const JobSpec cc = MustParse(absl::StrCat("name: cc\nkind: commcheck\n", kFullCommcheck));
  EXPECT_EQ(cc.commcheck().min_bytes(), 1000u);
  EXPECT_EQ(cc.commcheck().max_bytes(), 1ull << 30);
  ASSERT_EQ(cc.commcheck().collectives_size(), 2);
  EXPECT_EQ(cc.commcheck().collectives(0), "broadcast");
  EXPECT_EQ(s.fault().mode(), "exit");
  EXPECT_EQ(s.fault().rank(), 7);
  EXPECT_EQ(s.fault().exit_code(), 255);
}

// A section only the other kind reads is refused, not accepted and ignored.
TEST(JobSpecTest, ASectionOfTheOtherKindIsRefused) {
  absl::StatusOr<JobSpec> train = ParseJobYaml(FullJob() + kFullCommcheck, "job.yaml");
  ASSERT_FALSE(train.ok());
  EXPECT_NE(std::string(train.status().message())
                .find("commcheck: applies to commcheck jobs only (a train job runs no commcheck)"),
            std::string::npos)
      << train.status();
  for (const char* section :
       {"model: {precision: bf16}", "moe: {experts: 4}", "memory: {}", "train: {steps: 5}",
        "data: {seed: 3}", "checkpoint: {every: 2}", "eval: {every: 2}"}) {
    absl::StatusOr<JobSpec> cc = ParseJobYaml(
        absl::StrCat("name: cc\nkind: commcheck\nresources: {device: emulated}\n", section, "\n"),
        "job.yaml");
    ASSERT_FALSE(cc.ok()) << section;
    const std::string message(cc.status().message());
    EXPECT_NE(message.find(": applies to train jobs only (a commcheck builds no model and trains "
                           "nothing)"),
              std::string::npos)
        << message;
    EXPECT_NE(message.find("or kind: train"), std::string::npos) << message;
  }
}

TEST(JobSpecTest, EvalIsOffByDefaultAndParses) {
  const JobSpec off = MustParse("name: j\nkind: train\n");
  EXPECT_EQ(off.eval().every(), 0u);
  EXPECT_EQ(off.eval().batches(), 0u);
  const JobSpec on = MustParse("name: j\nkind: train\neval:\n  every: 25\n  batches: 4\n");
  EXPECT_EQ(on.eval().every(), 25u);
  EXPECT_EQ(on.eval().batches(), 4u);
}

// resources.device: cpu (the default), cuda and emulated for a train job; model.precision: fp32
// (the default) or bf16, which a discrete device runs.
TEST(JobSpecTest, DevicesAndPrecisions) {
  const JobSpec plain = MustParse("name: j\nkind: train\n");
  EXPECT_EQ(plain.resources().device(), "cpu");
  EXPECT_EQ(plain.model().precision(), "fp32");
  for (const char* device : {"cpu", "cuda", "emulated"}) {
    SCOPED_TRACE(device);
    const JobSpec s =
        MustParse(absl::StrCat("name: j\nkind: train\nresources: {device: ", device, "}\n"));
    EXPECT_EQ(s.resources().device(), device);
  }
  for (const char* device : {"cuda", "emulated"}) {
    SCOPED_TRACE(device);
    const JobSpec s = MustParse(absl::StrCat(
        "name: j\nkind: train\nmodel: {precision: bf16}\nresources: {device: ", device, "}\n"));
    EXPECT_EQ(s.model().precision(), "bf16");
  }
}

// bf16 on the CPU is refused at the line that set it, naming the field, the value and what is
// allowed.
TEST(JobSpecTest, Bf16OnTheCpuIsRefused) {
  absl::StatusOr<JobSpec> spec =
      ParseJobYaml("name: j\nkind: train\nmodel:\n  precision: bf16\n", "job.yaml");
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  const std::string message(spec.status().message());
  EXPECT_EQ(message.rfind("job.yaml:4:14: model.precision: bf16 runs on a discrete device", 0), 0u)
      << message;
  EXPECT_NE(message.find("(got 'bf16'; allowed: fp32 with resources.device cpu, or bf16 with "
                         "cuda or emulated)"),
            std::string::npos)
      << message;
  absl::StatusOr<JobSpec> bad =
      ParseJobYaml("name: j\nkind: train\nmodel:\n  precision: fp16\n", "job.yaml");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(
      std::string(bad.status().message()).rfind("job.yaml:4:14: model.precision: unknown value", 0),
      0u)
      << bad.status();
}

// model.attention_probs: stored (the default) or recomputed, on every device; anything else is
// refused at its line, naming the field and the two values.
TEST(JobSpecTest, AttentionProbsStoredOrRecomputed) {
  EXPECT_EQ(MustParse("name: j\nkind: train\n").model().attention_probs(), "stored");
  for (const char* device : {"cpu", "cuda", "emulated"}) {
    SCOPED_TRACE(device);
    const JobSpec s = MustParse(absl::StrCat(
        "name: j\nkind: train\nmodel: {attention_probs: recomputed}\nresources: {device: ", device,
        "}\n"));
    EXPECT_EQ(s.model().attention_probs(), "recomputed");
  }
  absl::StatusOr<JobSpec> bad =
      ParseJobYaml("name: j\nkind: train\nmodel:\n  attention_probs: flash\n", "job.yaml");
  ASSERT_FALSE(bad.ok());
  const std::string message(bad.status().message());
  EXPECT_EQ(message.rfind("job.yaml:4:20: model.attention_probs: unknown value", 0), 0u) << message;
  EXPECT_NE(message.find("stored, recomputed"), std::string::npos) << message;
}

// A commcheck runs its collectives on the ranks' device (NCCL between GPUs), so it takes one too.
TEST(JobSpecTest, ACommcheckTakesADevice) {
  for (const char* device : {"cpu", "cuda", "emulated"}) {
    absl::StatusOr<JobSpec> spec = ParseJobYaml(
        absl::StrCat("name: j\nkind: commcheck\nresources: {device: ", device, "}\n"), "job.yaml");
    ASSERT_TRUE(spec.ok()) << device << ": " << spec.status();
    EXPECT_EQ(spec->resources().device(), device);
  }
  absl::StatusOr<JobSpec> bad =
      ParseJobYaml("name: j\nkind: commcheck\nresources: {device: tpu}\n", "job.yaml");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(std::string(bad.status().message()).find("resources.device"), std::string::npos)
      << bad.status();
}

TEST(JobSpecTest, AsyncCheckpointsAreAccepted) {
  JobSpec s = MustParse("name: a\nkind: train\ncheckpoint: {dir: /ckpt, every: 5, async: true}\n");
  EXPECT_TRUE(s.checkpoint().async());
}

TEST(JobSpecTest, IndexedBlendsAndTheHeldOutSplitAreRead) {
  JobSpec s = MustParse(
      "name: a\nkind: train\ndata:\n  source: indexed\n  blend: [{path: /a, weight: 0.7}, "
      "{path: /b}]\n  validation: {fraction: 0.05}\neval: {every: 5, batches: 1}\n");
  ASSERT_EQ(s.data().blend_size(), 2);
  EXPECT_EQ(s.data().blend(0).path(), "/a");
  EXPECT_EQ(s.data().blend(0).weight(), 0.7);
  EXPECT_EQ(s.data().blend(1).weight(), 1.0);  // default weight
  EXPECT_EQ(s.data().validation().fraction(), 0.05);
  JobSpec own = MustParse(
      "name: a\nkind: train\ndata: {source: tokens, path: /t, validation: {path: /v}}\n"
      "eval: {every: 5, batches: 1}\n");
  EXPECT_EQ(own.data().validation().path(), "/v");
  EXPECT_FALSE(MustParse("name: a\nkind: train\n").data().has_validation());
}

// checkpoint.every takes a step count or the word auto (Young/Daly: every_auto, every 0); anything
// else is refused naming both.
TEST(JobSpecTest, CheckpointEveryIsStepsOrAuto) {
  JobSpec s = MustParse("name: a\nkind: train\ncheckpoint: {every: auto}\n");
  EXPECT_TRUE(s.checkpoint().every_auto());
  EXPECT_EQ(s.checkpoint().every(), 0u);
  s = MustParse("name: a\nkind: train\ncheckpoint: {every: 25}\n");
  EXPECT_FALSE(s.checkpoint().every_auto());
  EXPECT_EQ(s.checkpoint().every(), 25u);
  for (const char* bad : {"sometimes", "\"auto\"", "-1", "Auto"}) {
    absl::StatusOr<JobSpec> spec = ParseJobYaml(
        absl::StrCat("name: a\nkind: train\ncheckpoint: {every: ", bad, "}\n"), "job.yaml");
    ASSERT_FALSE(spec.ok()) << bad;
    const std::string message(spec.status().message());
    EXPECT_NE(message.find("checkpoint.every"), std::string::npos) << message;
    EXPECT_NE(message.find("0..4294967295, or auto"), std::string::npos) << message;
  }
}

// checkpoint.stop_grace_s: how long a cancel or a drain lets the ranks checkpoint their step; 0
// stops them at once; at most an hour.
TEST(JobSpecTest, CheckpointStopGraceIsSecondsUpToAnHour) {
  EXPECT_DOUBLE_EQ(MustParse("name: a\nkind: train\ncheckpoint: {stop_grace_s: 0}\n")
                       .checkpoint()
                       .stop_grace_s(),
                   0);
  EXPECT_DOUBLE_EQ(MustParse("name: a\nkind: train\ncheckpoint: {stop_grace_s: 120}\n")
                       .checkpoint()
                       .stop_grace_s(),
                   120);
  for (const char* bad : {"-1", "3601", "soon"}) {
    absl::StatusOr<JobSpec> spec = ParseJobYaml(
        absl::StrCat("name: a\nkind: train\ncheckpoint: {stop_grace_s: ", bad, "}\n"), "job.yaml");
    ASSERT_FALSE(spec.ok()) << bad;
    EXPECT_NE(spec.status().message().find("checkpoint.stop_grace_s"), absl::string_view::npos)
        << spec.status().message();
  }
}

// resources.time_limit_s: seconds from the job's first start, 0 (none) to a year.
TEST(JobSpecTest, TimeLimitIsSecondsUpToAYear) {
  EXPECT_DOUBLE_EQ(MustParse("name: a\nkind: train\nresources: {time_limit_s: 7200}\n")
                       .resources()
                       .time_limit_s(),
                   7200);
  for (const char* bad : {"-1", "31622401", "2h"}) {
    absl::StatusOr<JobSpec> spec = ParseJobYaml(
        absl::StrCat("name: a\nkind: train\nresources: {time_limit_s: ", bad, "}\n"), "job.yaml");
    ASSERT_FALSE(spec.ok()) << bad;
    EXPECT_NE(spec.status().message().find("resources.time_limit_s"), absl::string_view::npos)
        << spec.status().message();
    EXPECT_NE(spec.status().message().find("31622400"), absl::string_view::npos)
        << spec.status().message();
  }
}

// fault.mean_steps fails at random training steps: not with fault.at_step, not in a commcheck.
TEST(JobSpecTest, FaultMeanStepsIsForTrainJobsWithoutAtStep) {
  EXPECT_EQ(MustParse("name: a\nkind: train\nfault: {mode: crash, mean_steps: 200}\n")
                .fault()
                .mean_steps(),
            200u);
  absl::StatusOr<JobSpec> both = ParseJobYaml(
      "name: a\nkind: train\nfault: {mode: crash, mean_steps: 200, at_step: 5}\n", "job.yaml");
  ASSERT_FALSE(both.ok());
  EXPECT_NE(both.status().message().find("fault.mean_steps: fails at random steps"),
            std::string::npos)
      << both.status();
  absl::StatusOr<JobSpec> commcheck =
      ParseJobYaml("name: a\nkind: commcheck\nfault: {mode: crash, mean_steps: 200}\n", "job.yaml");
  ASSERT_FALSE(commcheck.ok());
  EXPECT_NE(commcheck.status().message().find("fault.mean_steps: counts training steps"),
            std::string::npos)
      << commcheck.status();
}

// Every memory policy runs; a codec is for the adaptive planner only, and an unknown one is
// refused naming the allowed values.
TEST(JobSpecTest, MemoryPoliciesAreAccepted) {
  for (const char* policy : {"none", "selective", "full_recompute", "offload"}) {
    EXPECT_EQ(MustParse(absl::StrCat("name: a\nkind: train\nmemory: {policy: ", policy, "}\n"))
                  .memory()
                  .policy(),
              policy);
  }
  const JobSpec adaptive =
      MustParse("name: a\nkind: train\nmemory: {policy: adaptive, device_budget: 1GiB}\n");
  EXPECT_EQ(adaptive.memory().policy(), "adaptive");
  EXPECT_EQ(adaptive.memory().codec(), "none");
  // Without a budget its planner would never act: refused, naming the field.
  absl::StatusOr<JobSpec> unbudgeted =
      ParseJobYaml("name: a\nkind: train\nmemory: {policy: adaptive}\n", "job.yaml");
  ASSERT_FALSE(unbudgeted.ok());
  EXPECT_NE(unbudgeted.status().message().find(
                "memory.device_budget: memory.policy adaptive needs a budget"),
            std::string::npos)
      << unbudgeted.status();
  absl::StatusOr<JobSpec> codec =
      ParseJobYaml("name: a\nkind: train\nmemory: {policy: offload, codec: fp8}\n", "job.yaml");
  ASSERT_FALSE(codec.ok());
  EXPECT_NE(codec.status().message().find("memory.codec: applies only to memory.policy adaptive"),
            std::string::npos)
      << codec.status();
  absl::StatusOr<JobSpec> unknown = ParseJobYaml(
      "name: a\nkind: train\nmemory: {policy: adaptive, codec: int4, device_budget: 1GiB}\n",
      "job.yaml");
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.status().message().find("memory.codec"), std::string::npos) << unknown.status();
  EXPECT_NE(unknown.status().message().find("none, bf16, fp8"), std::string::npos)
      << unknown.status();
}

// The offload settings under another policy would be accepted and ignored: refused, naming them.
TEST(JobSpecTest, OffloadSettingsWithoutTheOffloadPolicyAreRefused) {
  for (const char* memory : {"{policy: selective, offload_ratio: 0.25}", "{host_link_gbps: 55}"}) {
    absl::StatusOr<JobSpec> spec =
        ParseJobYaml(absl::StrCat("name: a\nkind: train\nmemory: ", memory, "\n"), "job.yaml");
    ASSERT_FALSE(spec.ok()) << memory;
    EXPECT_NE(spec.status().message().find("applies only to memory.policy offload"),
              std::string::npos)
        << spec.status();
  }
  // The host link also paces the adaptive planner's offloads.
  EXPECT_EQ(MustParse("name: a\nkind: train\nmemory: {policy: adaptive, device_budget: 1GiB, "
                      "host_link_gbps: 55}\n")
                .memory()
                .host_link_gbps(),
            55.0);
  // Refused by presence, not by value: the default ratio written under another policy too.
  absl::StatusOr<JobSpec> default_ratio = ParseJobYaml(
      "name: a\nkind: train\nmemory: {policy: none, offload_ratio: 0.5}\n", "job.yaml");
  ASSERT_FALSE(default_ratio.ok());
  EXPECT_NE(default_ratio.status().message().find("memory.offload_ratio: applies only"),
            std::string::npos)
      << default_ratio.status();
  absl::StatusOr<JobSpec> spec = ParseJobYaml(
      "name: a\nkind: train\nmemory: {policy: none, offload_ratio: 0.25}\n", "job.yaml");
  ASSERT_FALSE(spec.ok());
  EXPECT_NE(spec.status().message().find("memory.offload_ratio"), std::string::npos)
      << spec.status();
  EXPECT_NE(spec.status().message().find("this job's policy is none"), std::string::npos)
      << spec.status();
}

TEST(JobSpecTest, OffloadPolicyIsAcceptedWithItsRatioAndLink) {
  JobSpec s = MustParse(
      "name: a\nkind: train\nmemory: {policy: offload, offload_ratio: 0.25, host_link_gbps: "
      "55}\n");
  EXPECT_EQ(s.memory().policy(), "offload");
  EXPECT_EQ(s.memory().offload_ratio(), 0.25);
  EXPECT_EQ(s.memory().host_link_gbps(), 55.0);
  s = MustParse("name: a\nkind: train\nmemory: {policy: offload}\n");
  EXPECT_EQ(s.memory().offload_ratio(), 0.5);   // the default share
  EXPECT_EQ(s.memory().host_link_gbps(), 0.0);  // unpaced
}

TEST(JobSpecTest, SizesAcceptUnitStrings) {
  EXPECT_EQ(MustParse("name: a\nkind: train\nmemory: {device_budget: \"1.5GB\"}\n")
                .memory()
                .device_budget(),
            1500000000u);
  EXPECT_EQ(
      MustParse("name: a\nkind: train\nmemory: {device_budget: 4096}\n").memory().device_budget(),
      4096u);
  JobSpec s =
      MustParse("name: a\nkind: commcheck\ncommcheck: {min_bytes: 4KiB, max_bytes: 512MiB}\n");
  EXPECT_EQ(s.commcheck().min_bytes(), 4096u);
  EXPECT_EQ(s.commcheck().max_bytes(), 512ull << 20);
}

TEST(JobSpecTest, EmptySectionsAndCommentsAreFine) {
  JobSpec s = MustParse("# a job\nname: a\nkind: train\nmoe:\ntrain: {}\n");
  EXPECT_EQ(s.moe().experts(), 8u);
  EXPECT_EQ(s.train().steps(), 100u);
}

TEST(JobSpecTest, CommcheckIgnoresModelShape) {
  // A communication check does not build the model, so pp=4 may exceed model.layers (2).
  JobSpec s = MustParse("name: a\nkind: commcheck\nparallel: {pp: 4, tp: 8}\n");
  EXPECT_EQ(WorldSize(s), 32u);
  EXPECT_FALSE(ParseJobYaml("name: a\nkind: train\nparallel: {pp: 4}\n", "job.yaml").ok());
}

TEST(JobSpecTest, LoadJobFileReportsIoErrors) {
  absl::StatusOr<JobSpec> missing = LoadJobFile("/nonexistent/furnace/job.yaml");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("/nonexistent/furnace/job.yaml"), std::string::npos);
  EXPECT_EQ(LoadJobFile(FURNACE_SOURCE_DIR "/configs").status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(JobSpecTest, ErrorsNameTheLoadedFile) {
  const std::string path = testing::TempDir() + "/spec_test_bad_job.yaml";
  {
    std::ofstream out(path);
    out << "name: a\nkind: trian\n";
  }
  absl::StatusOr<JobSpec> spec = LoadJobFile(path);
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(spec.status().message().find(path + ":2:7: kind: unknown value; did you mean 'train'?"),
            std::string::npos)
      << spec.status();
  std::remove(path.c_str());
}

}  // namespace
}  // namespace furnace::spec
