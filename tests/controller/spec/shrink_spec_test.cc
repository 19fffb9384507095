// recovery.shrink and the restart ladder's recovery fields: defaults, sizes taken from the job's
// own layout, and refusals at submit that name the field, the value and what is allowed.
#include <gtest/gtest.h>

#include <string>

#include "controller/spec/job_spec.h"
#include "tests/controller/spec/refusal_case.h"

namespace furnace::spec {
namespace {

using testing_util::ExpectRefused;
using testing_util::RefusalCase;

// A dp 4, ep 4 job (4 experts) with micro_batches 3; `recovery` is appended under recovery:.
std::string Job(const std::string& recovery) {
  return "name: j\nkind: train\nparallel: {dp: 4, ep: 4, micro_batches: 3}\nmoe: {experts: 4}\n"
         "recovery:\n" +
         recovery;
}

TEST(ShrinkSpecTest, DefaultsOfTheLadder) {
  auto spec = ParseJobYaml("name: j\nkind: train\n", "job.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->recovery().max_attempts_without_progress(), 3u);
  EXPECT_EQ(spec->recovery().health_check_s(), 10.0);
  EXPECT_EQ(spec->recovery().exclude_s(), 300.0);
  EXPECT_EQ(spec->recovery().wait_for_workers_s(), 300.0);
  EXPECT_EQ(spec->recovery().shrink_size(), 0);
}

TEST(ShrinkSpecTest, HealthCheckDefaultLeavesTheHangWatchdogRoom) {
  auto spec = ParseJobYaml("name: j\nkind: train\nrecovery: {hang_timeout_s: 8}\n", "job.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->recovery().health_check_s(), 4.0);
}

TEST(ShrinkSpecTest, LeftOutSizesAreTheJobsOwn) {
  auto spec =
      ParseJobYaml(Job("  shrink:\n    - {dp: 2, ep: 2}\n    - {dp: 1, ep: 1}\n"), "job.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  ASSERT_EQ(spec->recovery().shrink_size(), 2);
  const auto& l = spec->recovery().shrink(1);
  EXPECT_EQ(l.pp(), 1u);
  EXPECT_EQ(l.dp(), 1u);
  EXPECT_EQ(l.tp(), 1u);
  EXPECT_EQ(l.ep(), 1u);
  EXPECT_EQ(l.esp(), 1u);
}

TEST(ShrinkSpecTest, BadLayoutsAreRefusedByField) {
  const RefusalCase cases[] = {
      // ep 4 (the job's) does not divide dp 2 * tp 1.
      {"ep_left_at_the_jobs",
       Job("  shrink:\n    - {dp: 2}\n"),
       {"recovery.shrink[0].ep: inconsistent sizes: ep * esp must divide dp * tp",
        "(the job's parallel.ep)"}},
      {"not_smaller",
       Job("  shrink:\n    - {dp: 4, ep: 2}\n"),
       {"recovery.shrink[0]: a shrink layout must have fewer ranks than the job's layout (4 "
        "ranks); list them largest first"}},
      {"not_largest_first",
       Job("  shrink:\n    - {dp: 1, ep: 1}\n    - {dp: 2, ep: 2}\n"),
       {"recovery.shrink[1]: a shrink layout must have fewer ranks than recovery.shrink[0] (1 "
        "ranks)"}},
      // micro_batches 1 * dp 4 over dp 3: 4/3 micro-batches per step.
      {"global_batch_not_whole",
       "name: j\nkind: train\nparallel: {dp: 4}\nrecovery:\n  shrink:\n    - {dp: 3}\n",
       {"job.yaml:6:12: recovery.shrink[0].dp: keeping the global batch (micro_batch * "
        "micro_batches * dp = 1 * 1 * 4) needs parallel.micro_batches * parallel.dp (= 4) to "
        "divide by this dp (got 3; allowed: divisors of 4)"}},
      {"unknown_key",
       Job("  shrink:\n    - {dp: 2, ep: 2, cp: 2}\n"),
       {"recovery.shrink[0].cp: unknown field"}},
      {"not_a_list", Job("  shrink: {dp: 2}\n"), {"recovery.shrink: expected a list"}},
      {"zero_size", Job("  shrink:\n    - {dp: 0}\n"), {"recovery.shrink[0].dp: must be >= 1"}},
      {"negative_wait",
       Job("  wait_for_workers_s: -1\n"),
       {"recovery.wait_for_workers_s: out of range"}},
      // s1 at tp 3 after a shrink: 1 * 64 tokens do not split over 3 peers.
      {"s1_split_not_even",
       "name: j\nkind: train\nmodel: {seq_len: 64, heads: 12, d_model: 96}\n"
       "moe: {schedule: s1}\nparallel: {dp: 2, tp: 2, micro_batches: 3}\nrecovery:\n"
       "  shrink:\n    - {dp: 1, tp: 3}\n",
       {"recovery.shrink[0].tp: moe.schedule s1 splits a micro-batch's tokens over tp, but "
        "parallel.micro_batch * model.seq_len = 1 * 64 = 64 does not divide by it (got 3; "
        "allowed: divisors of 64)"}},
      {"duration_too_long",
       Job("  hang_timeout_s: 1e300\n"),
       {"recovery.hang_timeout_s: out of range"}},
      {"heartbeat_timeout_too_long",
       Job("  heartbeat_timeout_s: 2e6\n"),
       {"recovery.heartbeat_timeout_s: out of range"}},
      {"health_check_not_below_hang",
       Job("  hang_timeout_s: 8\n  health_check_s: 8\n"),
       {"recovery.health_check_s: must be < recovery.hang_timeout_s (= 8): a rank stuck in the "
        "health check would be killed as hung before the check could name it (got 8; allowed: "
        "[0, 8))"}},
      // Limits no healthy job meets: refused rather than failing attempts under another name.
      {"hang_timeout_below_floor",
       Job("  hang_timeout_s: 0.01\n"),
       {"recovery.hang_timeout_s: must be at least 2 s: the ranks' watchdogs and heartbeats tick "
        "about once a second, so a shorter limit calls healthy ranks hung (got 0.01; allowed: "
        ">= 2)"}},
      {"start_timeout_below_floor",
       Job("  start_timeout_s: 0.001\n"),
       {"recovery.start_timeout_s: must be at least 1 s"}},
      {"fault_worker_and_rank",
       "name: j\nkind: train\nparallel: {dp: 2}\nfault: {mode: crash, at_step: 1, worker: h/0, "
       "rank: 1}\n",
       {"fault.rank: not used with fault.worker (the fault hits whichever rank runs on that "
        "worker)"}},
      {"validation_without_eval",
       "name: j\nkind: train\ndata: {source: tokens, path: /t.tok, validation: {fraction: 0.5}}\n",
       {"data.validation.fraction: holds data out of training for held-out evaluation, but "
        "eval.every is 0, so nothing would ever read it (got 0.5; allowed: omit data.validation, "
        "or set eval: {every: N, batches: B})"}},
      {"health_check_below_floor",
       Job("  health_check_s: 0.001\n"),
       {"recovery.health_check_s: must be 0 (off) or at least 1 s"}},
  };
  for (const RefusalCase& c : cases) {
    SCOPED_TRACE(c.label);
    ExpectRefused(c);
  }
}

// A refused hang_timeout_s is the one problem: the health check's default (half of it) is not
// refused too, since the user did not write it.
TEST(ShrinkSpecTest, AShortHangTimeoutDoesNotAlsoRefuseTheDefaultHealthCheck) {
  auto spec = ParseJobYaml(Job("  hang_timeout_s: 1.5\n"), "job.yaml");
  ASSERT_FALSE(spec.ok());
  const std::string message(spec.status().message());
  EXPECT_NE(message.find("recovery.hang_timeout_s: must be at least 2 s"), std::string::npos)
      << message;
  EXPECT_EQ(message.find("recovery.health_check_s"), std::string::npos) << message;
}

// A misspelt size is the entry's one problem: the layout it fell back to (the job's dp, so not
// smaller) is not reported before it.
TEST(ShrinkSpecTest, AMisspeltSizeIsTheEntrysOnlyProblem) {
  auto spec = ParseJobYaml(Job("  shrink: [{dpp: 1}]\n"), "job.yaml");
  ASSERT_FALSE(spec.ok());
  const std::string message(spec.status().message());
  EXPECT_NE(message.find("recovery.shrink[0].dpp: unknown field"), std::string::npos) << message;
  EXPECT_EQ(message.find("must have fewer ranks"), std::string::npos) << message;
}

TEST(ShrinkSpecTest, FaultWorkerAndHealthCheckModeAreAccepted) {
  auto spec = ParseJobYaml(
      "name: j\nkind: commcheck\nparallel: {dp: 2}\nfault: {mode: health_check, worker: h/1, "
      "every_attempt: true}\n",
      "job.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->fault().worker(), "h/1");
  EXPECT_EQ(spec->fault().mode(), "health_check");
}

}  // namespace
}  // namespace furnace::spec
