// `furnace-worker rank` end to end: RankSupervisors run the real binary on task files, the ranks
// rendezvous through the fake controller's KV store and run a tiny commcheck over Gloo.
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <mutex>
#include <optional>
#include <string>

#include "fake_agent_service.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/device/backend.h"
#include "worker/rank_device.h"
#include "worker/rank_supervisor.h"

namespace furnace::worker {
namespace {

using ::testing::HasSubstr;

struct RankRun {
  std::unique_ptr<RankSupervisor> supervisor;
  std::mutex mu;
  std::vector<furnace::v1::TelemetryRecord> records;
  std::vector<std::string> lines;
};

class RankMainTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("rank_main_test-" + std::to_string(getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  furnace::v1::JobSpec Spec(const std::string& kind = "commcheck") {
    furnace::v1::JobSpec spec;
    spec.set_kind(kind);
    spec.mutable_recovery()->set_start_timeout_s(20);
    furnace::v1::CommcheckSpec* commcheck = spec.mutable_commcheck();
    commcheck->set_min_bytes(1024);
    commcheck->set_max_bytes(4096);
    commcheck->set_step_factor(4);
    commcheck->set_iters(2);
    commcheck->set_warmup_iters(1);
    commcheck->set_rounds(2);
    commcheck->add_collectives("allreduce");
    commcheck->add_collectives("allgather");
    commcheck->set_timeout_s(10);
    return spec;
  }

  // A two-step train job of a tiny MoE on `device` (resources.device), as the spec parser would
  // resolve it.
  furnace::v1::JobSpec TrainSpec(const std::string& device) {
    furnace::v1::JobSpec spec;
    spec.set_kind("train");
    spec.mutable_recovery()->set_start_timeout_s(20);
    furnace::v1::ModelSpec* m = spec.mutable_model();
    m->set_vocab(32);
    m->set_seq_len(8);
    m->set_d_model(16);
    m->set_heads(2);
    m->set_layers(2);
    m->set_dense_ffn(32);
    m->set_moe_every(1);
    m->set_expert_ffn(16);
    m->set_precision("fp32");
    spec.mutable_moe()->set_experts(4);
    spec.mutable_moe()->set_top_k(2);
    spec.mutable_moe()->set_normalize_topk(true);
    spec.mutable_moe()->set_aux_alpha(0.01);
    spec.mutable_moe()->set_schedule("deepspeed");
    spec.mutable_moe()->mutable_spikes()->set_max_ratio(1);
    furnace::v1::ParallelSpec* p = spec.mutable_parallel();
    p->set_pp(1);
    p->set_dp(1);
    p->set_tp(1);
    p->set_ep(1);
    p->set_esp(1);
    p->set_micro_batch(2);
    p->set_micro_batches(1);
    p->set_order("tp-dp-pp");
    spec.mutable_memory()->set_policy("none");
    spec.mutable_memory()->set_offload_ratio(0.5);
    spec.mutable_train()->set_steps(2);
    spec.mutable_train()->set_lr(1e-3);
    spec.mutable_train()->set_min_lr(1e-4);
    spec.mutable_train()->set_schedule("cosine");
    spec.mutable_train()->set_clip(1.0);
    spec.mutable_train()->set_seed(3);
    spec.mutable_data()->set_source("markov");
    spec.mutable_data()->set_seed(5);
    spec.mutable_resources()->set_workers(1);
    spec.mutable_resources()->set_device(device);
    return spec;
  }

  // Starts `world` ranks of attempt `attempt`.
  void Launch(const furnace::v1::JobSpec& spec, uint32_t world, uint32_t attempt = 1,
              uint32_t device_ordinal = 0) {
    for (uint32_t r = 0; r < world; ++r) {
      furnace::v1::RankTask task;
      task.set_job_id("job-1");
      task.set_attempt(attempt);
      task.set_rank(r);
      task.set_world_size(world);
      *task.mutable_spec() = spec;
      task.set_controller_address(controller_.address());
      task.set_host("127.0.0.1");
      task.set_device_ordinal(device_ordinal);
      task.set_device_memory(uint64_t{64} << 20);
      const std::string path = (dir_ / ("task-" + std::to_string(r) + ".pb")).string();
      std::ofstream out(path, std::ios::binary);
      ASSERT_TRUE(task.SerializeToOstream(&out));
      out.close();
      auto run = std::make_unique<RankRun>();
      RankLaunch launch;
      launch.job_id = "job-1";
      launch.attempt = attempt;
      launch.rank = r;
      launch.argv = {FURNACE_WORKER_BIN, "rank", "--task", path};
      launch.log_path = (dir_ / ("rank-" + std::to_string(r) + ".log")).string();
      launch.hang_timeout_s = spec.recovery().hang_timeout_s();
      launch.start_timeout_s = StartTimeoutS(task);  // as the agent launches it
      RankSinks sinks;
      RankRun* raw = run.get();
      sinks.on_telemetry = [raw](furnace::v1::TelemetryRecord record) {
        std::lock_guard<std::mutex> lock(raw->mu);
        raw->records.push_back(std::move(record));
      };
      sinks.on_log = [raw](furnace::v1::LogLine line) {
        std::lock_guard<std::mutex> lock(raw->mu);
        raw->lines.push_back(line.text());
      };
      auto supervisor = RankSupervisor::Start(std::move(launch), std::move(sinks));
      ASSERT_TRUE(supervisor.ok()) << supervisor.status();
      run->supervisor = *std::move(supervisor);
      runs_.push_back(std::move(run));
    }
  }

  furnace::v1::RankReport Finish(uint32_t rank) {
    runs_[rank]->supervisor->Wait();
    return *runs_[rank]->supervisor->exit_report();
  }

  std::filesystem::path dir_;
  testing::FakeController controller_;
  std::vector<std::unique_ptr<RankRun>> runs_;
};

TEST_F(RankMainTest, CommcheckPassesAndReportsProgress) {
  Launch(Spec(), 2);
  for (uint32_t r = 0; r < 2; ++r) {
    const furnace::v1::RankReport report = Finish(r);
    ASSERT_EQ(report.exit_kind(), furnace::v1::EXIT_KIND_SUCCESS) << report.reason();
    const RankRun& run = *runs_[r];
    ASSERT_FALSE(run.records.empty());
    EXPECT_EQ(run.records.front().phase(), "starting");
    EXPECT_EQ(run.records.back().phase(), "done");
    EXPECT_EQ(run.records.back().step(), 2u);
    EXPECT_EQ(run.records.back().total_steps(), 2u);
    int results = 0;
    for (const auto& record : run.records) {
      for (const auto& comm : record.comm()) {
        ++results;
        EXPECT_TRUE(comm.verified());
        EXPECT_EQ(comm.world_size(), 2u);
        EXPECT_EQ(record.phase(), "running");
      }
    }
    EXPECT_EQ(results, 2 /*rounds*/ * 2 /*sizes*/ * 2 /*collectives*/);
    // Numbered in the order written, from 1 (the watchdog's records, kept by the supervisor, leave
    // gaps): what the controller's re-sent-batch rule relies on.
    uint64_t seq = 0;
    for (const auto& record : run.records) {
      EXPECT_GT(record.seq(), seq) << record.phase();
      seq = record.seq();
    }
    EXPECT_GE(run.records.front().seq(), 1u);
  }
}

// resources.device emulated: the rank trains on an emulated device of the task's size with the
// emulated backend, and says so in its log.
TEST_F(RankMainTest, TrainsOnTheEmulatedDevice) {
  Launch(TrainSpec("emulated"), 1, 1, 3);
  const furnace::v1::RankReport report = Finish(0);
  ASSERT_EQ(report.exit_kind(), furnace::v1::EXIT_KIND_SUCCESS) << report.reason();
  bool said = false;
  for (const std::string& line : runs_[0]->lines) {
    said = said || line.find(
                       "device emulated:3 (emulated): training on the emulated backend, "
                       "precision fp32") != std::string::npos;
  }
  EXPECT_TRUE(said);
  EXPECT_EQ(runs_[0]->records.back().phase(), "done");
  EXPECT_EQ(runs_[0]->records.back().step(), 2u);
}

// resources.device cuda where the GPU is not there (no machine has GPU 4096; a build without CUDA
// has none at all): bad input, naming the field.
TEST_F(RankMainTest, CudaWithoutTheGpuNamesResourcesDevice) {
  Launch(TrainSpec("cuda"), 1, 1, 4096);
  const furnace::v1::RankReport report = Finish(0);
  EXPECT_EQ(report.exit_kind(), furnace::v1::EXIT_KIND_CODE);
  EXPECT_EQ(report.exit_code(), furnace::v1::RANK_EXIT_BAD_INPUT) << report.reason();
  EXPECT_THAT(report.reason(), HasSubstr("resources.device cuda: "));
}

// A cuda rank loads every CUDA module when its context is made (rank_device.cc: a lazy load waits
// for the GPU's queued work, an NCCL kernel waiting on a peer included), set before the device is
// made; a CUDA_MODULE_LOADING the worker's environment sets is kept.
TEST(RankDeviceTest, ACudaRankLoadsModulesEagerlyUnlessTheEnvironmentSaysOtherwise) {
  // The caller's own setting comes back whatever the test does.
  struct Restore {
    std::optional<std::string> value;
    ~Restore() {
      if (value) {
        setenv("CUDA_MODULE_LOADING", value->c_str(), 1);
      } else {
        unsetenv("CUDA_MODULE_LOADING");
      }
    }
  } restore;
  if (const char* v = getenv("CUDA_MODULE_LOADING")) restore.value = v;
  furnace::v1::RankTask task;
  task.mutable_spec()->mutable_resources()->set_device("cuda");
  task.set_device_ordinal(4096);  // no machine has it: the device itself is not made
  unsetenv("CUDA_MODULE_LOADING");
  EXPECT_FALSE(MakeRankDevice(task).ok());
  ASSERT_NE(getenv("CUDA_MODULE_LOADING"), nullptr);
  EXPECT_STREQ(getenv("CUDA_MODULE_LOADING"), "EAGER");
  setenv("CUDA_MODULE_LOADING", "LAZY", 1);
  EXPECT_FALSE(MakeRankDevice(task).ok());
  EXPECT_STREQ(getenv("CUDA_MODULE_LOADING"), "LAZY");
  unsetenv("CUDA_MODULE_LOADING");
  task.mutable_spec()->mutable_resources()->set_device("emulated");
  task.set_device_ordinal(0);
  ASSERT_TRUE(MakeRankDevice(task).ok());
  EXPECT_EQ(getenv("CUDA_MODULE_LOADING"), nullptr);  // only a cuda rank's
}

// The same on two ranks, with the health check on: the device is made before the check (which
// would run on it), so each rank is bad input naming the field at once, not a failed health check
// (a counted, retried failure) after waiting for its peer; for a commcheck too.
TEST_F(RankMainTest, CudaWithoutTheGpuIsBadInputBeforeTheHealthCheck) {
  uint32_t attempt = 1;
  for (const char* kind : {"train", "commcheck"}) {
    furnace::v1::JobSpec spec = TrainSpec("cuda");
    spec.set_kind(kind);
    spec.mutable_recovery()->set_health_check_s(10);
    Launch(spec, 2, attempt++, 4096);
    for (int r = 0; r < 2; ++r) {
      const furnace::v1::RankReport report = Finish(r);
      EXPECT_EQ(report.exit_kind(), furnace::v1::EXIT_KIND_CODE) << kind;
      EXPECT_EQ(report.exit_code(), furnace::v1::RANK_EXIT_BAD_INPUT)
          << kind << ": " << report.reason();
      EXPECT_THAT(report.reason(), HasSubstr("resources.device cuda: "));
    }
    runs_.clear();
  }
}

// model.precision bf16 on the emulated device: trains with the emulated bf16 table where the build
// has one (saying so in the log), else is refused before training, naming both fields.
TEST_F(RankMainTest, Bf16OnTheEmulatedDeviceTrainsOrNamesModelPrecision) {
  furnace::v1::JobSpec spec = TrainSpec("emulated");
  spec.mutable_model()->set_precision("bf16");
  const bool table = device::BackendFor(device::Kind::kEmulated, device::Precision::kBf16).ok();
  Launch(spec, 1);
  const furnace::v1::RankReport report = Finish(0);
  if (table) {
    ASSERT_EQ(report.exit_kind(), furnace::v1::EXIT_KIND_SUCCESS) << report.reason();
    bool said = false;
    for (const std::string& line : runs_[0]->lines) {
      said = said || line.find("precision bf16") != std::string::npos;
    }
    EXPECT_TRUE(said);
  } else {
    EXPECT_EQ(report.exit_code(), furnace::v1::RANK_EXIT_BAD_INPUT) << report.reason();
    EXPECT_THAT(report.reason(), HasSubstr("model.precision bf16 with resources.device emulated"));
  }
}

// A memory.device_budget below what any policy needs: `furnace submit` refuses it, but a job
// another client sent reaches the rank, which refuses it before its first step with the bytes.
TEST_F(RankMainTest, ABudgetBelowTheFloorIsRefusedBeforeTheFirstStep) {
  furnace::v1::JobSpec spec = TrainSpec("cpu");
  spec.mutable_memory()->set_policy("adaptive");
  spec.mutable_memory()->set_device_budget(1024);
  Launch(spec, 1);
  const furnace::v1::RankReport report = Finish(0);
  EXPECT_EQ(report.exit_kind(), furnace::v1::EXIT_KIND_CODE);
  EXPECT_EQ(report.exit_code(), furnace::v1::RANK_EXIT_BAD_INPUT) << report.reason();
  EXPECT_THAT(report.reason(), HasSubstr("memory.device_budget: 1024 bytes is below "));
  EXPECT_THAT(report.reason(), HasSubstr("raise memory.device_budget to at least "));
}

TEST_F(RankMainTest, UnknownKindExitsWithTwo) {
  Launch(Spec("inference"), 1);
  const furnace::v1::RankReport report = Finish(0);
  EXPECT_EQ(report.exit_kind(), furnace::v1::EXIT_KIND_CODE);
  EXPECT_EQ(report.exit_code(), 2);
  EXPECT_THAT(report.reason(), HasSubstr("'inference' is not supported"));
}

TEST_F(RankMainTest, ExitFaultAfterTheFirstRound) {
  furnace::v1::JobSpec spec = Spec();
  spec.mutable_fault()->set_mode("exit");
  spec.mutable_fault()->set_rank(1);
  spec.mutable_fault()->set_at_step(1);
  spec.mutable_fault()->set_exit_code(9);
  spec.mutable_commcheck()->set_timeout_s(2);  // rank 0 then fails fast
  Launch(spec, 2);
  const furnace::v1::RankReport faulty = Finish(1);
  EXPECT_EQ(faulty.exit_kind(), furnace::v1::EXIT_KIND_CODE);
  EXPECT_EQ(faulty.exit_code(), 9);
  EXPECT_THAT(faulty.reason(), HasSubstr("fault injection"));
  const furnace::v1::RankReport peer = Finish(0);
  EXPECT_EQ(peer.exit_kind(), furnace::v1::EXIT_KIND_CODE) << peer.reason();
  EXPECT_EQ(peer.exit_code(), 1);
}

TEST_F(RankMainTest, CrashFaultAtStart) {
  furnace::v1::JobSpec spec = Spec();
  spec.mutable_fault()->set_mode("crash");
  spec.mutable_fault()->set_rank(0);
  Launch(spec, 1);
  const furnace::v1::RankReport report = Finish(0);
  EXPECT_EQ(report.exit_kind(), furnace::v1::EXIT_KIND_SIGNAL);
  EXPECT_EQ(report.signal(), SIGSEGV);
}

TEST_F(RankMainTest, HangFaultIsCaughtByTheWatchdog) {
  furnace::v1::JobSpec spec = Spec();
  spec.mutable_fault()->set_mode("hang");
  spec.mutable_fault()->set_rank(0);
  spec.mutable_recovery()->set_hang_timeout_s(1);
  Launch(spec, 1);
  const furnace::v1::RankReport report = Finish(0);
  EXPECT_EQ(report.exit_kind(), furnace::v1::EXIT_KIND_HANG);
  EXPECT_THAT(report.reason(), HasSubstr("last step 0"));
  EXPECT_FALSE(report.hang_in_collective());  // hung in its own code: a root cause
}

TEST_F(RankMainTest, FaultOnlyInTheFirstAttemptUnlessEveryAttempt) {
  furnace::v1::JobSpec spec = Spec();
  spec.mutable_fault()->set_mode("exit");
  spec.mutable_fault()->set_rank(0);
  spec.mutable_fault()->set_exit_code(9);
  Launch(spec, 1, /*attempt=*/2);
  EXPECT_EQ(Finish(0).exit_kind(), furnace::v1::EXIT_KIND_SUCCESS);
  spec.mutable_fault()->set_every_attempt(true);
  runs_.clear();
  Launch(spec, 1, /*attempt=*/3);
  EXPECT_EQ(Finish(0).exit_code(), 9);
}

TEST_F(RankMainTest, FencedAttemptFailsRendezvous) {
  controller_.service.min_attempt = 5;
  Launch(Spec(), 2, /*attempt=*/1);
  const furnace::v1::RankReport report = Finish(0);
  EXPECT_EQ(report.exit_code(), 1);
  EXPECT_THAT(report.reason(), HasSubstr("rendezvous failed"));
  Finish(1);
}

}  // namespace
}  // namespace furnace::worker
