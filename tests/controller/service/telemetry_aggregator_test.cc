// Telemetry retention at scale (telemetry_aggregator.h): which raw records are kept (every rank
// sampled, rank 0 and non-step records always), how many rows stay per job, and that steps still
// waiting for ranks are bounded; with a real store in a temporary directory.
#include "controller/service/telemetry_aggregator.h"

#include <filesystem>
#include <future>
#include <memory>
#include <set>
#include <thread>

#include "gtest/gtest.h"

namespace furnace::controller {
namespace {

v1::TelemetryRecord Step(uint32_t rank, uint64_t step) {
  v1::TelemetryRecord r;
  r.set_job_id("j-1");
  r.set_attempt(1);
  r.set_rank(rank);
  r.set_step(step);
  r.set_phase("running");
  r.mutable_train()->set_loss(1.0);
  return r;
}

// A store of its own in a temporary directory, removed at the end.
class AggregatorStore {
 public:
  explicit AggregatorStore(const std::string& name)
      : dir_(std::filesystem::temp_directory_path() /
             ("furnace-" + name + "-" + std::to_string(::getpid()))) {
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    auto store = JobStore::Open((dir_ / "furnace.db").string());
    EXPECT_TRUE(store.ok()) << store.status();
    if (store.ok()) store_ = std::move(*store);
  }
  ~AggregatorStore() { std::filesystem::remove_all(dir_); }
  JobStore* get() { return store_.get(); }

 private:
  std::filesystem::path dir_;
  std::unique_ptr<JobStore> store_;
};

// Waits until the steps the aggregator queued are committed.
void AwaitSteps(TelemetryAggregator& telemetry) {
  std::promise<absl::Status> done;
  telemetry.Store({}, {}, /*after_steps=*/true, [&](absl::Status s) { done.set_value(s); });
  EXPECT_TRUE(done.get_future().get().ok());
}

TEST(TelemetryRetentionTest, SmallJobsKeepEveryRecord) {
  for (uint32_t rank = 0; rank < 8; ++rank) {
    for (uint64_t step = 1; step < 20; ++step) {
      EXPECT_TRUE(TelemetryAggregator::KeepRaw(Step(rank, step), 8));
    }
  }
  EXPECT_EQ(TelemetryAggregator::RawRecordsKept(8), 5000);
}

TEST(TelemetryRetentionTest, LargeJobsSampleEveryRankAndKeepRankZeroAndNonStepRecords) {
  constexpr uint32_t kWorld = 12288;
  const uint64_t stride =
      (kWorld + TelemetryAggregator::kRawPerStep - 1) / TelemetryAggregator::kRawPerStep;  // 48
  size_t kept_of_step = 0;
  for (uint32_t rank = 0; rank < kWorld; ++rank) {
    kept_of_step += TelemetryAggregator::KeepRaw(Step(rank, 7), kWorld) ? 1 : 0;
  }
  EXPECT_LE(kept_of_step, TelemetryAggregator::kRawPerStep + 1);  // + rank 0
  EXPECT_GE(kept_of_step, TelemetryAggregator::kRawPerStep - 1);
  // Every rank is sampled once in any `stride` consecutive steps.
  for (uint32_t rank : {1u, 47u, 48u, 5000u, kWorld - 1}) {
    int sampled = 0;
    for (uint64_t step = 100; step < 100 + stride; ++step) {
      sampled += TelemetryAggregator::KeepRaw(Step(rank, step), kWorld) ? 1 : 0;
    }
    EXPECT_EQ(sampled, 1) << "rank " << rank;
  }
  for (uint64_t step = 1; step < 100; ++step) {
    EXPECT_TRUE(TelemetryAggregator::KeepRaw(Step(0, step), kWorld));
  }
  v1::TelemetryRecord last_word = Step(5, 1);
  last_word.clear_train();
  last_word.set_message("exiting: out of data");
  EXPECT_TRUE(TelemetryAggregator::KeepRaw(last_word, kWorld));
  v1::TelemetryRecord startup = Step(5, 1);
  startup.mutable_startup();
  EXPECT_TRUE(TelemetryAggregator::KeepRaw(startup, kWorld));
  // Every rank's last sample fits in what is kept.
  EXPECT_EQ(TelemetryAggregator::RawRecordsKept(kWorld), 2 * static_cast<int>(kWorld));
}

TEST(TelemetryRetentionTest, StepsWaitingForRanksAreBounded) {
  AggregatorStore store("telemetry-test");
  ASSERT_NE(store.get(), nullptr);
  TelemetryAggregator telemetry(*store.get());
  // Rank 1 of 2 never reports: no step completes, and the pending ones stop growing (past the
  // bound, each record stores the oldest, and says so).
  for (uint64_t step = 1; step <= 500; ++step) {
    EXPECT_EQ(telemetry.Accumulate("j-1", 2, Step(0, step)),
              step > TelemetryAggregator::kMaxPendingSteps)
        << "step " << step;
  }
  EXPECT_EQ(telemetry.PendingSteps("j-1"), TelemetryAggregator::kMaxPendingSteps);
  // The newest still completes when the other rank catches up, and clears the older ones.
  EXPECT_TRUE(telemetry.Accumulate("j-1", 2, Step(1, 500)));
  EXPECT_EQ(telemetry.PendingSteps("j-1"), 0u);
  AwaitSteps(telemetry);  // Store answers once the step it queued is committed
  auto steps = store.get()->LoadSteps("j-1");
  ASSERT_TRUE(steps.ok()) << steps.status();
  // Every step was trained: those past the bound and those the newest overtook are kept, with
  // the one rank that reported them.
  ASSERT_EQ(steps->size(), 500u);
  for (uint64_t i = 0; i < 500; ++i) {
    EXPECT_EQ((*steps)[i].step(), i + 1);
    EXPECT_EQ((*steps)[i].ranks(), i + 1 == 500 ? 2u : 1u) << "step " << i + 1;
  }
}

// An agent stopped (SIGSTOP, a cut control link) while its rank trains on: the other ranks' records
// of those steps come, its own never do, and the controller restarts the job from an earlier
// checkpoint. The steps the first attempt trained stay in the series and count as productive; the
// second attempt's steps at or below them count as redone.
TEST(TelemetryAggregatorTest, StepsALostAgentNeverReportedAreKeptAndTheirRedoCounted) {
  AggregatorStore store("telemetry-lost-agent-test");
  ASSERT_NE(store.get(), nullptr);
  TelemetryAggregator telemetry(*store.get());
  auto at = [](uint32_t attempt, uint32_t rank, uint64_t step) {
    v1::TelemetryRecord r = Step(rank, step);
    r.set_attempt(attempt);
    r.set_unix_time(1000.0 * attempt + static_cast<double>(step));
    r.mutable_train()->set_step_seconds(1.0);
    r.mutable_train()->set_tokens(10);
    return r;
  };
  for (uint64_t step = 1; step <= 5; ++step) {  // both ranks report
    telemetry.Accumulate("j-1", 2, at(1, 0, step));
    EXPECT_TRUE(telemetry.Accumulate("j-1", 2, at(1, 1, step)));
  }
  for (uint64_t step = 6; step <= 20; ++step) {  // rank 1's agent is stopped
    EXPECT_FALSE(telemetry.Accumulate("j-1", 2, at(1, 0, step)));
  }
  // Attempt 2 resumes from the checkpoint of step 15.
  for (uint64_t step = 16; step <= 22; ++step) {
    telemetry.Accumulate("j-1", 2, at(2, 0, step));
    EXPECT_TRUE(telemetry.Accumulate("j-1", 2, at(2, 1, step)));
  }
  // Rank 1's records of attempt 1 arrive once its agent is back: counted already, not again.
  EXPECT_FALSE(telemetry.Accumulate("j-1", 2, at(1, 1, 12)));
  AwaitSteps(telemetry);
  auto steps = store.get()->LoadSteps("j-1");
  ASSERT_TRUE(steps.ok()) << steps.status();
  ASSERT_EQ(steps->size(), 27u);  // 20 of attempt 1, 7 of attempt 2
  for (int i = 5; i < 20; ++i) {
    EXPECT_EQ((*steps)[i].attempt(), 1u);
    EXPECT_EQ((*steps)[i].step(), static_cast<uint64_t>(i + 1));
    EXPECT_EQ((*steps)[i].ranks(), 1u);
    EXPECT_DOUBLE_EQ((*steps)[i].tokens(), 10);
  }
  const std::vector<v1::AttemptInfo> attempts(2);
  const v1::JobGoodput goodput = telemetry.Goodput("j-1", attempts, true, 2100);
  EXPECT_DOUBLE_EQ(goodput.productive_seconds(), 22);  // steps 1-22 once each
  EXPECT_EQ(goodput.redone_steps(), 5u);               // 16-20 trained twice
}

// The aggregator's own rule, whatever the transport does: a step is each rank's record once. A
// rank's record that comes again neither counts twice nor completes the step for a rank that has
// not reported; a record of no rank of the attempt is not counted.
TEST(TelemetryAggregatorTest, ARanksRecordCountsOncePerStep) {
  AggregatorStore store("telemetry-dup-test");
  ASSERT_NE(store.get(), nullptr);
  TelemetryAggregator telemetry(*store.get());
  v1::TelemetryRecord r0 = Step(0, 1);
  r0.mutable_train()->set_tokens(100);
  EXPECT_FALSE(telemetry.Accumulate("j-1", 2, r0));
  EXPECT_FALSE(telemetry.Accumulate("j-1", 2, r0));          // again: rank 1 is still missing
  EXPECT_FALSE(telemetry.Accumulate("j-1", 2, Step(2, 1)));  // no rank of a world of 2
  EXPECT_EQ(telemetry.PendingSteps("j-1"), 1u);
  v1::TelemetryRecord r1 = Step(1, 1);
  r1.mutable_train()->set_tokens(100);
  EXPECT_TRUE(telemetry.Accumulate("j-1", 2, r1));
  AwaitSteps(telemetry);
  auto steps = store.get()->LoadSteps("j-1");
  ASSERT_TRUE(steps.ok()) << steps.status();
  ASSERT_EQ(steps->size(), 1u);
  EXPECT_EQ((*steps)[0].ranks(), 2u);
  EXPECT_DOUBLE_EQ((*steps)[0].tokens(), 200);
}

// The job ends with rank 1's agent still away (its last attempt failed, no restart left): the steps
// rank 0 reported are stored once the job's end is settled, not held until a step completes.
TEST(TelemetryAggregatorTest, AnEndedJobsStepsStillWaitingForARankAreStored) {
  AggregatorStore store("telemetry-ended-test");
  ASSERT_NE(store.get(), nullptr);
  TelemetryAggregator telemetry(*store.get());
  telemetry.Accumulate("j-1", 2, Step(0, 1));
  EXPECT_TRUE(telemetry.Accumulate("j-1", 2, Step(1, 1)));
  for (uint64_t step = 2; step <= 4; ++step) {
    EXPECT_FALSE(telemetry.Accumulate("j-1", 2, Step(0, step)));
  }
  EXPECT_EQ(telemetry.JobsWithPendingSteps(), std::vector<std::string>{"j-1"});
  EXPECT_TRUE(telemetry.StoreUnfinished("j-1"));
  EXPECT_TRUE(telemetry.JobsWithPendingSteps().empty());
  EXPECT_FALSE(telemetry.StoreUnfinished("j-1"));
  AwaitSteps(telemetry);
  auto steps = store.get()->LoadSteps("j-1");
  ASSERT_TRUE(steps.ok()) << steps.status();
  ASSERT_EQ(steps->size(), 4u);
  EXPECT_EQ((*steps)[0].ranks(), 2u);
  for (int i = 1; i < 4; ++i) EXPECT_EQ((*steps)[i].ranks(), 1u);
  // A record that comes after is counted already.
  EXPECT_FALSE(telemetry.Accumulate("j-1", 2, Step(1, 3)));
}

// A job's MFU is model FLOPs / (step seconds x the peak of all devices): the slowest rank's step
// over the sum of the ranks' own peaks, not the mean of each rank's own MFU.
TEST(TelemetryAggregatorTest, TheJobsMfuIsItsFlopsOverTheSlowestStepAndEveryDevicesPeak) {
  AggregatorStore store("telemetry-mfu-test");
  ASSERT_NE(store.get(), nullptr);
  TelemetryAggregator telemetry(*store.get());
  const auto rank = [](uint32_t r, uint64_t step, double seconds, double peak) {
    v1::TelemetryRecord rec = Step(r, step);
    rec.mutable_train()->set_model_flops(1e12);
    rec.mutable_train()->set_step_seconds(seconds);
    rec.mutable_train()->set_peak_flops(peak);
    rec.mutable_train()->set_mfu(1e12 / 2 / seconds / peak);  // the rank's own view
    return rec;
  };
  telemetry.Accumulate("j-1", 2, rank(0, 1, 1.0, 100e9));
  EXPECT_TRUE(telemetry.Accumulate("j-1", 2, rank(1, 1, 2.0, 300e9)));
  // An older worker's records carry no peak: the mean of the ranks' own.
  telemetry.Accumulate("j-1", 2, rank(0, 2, 1.0, 100e9));
  v1::TelemetryRecord old = rank(1, 2, 2.0, 300e9);
  old.mutable_train()->clear_peak_flops();
  EXPECT_TRUE(telemetry.Accumulate("j-1", 2, old));
  AwaitSteps(telemetry);
  auto steps = store.get()->LoadSteps("j-1");
  ASSERT_TRUE(steps.ok()) << steps.status();
  ASSERT_EQ(steps->size(), 2u);
  EXPECT_DOUBLE_EQ((*steps)[0].mfu(), 1e12 / (2.0 * 400e9));  // 1.25, not (5 + 0.833) / 2
  EXPECT_DOUBLE_EQ((*steps)[1].mfu(), (5.0 + 1e12 / 2 / 2.0 / 300e9) / 2);
}

// The exported totals count a step once it is stored, never before: they are rebuilt from the
// store at start, so a controller restarted after a crash never exports less than it did (a
// counter that goes down reads to Prometheus as a reset: one huge spike in rate()).
TEST(TelemetryAggregatorTest, TotalsCountAStepOnceItIsStored) {
  AggregatorStore store("telemetry-totals-test");
  ASSERT_NE(store.get(), nullptr);
  TelemetryAggregator telemetry(*store.get());
  // Hold the store (its mutex, as a slow disk would): the step's write waits behind it.
  std::promise<void> holding, release;
  std::thread holder([&] {
    EXPECT_TRUE(store.get()
                    ->Transaction([&]() -> absl::Status {
                      holding.set_value();
                      release.get_future().wait();
                      return absl::OkStatus();
                    })
                    .ok());
  });
  holding.get_future().wait();
  v1::TelemetryRecord r = Step(0, 1);
  r.mutable_train()->set_tokens(300);
  r.mutable_train()->set_step_seconds(2.5);
  r.set_unix_time(1000);
  EXPECT_TRUE(telemetry.Accumulate("j-1", 1, r));
  JobMetrics m;
  telemetry.Fill("j-1", m);
  EXPECT_TRUE(m.has_step);              // the newest step shows at once
  EXPECT_DOUBLE_EQ(m.tokens_total, 0);  // not stored yet: not counted
  const std::vector<v1::AttemptInfo> attempts(1);
  // The goodput counters (productive and lost seconds) alike.
  EXPECT_DOUBLE_EQ(telemetry.Goodput("j-1", attempts, true, 1001).productive_seconds(), 0);
  release.set_value();
  holder.join();
  AwaitSteps(telemetry);
  telemetry.Fill("j-1", m);
  EXPECT_DOUBLE_EQ(m.tokens_total, 300);
  EXPECT_DOUBLE_EQ(telemetry.Goodput("j-1", attempts, true, 1001).productive_seconds(), 2.5);
  // A restarted controller rebuilds exactly that from the store.
  TelemetryAggregator restarted(*store.get());
  auto steps = store.get()->LoadSteps("j-1");
  ASSERT_TRUE(steps.ok());
  for (const auto& st : *steps) restarted.CountStep("j-1", st);
  JobMetrics again;
  restarted.Fill("j-1", again);
  EXPECT_DOUBLE_EQ(again.tokens_total, 300);
  EXPECT_DOUBLE_EQ(restarted.Goodput("j-1", attempts, true, 1001).productive_seconds(), 2.5);
}

}  // namespace
}  // namespace furnace::controller

namespace furnace::controller {
namespace {

// The planner's decisions and emergency offloads and the late reloads: summed over the ranks into
// the stored step, and exported as totals rebuilt from the store (before, late reloads reached no
// view at all).
TEST(TelemetryAggregatorTest, ThePlannersCountsAreSummedOverRanksStoredAndTotalled) {
  AggregatorStore store("telemetry-planner-test");
  ASSERT_NE(store.get(), nullptr);
  TelemetryAggregator telemetry(*store.get());
  const auto rank = [](uint32_t r, uint64_t step, uint32_t decisions, uint32_t emergencies,
                       uint64_t late) {
    v1::TelemetryRecord rec = Step(r, step);
    auto* memory = rec.mutable_train()->mutable_memory();
    memory->set_planner_decisions(decisions);
    memory->set_emergency_offloads(emergencies);
    memory->set_late_reloads(late);
    return rec;
  };
  telemetry.Accumulate("j-1", 2, rank(0, 1, 2, 0, 1));
  telemetry.Accumulate("j-1", 2, rank(1, 1, 3, 1, 4));
  telemetry.Accumulate("j-1", 2, rank(0, 2, 1, 0, 0));
  telemetry.Accumulate("j-1", 2, rank(1, 2, 0, 0, 2));
  AwaitSteps(telemetry);
  auto steps = store.get()->LoadSteps("j-1");
  ASSERT_TRUE(steps.ok()) << steps.status();
  ASSERT_EQ(steps->size(), 2u);
  EXPECT_EQ((*steps)[0].planner_decisions(), 5u);
  EXPECT_EQ((*steps)[0].emergency_offloads(), 1u);
  EXPECT_EQ((*steps)[0].late_reloads(), 5u);
  EXPECT_EQ((*steps)[1].late_reloads(), 2u);
  JobMetrics m;
  telemetry.Fill("j-1", m);
  EXPECT_DOUBLE_EQ(m.planner_decisions_total, 6);
  EXPECT_DOUBLE_EQ(m.emergency_offloads_total, 1);
  EXPECT_DOUBLE_EQ(m.late_reloads_total, 7);
  TelemetryAggregator restarted(*store.get());
  for (const auto& st : *steps) restarted.CountStep("j-1", st);
  JobMetrics again;
  restarted.Fill("j-1", again);
  EXPECT_DOUBLE_EQ(again.late_reloads_total, 7);
  EXPECT_DOUBLE_EQ(again.planner_decisions_total, 6);
}

// Collective drops: every rank takes part in each agreement, so the stored step has the most any
// rank reported (a rank that reported fewer has not reported them all), the buffers each rank
// dropped summed, the slowest rank's seconds; the exported totals add the stored steps up and a
// restarted controller rebuilds them from the store.
TEST(TelemetryAggregatorTest, AgreementsAreCountedOnceTheirDropsSummedOverRanks) {
  AggregatorStore store("telemetry-agreement-test");
  ASSERT_NE(store.get(), nullptr);
  TelemetryAggregator telemetry(*store.get());
  const auto rank = [](uint32_t r, uint64_t step, uint32_t agreements, uint32_t drops,
                       double seconds) {
    v1::TelemetryRecord rec = Step(r, step);
    auto* memory = rec.mutable_train()->mutable_memory();
    memory->set_agreements(agreements);
    memory->set_agreed_drops(drops);
    memory->set_agreement_seconds(seconds);
    return rec;
  };
  telemetry.Accumulate("j-1", 2, rank(0, 1, 2, 3, 0.25));
  telemetry.Accumulate("j-1", 2, rank(1, 1, 2, 3, 0.5));
  telemetry.Accumulate("j-1", 2, rank(0, 2, 0, 0, 0));
  telemetry.Accumulate("j-1", 2, rank(1, 2, 1, 2, 0.125));
  AwaitSteps(telemetry);
  auto steps = store.get()->LoadSteps("j-1");
  ASSERT_TRUE(steps.ok()) << steps.status();
  ASSERT_EQ(steps->size(), 2u);
  EXPECT_EQ((*steps)[0].agreements(), 2u);
  EXPECT_EQ((*steps)[0].agreed_drops(), 6u);
  EXPECT_DOUBLE_EQ((*steps)[0].agreement_seconds(), 0.5);
  EXPECT_EQ((*steps)[1].agreements(), 1u);
  EXPECT_EQ((*steps)[1].agreed_drops(), 2u);
  EXPECT_DOUBLE_EQ((*steps)[1].agreement_seconds(), 0.125);
  JobMetrics m;
  telemetry.Fill("j-1", m);
  EXPECT_DOUBLE_EQ(m.agreements_total, 3);
  EXPECT_DOUBLE_EQ(m.agreed_drops_total, 8);
  EXPECT_DOUBLE_EQ(m.agreement_seconds_total, 0.625);
  TelemetryAggregator restarted(*store.get());
  for (const auto& st : *steps) restarted.CountStep("j-1", st);
  JobMetrics again;
  restarted.Fill("j-1", again);
  EXPECT_DOUBLE_EQ(again.agreements_total, 3);
  EXPECT_DOUBLE_EQ(again.agreed_drops_total, 8);
  EXPECT_DOUBLE_EQ(again.agreement_seconds_total, 0.625);
}

}  // namespace
}  // namespace furnace::controller
