#include "runtime/train/trainer.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <latch>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "runtime/checkpoint/checkpoint.h"
#include "runtime/data/counter_rng.h"
#include "runtime/data/data_sources.h"
#include "runtime/data/markov.h"
#include "runtime/data/sampler.h"
#include "runtime/data/token_file.h"
#include "runtime/device/device.h"
#include "runtime/train/peak_flops.h"
#include "tests/testing/file_bytes.h"
#include "tests/testing/test_dir.h"

namespace furnace::train {
namespace {

using ::testing::HasSubstr;

// A bigram language model: logits(next | token) = W[token, :], W (V, V). Cross-entropy and its
// gradient are written out here, so the loop is tested against nothing but arithmetic.
class BigramModel : public Trainable {
 public:
  BigramModel(int vocab, int seq_len, uint64_t seed) : V_(vocab), T_(seq_len) {
    params_ = {{.name = "w", .shape = {vocab, vocab}, .offset = 0, .weight_decay = true}};
    w_.resize(static_cast<size_t>(vocab) * vocab);
    g_.assign(w_.size(), 0.0f);
    data::CounterRng rng(seed);
    for (float& x : w_) x = static_cast<float>(0.02 * (rng.NextDouble() - 0.5));
  }
  const std::vector<ParamInfo>& params() const override { return params_; }
  int64_t num_params() const override { return static_cast<int64_t>(w_.size()); }
  device::Device& device() override { return *cpu_; }  // host arrays
  float* param_data() override { return w_.data(); }
  float* grad_data() override { return g_.data(); }
  void ZeroGrad() override { std::fill(g_.begin(), g_.end(), 0.0f); }
  absl::StatusOr<MicroBatchResult> ForwardBackward(const int32_t* inputs, const int32_t* targets,
                                                   int B, double ce_scale,
                                                   double /*aux_scale*/) override {
    return Run(inputs, targets, B, ce_scale);
  }
  absl::StatusOr<MicroBatchResult> Evaluate(const int32_t* inputs, const int32_t* targets,
                                            int B) override {
    return Run(inputs, targets, B, 0.0);
  }
  int seq_len() const override { return T_; }
  int vocab() const override { return V_; }
  double FlopsPerToken() const override { return 6.0 * V_; }

  // The exact expected loss under the chain: sum_i pi_i sum_j P_ij (-log softmax(W_i)_j).
  double ExpectedLoss(const data::MarkovChain& chain) const {
    double loss = 0;
    std::vector<double> p(V_);
    for (int i = 0; i < V_; ++i) {
      Softmax(i, p.data());
      for (int j = 0; j < V_; ++j) {
        loss -= chain.stationary()[i] * chain.transition(i, j) * std::log(p[j]);
      }
    }
    return loss;
  }

 private:
  void Softmax(int row, double* p) const {
    const float* w = w_.data() + static_cast<size_t>(row) * V_;
    double max = w[0], sum = 0;
    for (int j = 1; j < V_; ++j) max = std::max<double>(max, w[j]);
    for (int j = 0; j < V_; ++j) sum += p[j] = std::exp(w[j] - max);
    for (int j = 0; j < V_; ++j) p[j] /= sum;
  }
  MicroBatchResult Run(const int32_t* inputs, const int32_t* targets, int B, double ce_scale) {
    MicroBatchResult r;
    std::vector<double> p(V_);
    const int64_t n = static_cast<int64_t>(B) * T_;
    for (int64_t i = 0; i < n; ++i) {
      Softmax(inputs[i], p.data());
      r.loss -= std::log(p[targets[i]]);
      if (ce_scale != 0) {
        float* g = g_.data() + static_cast<size_t>(inputs[i]) * V_;
        for (int j = 0; j < V_; ++j) {
          g[j] += static_cast<float>(ce_scale * (p[j] - (j == targets[i] ? 1.0 : 0.0)));
        }
      }
    }
    r.loss /= static_cast<double>(n);
    return r;
  }

  int V_, T_;
  std::unique_ptr<device::Device> cpu_ = device::CreateCpuDevice();
  std::vector<ParamInfo> params_;
  std::vector<float> w_, g_;
};

struct MarkovSetup {
  data::MarkovChain chain;
  std::unique_ptr<data::Sampler> sampler;
};

MarkovSetup MakeMarkov(int V, int B, int T, uint64_t seed) {
  auto chain =
      data::MarkovChain::Create({.vocab = V, .successors = 3, .smoothing = 0.05, .seed = 7});
  EXPECT_TRUE(chain.ok());
  auto sampler = data::MakeMarkovSampler(*chain, {.batch = B, .seq_len = T, .seed = seed});
  EXPECT_TRUE(sampler.ok());
  return {*std::move(chain), *std::move(sampler)};
}

TEST(TrainerTest, LearnsAMarkovChainToItsEntropyRate) {
  const int V = 16;
  MarkovSetup data = MakeMarkov(V, /*B=*/16, /*T=*/64, /*seed=*/3);
  BigramModel model(V, 64, 11);
  TrainConfig config;
  config.steps = 300;
  config.micro_batches = 2;
  config.seed = 3;
  config.schedule = {
      .kind = LrSchedule::Kind::kCosine, .lr = 0.1, .warmup_steps = 10, .max_steps = 300};
  auto trainer = Trainer::Create(&model, data.sampler.get(), config);
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  const double H = data.chain.entropy_rate();
  std::vector<double> losses;
  int64_t within = -1;
  ASSERT_TRUE((*trainer)
                  ->Run([&](const StepStats& s) {
                    losses.push_back(s.loss);
                    if (within < 0 && model.ExpectedLoss(data.chain) < 1.05 * H)
                      within = s.step + 1;
                  })
                  .ok());
  ASSERT_EQ(losses.size(), 300u);
  double tail = 0;
  for (int i = 290; i < 300; ++i) tail += losses[i] / 10;
  const double expected = model.ExpectedLoss(data.chain);
  std::printf(
      "[ learning ] H = %.4f nats/token, uniform log V = %.4f; first loss %.4f; "
      "exact expected loss within 5%% of H after %lld steps; final expected loss %.4f "
      "(%.2f%% above H), mean reported loss of the last 10 steps %.4f\n",
      H, std::log(double{V}), losses[0], static_cast<long long>(within), expected,
      100 * (expected / H - 1), tail);
  EXPECT_NEAR(losses[0], std::log(double{V}), 0.05);
  EXPECT_GE(expected, H - 1e-9);  // H is a floor
  EXPECT_LT(expected, 1.05 * H);
  EXPECT_LT(std::abs(tail / H - 1), 0.05);
}

// The resume tests' run: 20 steps, 2 micro-batches, cosine schedule, clipped.
TrainConfig ResumeConfig() {
  TrainConfig config;
  config.steps = 20;
  config.micro_batches = 2;
  config.seed = 5;
  config.clip = 0.5;
  config.schedule = {
      .kind = LrSchedule::Kind::kCosine, .lr = 0.05, .warmup_steps = 5, .max_steps = 20};
  return config;
}

// Runs `trainer` and stops it after step 9 (10 steps done), as an interruption would.
absl::Status RunAndStopAfterStep9(Trainer& trainer) {
  StopToken stop;
  return trainer.Run(
      [&](const StepStats& s) {
        if (s.step == 9) stop.RequestStop();
      },
      &stop);
}

TEST(TrainerTest, ResumedRunIsBitIdenticalToAnUninterruptedOne) {
  const int V = 16, T = 16;
  MarkovSetup data = MakeMarkov(V, 4, T, 5);
  TrainConfig config = ResumeConfig();

  BigramModel straight(V, T, 1);
  auto a = Trainer::Create(&straight, data.sampler.get(), config);
  ASSERT_TRUE(a.ok());
  std::vector<double> losses_a;
  ASSERT_TRUE((*a)->Run([&](const StepStats& s) { losses_a.push_back(s.loss); }).ok());

  testing_util::TestDir dir;
  config.checkpoint = {.dir = dir.path(), .every = 4, .keep = 2};
  BigramModel first(V, T, 1);
  auto b = Trainer::Create(&first, data.sampler.get(), config);
  ASSERT_TRUE(b.ok());
  ASSERT_TRUE(RunAndStopAfterStep9(**b).ok());
  EXPECT_EQ((*b)->step(), 10);
  // every=4 saved 4 and 8, the stop saved 10; keep=2 left 8 and 10.
  EXPECT_TRUE(std::filesystem::exists(dir / "step-00000010/manifest.json"));
  EXPECT_TRUE(std::filesystem::exists(dir / "step-00000008/manifest.json"));
  EXPECT_FALSE(std::filesystem::exists(dir / "step-00000004"));

  BigramModel second(V, T, /*seed=*/999);  // different init: the checkpoint must overwrite it
  auto c = Trainer::Create(&second, data.sampler.get(), config);
  ASSERT_TRUE(c.ok());
  auto restored = (*c)->RestoreLatest();
  ASSERT_TRUE(restored.ok()) << restored.status();
  EXPECT_EQ(restored->step, 10);
  EXPECT_EQ((*c)->step(), 10);
  std::vector<double> losses_c;
  ASSERT_TRUE((*c)->Run([&](const StepStats& s) { losses_c.push_back(s.loss); }).ok());
  EXPECT_EQ((*c)->step(), 20);

  ASSERT_EQ(losses_c.size(), 10u);
  for (int i = 0; i < 10; ++i) EXPECT_EQ(losses_c[i], losses_a[10 + i]) << "step " << 10 + i;
  EXPECT_EQ(std::memcmp(straight.param_data(), second.param_data(),
                        sizeof(float) * straight.num_params()),
            0);
  EXPECT_EQ(*(*a)->optimizer().HostM(), *(*c)->optimizer().HostM());
  EXPECT_EQ(*(*a)->optimizer().HostV(), *(*c)->optimizer().HostV());
}

// A checkpointed stop (SIGUSR1 on a rank: the job is cancelled or its worker drained) ends Run
// after the step in progress with that step's checkpoint written, and says it stopped early: a
// request made during step 6 (here: in the callback of the step before, index 5) stops after it,
// at 7. One arriving with the last step is a normal end.
TEST(TrainerTest, ACheckpointedStopEndsAfterTheStepWithItsCheckpoint) {
  const int V = 8, T = 8;
  MarkovSetup data = MakeMarkov(V, 2, T, 5);
  testing_util::TestDir dir;
  TrainConfig config = ResumeConfig();
  config.checkpoint = {.dir = dir.path(), .every = 4, .keep = 0};
  for (const int ask_after : {5, 19}) {
    SCOPED_TRACE(ask_after);
    std::filesystem::remove_all(dir.path());
    BigramModel model(V, T, 1);
    auto trainer = Trainer::Create(&model, data.sampler.get(), config);
    ASSERT_TRUE(trainer.ok());
    StopToken stop;
    ASSERT_TRUE((*trainer)
                    ->Run(
                        [&](const StepStats& s) {
                          if (s.step == ask_after) stop.RequestCheckpointedStop();
                        },
                        &stop)
                    .ok());
    const bool early = ask_after < 19;
    EXPECT_EQ((*trainer)->step(), early ? 7 : 20);
    EXPECT_EQ((*trainer)->stopped_on_request(), early);
    const std::vector<int64_t> want =
        early ? std::vector<int64_t>{4, 7} : std::vector<int64_t>{4, 8, 12, 16, 20};
    EXPECT_EQ(CheckpointStore(dir.path(), 0).CommittedSteps(), want);
  }
}

// A resume under other optimizer settings is refused, naming each field and both values, unless
// the run overrides the checkpoint's; then it continues with its own (the learning rate it
// reports is its schedule's from the resumed step on) and says what it changed.
TEST(TrainerTest, AResumeUnderOtherOptimizerSettingsIsRefusedUnlessOverridden) {
  const int V = 8, T = 8;
  MarkovSetup data = MakeMarkov(V, 2, T, 5);
  testing_util::TestDir dir;
  TrainConfig config = ResumeConfig();
  config.checkpoint = {.dir = dir.path()};
  BigramModel first(V, T, 1);
  auto a = Trainer::Create(&first, data.sampler.get(), config);
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(RunAndStopAfterStep9(**a).ok());

  // The same settings resume, and nothing is said overridden.
  BigramModel same_model(V, T, 1);
  auto same = Trainer::Create(&same_model, data.sampler.get(), config);
  ASSERT_TRUE(same.ok());
  ASSERT_TRUE((*same)->RestoreLatest().ok());
  EXPECT_TRUE((*same)->settings_overridden().empty());

  TrainConfig changed = config;
  changed.schedule.lr = 0.02;
  changed.schedule.max_steps = 40;  // a cosine over more steps
  changed.steps = 40;
  changed.clip = 1.0;
  BigramModel second(V, T, 1);
  auto b = Trainer::Create(&second, data.sampler.get(), changed);
  ASSERT_TRUE(b.ok());
  const absl::Status refused = (*b)->RestoreLatest().status();
  EXPECT_TRUE(absl::IsFailedPrecondition(refused)) << refused;
  EXPECT_THAT(refused.message(), HasSubstr("train.clip 0.5 -> 1"));
  EXPECT_THAT(refused.message(), HasSubstr("train.lr 0.05 -> 0.02"));
  EXPECT_THAT(refused.message(), HasSubstr("train.min_lr 0.005 -> 0.002"));
  EXPECT_THAT(refused.message(), HasSubstr("train.steps 20 -> 40"));
  EXPECT_THAT(refused.message(), HasSubstr("checkpoint.override_settings"));
  EXPECT_EQ((*b)->step(), 0);  // nothing restored

  changed.override_checkpoint_settings = true;
  BigramModel third(V, T, 1);
  auto c = Trainer::Create(&third, data.sampler.get(), changed);
  ASSERT_TRUE(c.ok());
  auto restored = (*c)->RestoreLatest();
  ASSERT_TRUE(restored.ok()) << restored.status();
  EXPECT_EQ((*c)->step(), 10);
  EXPECT_EQ(DescribeChanges((*c)->settings_overridden()),
            "train.clip 0.5 -> 1, train.lr 0.05 -> 0.02, train.min_lr 0.005 -> 0.002, "
            "train.steps 20 -> 40");
  std::vector<double> lrs;
  ASSERT_TRUE((*c)->Run([&](const StepStats& s) { lrs.push_back(s.lr); }).ok());
  ASSERT_EQ(lrs.size(), 30u);
  EXPECT_DOUBLE_EQ(lrs[0], changed.schedule.At(10));
  // Under a constant schedule a warmup both runs are past changes nothing: not refused.
  {
    TrainConfig flat = config;
    flat.checkpoint = {.dir = dir / "constant"};
    flat.schedule.kind = LrSchedule::Kind::kConstant;
    BigramModel a_model(V, T, 1);
    auto flat_a = Trainer::Create(&a_model, data.sampler.get(), flat);
    ASSERT_TRUE(flat_a.ok());
    ASSERT_TRUE(RunAndStopAfterStep9(**flat_a).ok());  // warmup 5, stopped after 10 steps
    flat.schedule.warmup_steps = 8;
    BigramModel b_model(V, T, 1);
    auto flat_b = Trainer::Create(&b_model, data.sampler.get(), flat);
    ASSERT_TRUE(flat_b.ok());
    ASSERT_TRUE((*flat_b)->RestoreLatest().ok());
    EXPECT_TRUE((*flat_b)->settings_overridden().empty());
    flat.schedule.warmup_steps = 12;  // still warming up at step 10: refused
    BigramModel c_model(V, T, 1);
    auto flat_c = Trainer::Create(&c_model, data.sampler.get(), flat);
    ASSERT_TRUE(flat_c.ok());
    EXPECT_THAT((*flat_c)->RestoreLatest().status().message(), HasSubstr("train.warmup 5 -> 12"));
  }
  // Its own checkpoints record its settings: a resume of them with the same settings is quiet.
  BigramModel fourth(V, T, 1);
  changed.override_checkpoint_settings = false;
  auto d = Trainer::Create(&fourth, data.sampler.get(), changed);
  ASSERT_TRUE(d.ok());
  ASSERT_TRUE((*d)->RestoreLatest().ok());
  EXPECT_TRUE((*d)->settings_overridden().empty());
}

// The settings that define the model beyond its tensors' shapes (model.heads, moe.top_k, ...: the
// worker fills TrainConfig::model_settings from model::ModelConfig::RecordedSettings, whose texts
// run_settings_test checks) are recorded
// and compared as the optimizer's are; and a checkpoint past the run's train.steps is refused
// whatever is overridden (nothing would train, and the model handed out would have more steps
// than asked).
TEST(TrainerTest, AResumeOfAnotherModelOrPastTheRunsStepsIsRefused) {
  const int V = 8, T = 8;
  MarkovSetup data = MakeMarkov(V, 2, T, 5);
  testing_util::TestDir dir;
  TrainConfig config = ResumeConfig();
  config.checkpoint = {.dir = dir.path()};
  config.model_settings = {{"model.heads", "4"}, {"moe.aux_alpha", "0.01"}, {"moe.top_k", "2"}};
  BigramModel first(V, T, 1);
  auto a = Trainer::Create(&first, data.sampler.get(), config);
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(RunAndStopAfterStep9(**a).ok());

  TrainConfig changed = config;
  changed.model_settings = {{"model.heads", "8"}, {"moe.aux_alpha", "0.02"}, {"moe.top_k", "1"}};
  BigramModel second(V, T, 1);
  auto b = Trainer::Create(&second, data.sampler.get(), changed);
  ASSERT_TRUE(b.ok());
  const absl::Status refused = (*b)->RestoreLatest().status();
  EXPECT_TRUE(absl::IsFailedPrecondition(refused)) << refused;
  EXPECT_THAT(refused.message(),
              HasSubstr("model.heads 4 -> 8, moe.aux_alpha 0.01 -> 0.02, moe.top_k 2 -> 1"));
  EXPECT_THAT(refused.message(), HasSubstr("checkpoint.override_settings"));
  EXPECT_EQ((*b)->step(), 0);

  changed.override_checkpoint_settings = true;
  BigramModel third(V, T, 1);
  auto c = Trainer::Create(&third, data.sampler.get(), changed);
  ASSERT_TRUE(c.ok());
  ASSERT_TRUE((*c)->RestoreLatest().ok());
  EXPECT_EQ(DescribeChanges((*c)->settings_overridden()),
            "model.heads 4 -> 8, moe.aux_alpha 0.01 -> 0.02, moe.top_k 2 -> 1");

  // A checkpoint recorded without model settings (an older one, or a model with none) is not
  // compared on them.
  TrainConfig none = config;
  none.model_settings.clear();
  BigramModel fourth(V, T, 1);
  auto d = Trainer::Create(&fourth, data.sampler.get(), none);
  ASSERT_TRUE(d.ok());
  ASSERT_TRUE((*d)->RestoreLatest().ok());

  // Past train.steps: refused even with the settings overridden (constant schedule: train.steps
  // is no recorded setting there, so only this check stands between it and a resume).
  TrainConfig flat = config;
  flat.checkpoint = {.dir = dir / "constant"};
  flat.schedule.kind = LrSchedule::Kind::kConstant;
  BigramModel e_model(V, T, 1);
  auto e = Trainer::Create(&e_model, data.sampler.get(), flat);
  ASSERT_TRUE(e.ok());
  ASSERT_TRUE(RunAndStopAfterStep9(**e).ok());
  flat.steps = 6;
  flat.override_checkpoint_settings = true;
  BigramModel f_model(V, T, 1);
  auto f = Trainer::Create(&f_model, data.sampler.get(), flat);
  ASSERT_TRUE(f.ok());
  const absl::Status past = (*f)->RestoreLatest().status();
  EXPECT_TRUE(absl::IsFailedPrecondition(past)) << past;
  EXPECT_THAT(past.message(), HasSubstr("is of step 10, past this run's train.steps 6"));
  EXPECT_THAT(past.message(), HasSubstr("Raise train.steps to at least 10"));
  EXPECT_EQ((*f)->step(), 0);
  flat.steps = 10;  // exactly done: resumes, and has nothing left to train
  BigramModel g_model(V, T, 1);
  auto g = Trainer::Create(&g_model, data.sampler.get(), flat);
  ASSERT_TRUE(g.ok());
  ASSERT_TRUE((*g)->RestoreLatest().ok());
  EXPECT_EQ((*g)->step(), 10);
}

// A step whose loss or gradient norm is not finite is not applied: the run stops there with the
// parameters and Adam moments of the step before (an update would write NaN into all of them,
// and into every checkpoint after). A learning rate of 1e38 diverges within a few steps.
TEST(TrainerTest, AStepWithANonFiniteLossOrGradientIsNotApplied) {
  const int V = 8, T = 8;
  MarkovSetup data = MakeMarkov(V, 2, T, 1);
  TrainConfig config;
  config.steps = 10;
  config.seed = 1;
  config.clip = 0;
  config.schedule = {.kind = LrSchedule::Kind::kConstant, .lr = 1e38};
  BigramModel model(V, T, 1);
  auto t = Trainer::Create(&model, data.sampler.get(), config);
  ASSERT_TRUE(t.ok());
  std::vector<float> last;  // the parameters after the last step applied
  std::vector<float> last_m;
  const absl::Status diverged = (*t)->Run([&](const StepStats& s) {
    EXPECT_TRUE(std::isfinite(s.loss) && std::isfinite(s.grad_norm)) << "step " << s.step;
    last.assign(model.param_data(), model.param_data() + model.num_params());
    last_m = *(*t)->optimizer().HostM();
  });
  ASSERT_TRUE(absl::IsAborted(diverged)) << diverged;
  const int64_t at = (*t)->step();
  ASSERT_GE(at, 1);
  ASSERT_LT(at, config.steps);
  // Counted as the logs count steps: `at` steps are done, step at + 1 failed.
  EXPECT_THAT(diverged.message(), HasSubstr(absl::StrCat("step ", at + 1, ": the loss is ")));
  EXPECT_THAT(diverged.message(), HasSubstr(absl::StrCat("still those of step ", at, ")")));
  EXPECT_THAT(diverged.message(), HasSubstr("the update was not applied"));
  EXPECT_THAT(diverged.message(), HasSubstr("checkpoint.override_settings"));
  ASSERT_EQ(last.size(), static_cast<size_t>(model.num_params()));
  EXPECT_EQ(std::memcmp(last.data(), model.param_data(), last.size() * sizeof(float)), 0);
  EXPECT_EQ(last_m, *(*t)->optimizer().HostM());
}

// A checkpoint written before the Markov order named the batch shape ("markov v1") resumes: its
// chain, seed and seq_len are this run's. A v1 order of another seed is still refused.
TEST(TrainerTest, AMarkovV1OrderOfTheSameDataResumes) {
  const int V = 16, T = 16;
  MarkovSetup data = MakeMarkov(V, 4, T, 5);
  TrainConfig config = ResumeConfig();
  testing_util::TestDir dir;
  config.checkpoint = {.dir = dir.path(), .every = 4, .keep = 2};
  BigramModel first(V, T, 1);
  auto a = Trainer::Create(&first, data.sampler.get(), config);
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(RunAndStopAfterStep9(**a).ok());
  const std::string path = dir / "step-00000010/manifest.json";
  nlohmann::json m = nlohmann::json::parse(testing_util::ReadAll(path));
  const std::string v2 = m["data"]["order"];
  ASSERT_EQ(v2.rfind("markov v2: ", 0), 0u) << v2;
  // v1 as that build wrote it: no batch fields, and no manifest checksum yet.
  const size_t batch = v2.find(", batch "), end = v2.rfind(", ");
  const std::string v1 = "markov v1: " + v2.substr(11, batch - 11) + v2.substr(end);
  m.erase("manifest_crc32");
  m["data"]["order"] = v1;
  testing_util::WriteAll(path, m.dump(1));
  BigramModel second(V, T, 999);
  auto b = Trainer::Create(&second, data.sampler.get(), config);
  ASSERT_TRUE(b.ok());
  auto restored = (*b)->RestoreLatest();
  ASSERT_TRUE(restored.ok()) << restored.status() << "\n" << v1;
  EXPECT_EQ(restored->step, 10);
  m["data"]["order"] = absl::StrReplaceAll(v1, {{"seed 5", "seed 6"}});
  ASSERT_NE(m["data"]["order"], v1);
  testing_util::WriteAll(path, m.dump(1));
  BigramModel third(V, T, 999);
  auto c = Trainer::Create(&third, data.sampler.get(), config);
  ASSERT_TRUE(c.ok());
  auto refused = (*c)->RestoreLatest();
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition) << refused.status();
}

// A token file of `windows` sequences of T + 1 tokens over V symbols (a fixed pseudo-random walk),
// sampled in shuffled epochs with a tenth held out, through the prefetching wrapper the worker
// uses.
std::unique_ptr<data::Sampler> TokenSampler(const std::string& path, int V, int B, int T, int m,
                                            uint64_t seed, double fraction = 0.1) {
  if (!std::filesystem::exists(path)) {
    std::vector<int32_t> tokens(static_cast<size_t>(50 * T + 1));
    data::CounterRng rng(77);
    for (int32_t& t : tokens) t = static_cast<int32_t>(rng.NextBelow(V));
    EXPECT_TRUE(data::WriteTokenFile(path, tokens, V).ok());
  }
  data::DataSourceConfig source;
  source.source = "tokens";
  source.paths = {{path}};
  source.model_vocab = V;
  source.validation_fraction = fraction;
  auto made = data::MakeSamplers(
      source, {.batch = B, .seq_len = T, .seed = seed, .global_batch = int64_t{B} * m});
  EXPECT_TRUE(made.ok()) << made.status();
  return data::MakePrefetchingSampler(std::move(made->train), 0, m);
}

TEST(TrainerTest, ResumeMidEpochOnTokenDataIsBitIdentical) {
  const int V = 16, T = 16;
  testing_util::TestDir dir;
  TrainConfig config = ResumeConfig();
  // 50 windows, 5 held out and 1 dropped: 44 per epoch, 8 per step. The checkpoint of step 10 is
  // at sequence 80, index 36 of epoch 1; the run ends in epoch 3.
  const std::unique_ptr<data::Sampler> sampler =
      TokenSampler(dir / "t.tokens", V, 4, T, config.micro_batches, config.seed);
  EXPECT_EQ(sampler->PositionAt(10).epoch, 1);
  EXPECT_EQ(sampler->PositionAt(10).index_in_epoch, 36);

  BigramModel straight(V, T, 1);
  auto a = Trainer::Create(&straight, sampler.get(), config);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE((*a)->Run().ok());

  config.checkpoint = {.dir = dir / "ckpt", .every = 5, .keep = 2};
  config.job_id = "tokens-3";
  BigramModel first(V, T, 1);
  auto b = Trainer::Create(&first, sampler.get(), config);
  ASSERT_TRUE(b.ok());
  ASSERT_TRUE(RunAndStopAfterStep9(**b).ok());
  std::ifstream manifest(dir / "ckpt/step-00000010/manifest.json");
  const std::string text((std::istreambuf_iterator<char>(manifest)), {});
  EXPECT_THAT(text, HasSubstr("\"job\": \"tokens-3\""));  // who wrote it (furnace export)
  EXPECT_THAT(text, HasSubstr("\"index_in_epoch\": 36"));
  EXPECT_THAT(text, HasSubstr("\"epoch\": 1"));

  // A fresh process: its own sampler (and prefetch thread) over the same file.
  const std::unique_ptr<data::Sampler> again =
      TokenSampler(dir / "t.tokens", V, 4, T, config.micro_batches, config.seed);
  BigramModel second(V, T, 999);
  auto c = Trainer::Create(&second, again.get(), config);
  ASSERT_TRUE(c.ok());
  ASSERT_TRUE((*c)->RestoreLatest().ok());
  ASSERT_TRUE((*c)->Run().ok());
  EXPECT_EQ(std::memcmp(straight.param_data(), second.param_data(),
                        sizeof(float) * straight.num_params()),
            0);
  EXPECT_EQ(*(*a)->optimizer().HostM(), *(*c)->optimizer().HostM());

  // Another split (or seed, seq_len, global batch, file) reads other sequences: refused.
  const std::unique_ptr<data::Sampler> other =
      TokenSampler(dir / "t.tokens", V, 4, T, config.micro_batches, config.seed, 0.2);
  BigramModel third(V, T, 1);
  auto d = Trainer::Create(&third, other.get(), config);
  ASSERT_TRUE(d.ok());
  const absl::Status refused = (*d)->RestoreLatest().status();
  EXPECT_TRUE(absl::IsFailedPrecondition(refused)) << refused;
  EXPECT_THAT(refused.message(), HasSubstr("resuming would read other sequences"));
  // The line that differs is said first, not left to be found in the two orders.
  EXPECT_THAT(refused.message(), HasSubstr("reading other data or in another order: fraction 0.1 "
                                           "-> 0.2, windows 0..44 -> 0..39 ("));
}

TEST(TrainerTest, AsyncCheckpointsResumeBitIdenticalToAnUninterruptedRun) {
  const int V = 16, T = 16;
  MarkovSetup data = MakeMarkov(V, 4, T, 5);
  TrainConfig config = ResumeConfig();

  BigramModel straight(V, T, 1);
  auto a = Trainer::Create(&straight, data.sampler.get(), config);
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE((*a)->Run().ok());

  testing_util::TestDir dir;
  config.checkpoint = {.dir = dir.path(), .every = 4, .keep = 2, .async = true};
  BigramModel first(V, T, 1);
  auto b = Trainer::Create(&first, data.sampler.get(), config);
  ASSERT_TRUE(b.ok());
  ASSERT_TRUE(RunAndStopAfterStep9(**b).ok());
  EXPECT_EQ((*b)->step(), 10);
  EXPECT_TRUE((*b)->checkpoint_errors().empty());
  // Snapshots at 4 and 8 (4 committed when 8 started, 8 at the stop), then 10; keep=2.
  CheckpointStore store(dir.path(), 2);
  EXPECT_EQ(store.CommittedSteps(), (std::vector<int64_t>{8, 10}));
  ASSERT_TRUE(store.LatestStep().ok());
  EXPECT_EQ(*store.LatestStep(), std::optional<int64_t>(10));

  BigramModel second(V, T, /*seed=*/999);
  auto c = Trainer::Create(&second, data.sampler.get(), config);
  ASSERT_TRUE(c.ok());
  auto restored = (*c)->RestoreLatest();
  ASSERT_TRUE(restored.ok()) << restored.status();
  EXPECT_EQ(restored->step, 10);
  ASSERT_TRUE((*c)->Run().ok());
  EXPECT_EQ((*c)->step(), 20);
  EXPECT_EQ(std::memcmp(straight.param_data(), second.param_data(),
                        sizeof(float) * straight.num_params()),
            0);
  EXPECT_EQ(*(*a)->optimizer().HostM(), *(*c)->optimizer().HostM());
  EXPECT_EQ(*(*a)->optimizer().HostV(), *(*c)->optimizer().HostV());
  // The async run's last checkpoint holds the uninterrupted run's state.
  auto last = store.LoadLatest();
  ASSERT_TRUE(last.ok()) << last.status();
  EXPECT_EQ(last->step, 20);
  EXPECT_EQ(std::memcmp(last->param_data.data(), straight.param_data(),
                        sizeof(float) * straight.num_params()),
            0);
}

// A fake clock (time moves only by Advance) that counts its readings, so that another thread can
// wait until the trainer has read it: a reading takes its value and its count together, so time
// advanced once WaitForReadings(n) has returned is in none of the first n readings.
class CountingClock : public Clock {
 public:
  double MonotonicSeconds() const override {
    std::lock_guard<std::mutex> lock(mu_);
    ++readings_;
    read_.notify_all();
    return now_;
  }
  double UnixSeconds() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return 1'700'000'000.0 + now_;
  }
  void Advance(double seconds) {
    std::lock_guard<std::mutex> lock(mu_);
    now_ += seconds;
  }
  int64_t readings() const {
    std::lock_guard<std::mutex> lock(mu_);
    return readings_;
  }
  void WaitForReadings(int64_t n) const {
    std::unique_lock<std::mutex> lock(mu_);
    read_.wait(lock, [&] { return readings_ >= n; });
  }

 private:
  mutable std::mutex mu_;
  mutable std::condition_variable read_;
  mutable int64_t readings_ = 0;  // guarded by mu_
  double now_ = 0;                // guarded by mu_
};

TEST(TrainerTest, AsyncCommitWaitsForTheDurableShardAndTheNextSnapshotWaitsForTheLast) {
  const int V = 8, T = 8;
  MarkovSetup data = MakeMarkov(V, 2, T, 1);
  testing_util::TestDir dir;
  TrainConfig config;
  config.steps = 4;
  config.seed = 1;
  config.checkpoint = {.dir = dir.path(), .every = 1, .keep = 0, .async = true};
  BigramModel model(V, T, 1);
  // The trainer's time moves only when a write says so: each write takes kWriteSeconds of it (a
  // power of two, so that its sums are exact).
  constexpr double kWriteSeconds = 0.125;
  CountingClock clock;
  auto t = Trainer::Create(&model, data.sampler.get(), config, &clock);
  ASSERT_TRUE(t.ok());
  CheckpointStore store(dir.path(), 0);
  // By step: the clock's readings when the step's checkpoint began (-1: not yet).
  std::mutex mu;
  std::condition_variable began;
  std::vector<int64_t> checkpoint_began(static_cast<size_t>(config.steps) + 1, -1);
  std::atomic<int> writing{0}, most_writing{0};
  std::vector<std::pair<int64_t, int64_t>> latest_seen;  // (snapshot step, LATEST at its write)
  (*t)->SetCheckpointWriteHookForTest([&](const ShardState& s) {
    most_writing = std::max(most_writing.load(), ++writing);
    if (s.step < config.steps) {
      // Step s + 1's checkpoint waits for this write: it takes its kWriteSeconds only once that
      // wait has begun (the trainer read its clock after the checkpoint began, the stall's start).
      // A step that goes on while its snapshot is written stalls for none of it, one that waits
      // for it for all of it. (A trainer that waited for the write within step s would wait
      // forever: ctest's timeout catches that.)
      int64_t readings = 0;
      {
        std::unique_lock<std::mutex> lock(mu);
        began.wait(lock, [&] { return checkpoint_began[s.step + 1] >= 0; });
        readings = checkpoint_began[s.step + 1];
      }
      clock.WaitForReadings(readings + 1);
      clock.Advance(kWriteSeconds);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(150));  // the write time it reports
    auto latest = store.LatestStep();
    latest_seen.emplace_back(s.step, latest.ok() && latest->has_value() ? **latest : -1);
    --writing;
  });
  std::vector<StepStats> stats;
  ASSERT_TRUE((*t)->Run([&](const StepStats& s) { stats.push_back(s); }, nullptr,
                        [&](RunPhase phase, int64_t step) {
                          if (phase != RunPhase::kCheckpoint) return;
                          std::lock_guard<std::mutex> lock(mu);
                          checkpoint_began[step] = clock.readings();
                          began.notify_all();
                        })
                  .ok());
  EXPECT_TRUE((*t)->checkpoint_errors().empty());
  EXPECT_EQ(most_writing.load(), 1);
  // While step s was being written, LATEST named the step before it: the previous snapshot was
  // committed before this one started, and this one not before its shard was durable.
  ASSERT_EQ(latest_seen.size(), 4u);
  for (int64_t s = 1; s <= 4; ++s) {
    EXPECT_EQ(latest_seen[s - 1], std::make_pair(s, s == 1 ? int64_t{-1} : s - 1));
  }
  auto loaded = store.LoadLatest();
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->step, 4);
  // Steps 2..4 each waited for the slow write of the step before (the stall), and report it.
  ASSERT_EQ(stats.size(), 4u);
  // The first snapshot had nothing to wait for: training went on while it was written.
  EXPECT_EQ(stats[0].checkpoint_stall_seconds, 0.0);
  for (int i = 1; i < 4; ++i) {
    EXPECT_GE(stats[i].checkpoint_stall_seconds, kWriteSeconds) << "step " << i;
    EXPECT_GE(stats[i].checkpoint_seconds, 0.14) << "step " << i;  // the real clock's
  }
}

TEST(TrainerTest, AsyncCheckpointIsCommittedOnceDurableNotAtTheNextCheckpointStep) {
  const int V = 8, T = 8;
  MarkovSetup data = MakeMarkov(V, 2, T, 1);
  testing_util::TestDir dir;
  TrainConfig config;
  config.steps = 20;
  config.seed = 1;
  config.checkpoint = {.dir = dir.path(), .every = 10, .keep = 0, .async = true};
  BigramModel model(V, T, 1);
  auto t = Trainer::Create(&model, data.sampler.get(), config);
  ASSERT_TRUE(t.ok());
  CheckpointStore store(dir.path(), 0);
  const std::string shard = store.StepDir(10) + "/" + CheckpointStore::ShardFileName(0);
  // The snapshot of step 10 is written only once the step after it (stats step 10) has ended, so
  // that no step before stats step 11 can find it durable.
  std::latch step_10_ended(1);
  (*t)->SetCheckpointWriteHookForTest([&](const ShardState& s) {
    if (s.step == 10) step_10_ended.wait();
  });
  const auto names_10 = [&] {
    auto latest = store.LatestStep();
    return latest.ok() && *latest == std::optional<int64_t>(10);
  };
  int64_t committed_after = -1;  // the step after which LATEST first named 10
  int give_ms = 100;             // the writer's time before the next step, doubled at each step
  ASSERT_TRUE((*t)->Run([&](const StepStats& s) {
                    if (s.step < 10 || committed_after >= 0) return;
                    if (s.step == 10) step_10_ended.count_down();
                    if (s.checkpoint_seconds > 0) {
                      // This step found the shard durable (its checkpoint_seconds is the
                      // write's) and started the commit in the background: let it land.
                      for (int i = 0; i < 10000 && !names_10(); ++i) {
                        std::this_thread::sleep_for(std::chrono::milliseconds(1));
                      }
                    }
                    if (names_10()) {
                      committed_after = s.step;
                      return;
                    }
                    // Not durable when this step began: give the writer time, until its shard is
                    // renamed into place, then for the directory's fsync, which the trainer does
                    // not show (twice as long at each step: 12 s in all before step 19).
                    for (int i = 0; i < 600 && !std::filesystem::exists(shard); ++i) {
                      std::this_thread::sleep_for(std::chrono::milliseconds(50));
                    }
                    std::this_thread::sleep_for(std::chrono::milliseconds(give_ms));
                    give_ms = std::min(2 * give_ms, 3200);
                  })
                  .ok());
  EXPECT_TRUE((*t)->checkpoint_errors().empty());
  // Committed after the first step that found its shard durable (not before: its write was held
  // until step 10 had ended), before step 20 would have waited for it.
  EXPECT_GT(committed_after, 10);
  EXPECT_LT(committed_after, 19);
  EXPECT_EQ(store.CommittedSteps(), (std::vector<int64_t>{10, 20}));
}

// A BigramModel that calls after_forward_backward(step) on the training thread once each forward
// and backward pass is done.
class BigramModelWithHook : public BigramModel {
 public:
  using BigramModel::BigramModel;
  void SetStepContext(int64_t step, int64_t /*first_global_sequence*/) override { step_ = step; }
  absl::StatusOr<MicroBatchResult> ForwardBackward(const int32_t* inputs, const int32_t* targets,
                                                   int B, double ce_scale,
                                                   double aux_scale) override {
    absl::StatusOr<MicroBatchResult> r =
        BigramModel::ForwardBackward(inputs, targets, B, ce_scale, aux_scale);
    if (after_forward_backward) after_forward_backward(step_);
    return r;
  }

  std::function<void(int64_t step)> after_forward_backward;

 private:
  int64_t step_ = -1;
};

TEST(TrainerTest, AsyncSnapshotSlowerThanAStepHoldsTheUpdateNotTheValues) {
  // The copy of step 4's state lasts until step 5's forward and backward pass is done, and 200 ms
  // more; step 5's update must wait for it, or the shard would hold values of step 5.
  const int V = 8, T = 8;
  MarkovSetup data = MakeMarkov(V, 2, T, 1);
  testing_util::TestDir sync_dir, async_dir;
  TrainConfig config;
  config.steps = 6;
  config.seed = 1;
  config.checkpoint = {.dir = sync_dir.path(), .every = 4, .keep = 0};
  BigramModel a(V, T, 1);
  auto sync = Trainer::Create(&a, data.sampler.get(), config);
  ASSERT_TRUE(sync.ok());
  ASSERT_TRUE((*sync)->Run().ok());

  config.checkpoint = {.dir = async_dir.path(), .every = 4, .keep = 0, .async = true};
  BigramModelWithHook b(V, T, 1);
  std::latch step_5_computed(1);
  b.after_forward_backward = [&](int64_t step) {
    if (step == 4 && !step_5_computed.try_wait()) step_5_computed.count_down();
  };
  auto async = Trainer::Create(&b, data.sampler.get(), config);
  ASSERT_TRUE(async.ok());
  std::atomic<int> copies{0};
  (*async)->SetCheckpointCopyHookForTest([&] {
    if (copies++ == 0) step_5_computed.wait();  // the snapshot of step 4
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  });
  std::vector<StepStats> stats;
  ASSERT_TRUE((*async)->Run([&](const StepStats& s) { stats.push_back(s); }).ok());
  const std::string name = CheckpointStore::ShardFileName(0);
  for (int64_t step : {4, 6}) {
    const std::string want =
        testing_util::ReadAll(CheckpointStore(sync_dir.path(), 0).StepDir(step) + "/" + name);
    const std::string got =
        testing_util::ReadAll(CheckpointStore(async_dir.path(), 0).StepDir(step) + "/" + name);
    ASSERT_FALSE(want.empty());
    EXPECT_TRUE(want == got) << "the snapshot of step " << step << " differs from the sync one";
  }
  // Step 5 (index 4) waited for the copy before its update: the stall it reports, the copy's last
  // 200 ms but for the little the step did between its forward and backward pass and the wait.
  ASSERT_EQ(stats.size(), 6u);
  EXPECT_GT(stats[4].checkpoint_stall_seconds, 0.1);
}

TEST(TrainerTest, AsyncWriteErrorsAreReportedAndTrainingGoesOn) {
  const int V = 8, T = 8;
  MarkovSetup data = MakeMarkov(V, 2, T, 1);
  testing_util::TestDir dir;
  TrainConfig config;
  config.steps = 2;
  config.seed = 1;
  config.checkpoint = {.dir = dir.path(), .every = 1, .keep = 0, .async = true};
  BigramModel model(V, T, 1);
  auto first = Trainer::Create(&model, data.sampler.get(), config);
  ASSERT_TRUE(first.ok());
  ASSERT_TRUE((*first)->Run().ok());
  // Steps 3 and 4 cannot be written: a file stands where their directories would go (a plain
  // permission bit does not stop root).
  for (const char* name : {"step-00000003", "step-00000004"}) {
    std::ofstream(dir / name) << "in the way";
  }
  config.steps = 4;
  auto second = Trainer::Create(&model, data.sampler.get(), config);
  ASSERT_TRUE(second.ok());
  std::vector<StepStats> stats;
  // Step 3's failure is reported and training goes on; the final checkpoint (step 4) failed in
  // the background is written again in the foreground, whose failure fails the run: it must not
  // end as a success with an older checkpoint than its last step.
  const absl::Status run = (*second)->Run([&](const StepStats& s) { stats.push_back(s); });
  EXPECT_FALSE(run.ok());
  EXPECT_THAT(run.message(), HasSubstr("the final checkpoint (step 4) failed in the background "
                                       "and again in the foreground"));
  EXPECT_EQ((*second)->step(), 4);
  ASSERT_EQ(stats.size(), 4u);
  EXPECT_THAT(stats[3].checkpoint_error, HasSubstr("checkpoint of step 3 not committed"));
  ASSERT_EQ((*second)->checkpoint_errors().size(), 2u);
  EXPECT_THAT((*second)->checkpoint_errors()[1], HasSubstr("checkpoint of step 4 not committed"));
  CheckpointStore store(dir.path(), 0);
  EXPECT_EQ(store.CommittedSteps(), (std::vector<int64_t>{1, 2}));
  auto loaded = store.LoadLatest();
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->step, 2);
}

TEST(TrainerTest, AsyncCommitRunsInTheBackgroundAndItsFailureIsReported) {
  const int V = 8, T = 8;
  MarkovSetup data = MakeMarkov(V, 2, T, 1);
  testing_util::TestDir dir;
  // LATEST cannot be replaced (a directory stands in its place): every commit fails after the
  // shard and the manifest are written.
  std::filesystem::create_directories(dir / "LATEST");
  TrainConfig config;
  config.steps = 4;
  config.seed = 1;
  config.checkpoint = {.dir = dir.path(), .every = 2, .keep = 0, .async = true};
  BigramModel model(V, T, 1);
  auto t = Trainer::Create(&model, data.sampler.get(), config);
  ASSERT_TRUE(t.ok());
  // The final checkpoint cannot be committed in the foreground either: the run fails.
  EXPECT_THAT((*t)->Run().message(), HasSubstr("the final checkpoint (step 4) failed"));
  EXPECT_EQ((*t)->step(), 4);
  ASSERT_EQ((*t)->checkpoint_errors().size(), 2u);
  EXPECT_THAT((*t)->checkpoint_errors()[0], HasSubstr("checkpoint of step 2 not committed"));
  EXPECT_THAT((*t)->checkpoint_errors()[0], HasSubstr("LATEST"));
  EXPECT_THAT((*t)->checkpoint_errors()[1], HasSubstr("checkpoint of step 4 not committed"));
}

TEST(TrainerTest, RestoreRefusesAnotherModelOrSeed) {
  const int V = 8, T = 8;
  MarkovSetup data = MakeMarkov(V, 2, T, 1);
  testing_util::TestDir dir;
  TrainConfig config;
  config.steps = 2;
  config.seed = 1;
  config.checkpoint = {.dir = dir.path()};
  BigramModel model(V, T, 1);
  auto t = Trainer::Create(&model, data.sampler.get(), config);
  ASSERT_TRUE(t.ok());
  ASSERT_TRUE((*t)->Run().ok());

  CheckpointStore store(dir.path(), 3);
  auto loaded = store.LoadLatest();
  ASSERT_TRUE(loaded.ok());
  LoadedCheckpoint renamed = *loaded;
  renamed.params[0].name = "v";
  EXPECT_THAT((*t)->Restore(renamed).message(), HasSubstr("tensor 0 is v"));
  LoadedCheckpoint reseeded = *loaded;
  reseeded.seed = 2;
  EXPECT_THAT((*t)->Restore(reseeded).message(), HasSubstr("seed 2"));

  // A fresh directory is NotFound: the caller starts from scratch.
  testing_util::TestDir empty;
  config.checkpoint.dir = empty.path();
  auto fresh = Trainer::Create(&model, data.sampler.get(), config);
  ASSERT_TRUE(fresh.ok());
  EXPECT_TRUE(absl::IsNotFound((*fresh)->RestoreLatest().status()));
}

// A model with no learning in it that reports routing and memory, driven by a fake clock, to
// check the step statistics arithmetic.
class RoutingStub : public Trainable {
 public:
  explicit RoutingStub(FakeClock* clock) : clock_(clock) {}
  const std::vector<ParamInfo>& params() const override { return params_; }
  int64_t num_params() const override { return 2; }
  device::Device& device() override { return *cpu_; }  // host arrays
  float* param_data() override { return p_; }
  float* grad_data() override { return g_; }
  void ZeroGrad() override { g_[0] = g_[1] = 0; }
  absl::StatusOr<MicroBatchResult> ForwardBackward(const int32_t*, const int32_t*, int B,
                                                   double ce_scale, double aux_scale) override {
    seen_ce_scale = ce_scale;
    seen_aux_scale = aux_scale;
    seen_B = B;
    clock_->Advance(1.5);
    g_[0] += 30;
    g_[1] += 40;
    MicroBatchResult r;
    r.loss = 2.0 + calls_;
    r.aux_loss = 0.1;
    r.tokens_per_expert = {{6, 2, 0, 0}, {2, 2, 2, 2}};
    r.activation_peak_bytes = 1000 * (++calls_);
    r.routing_spike = spike_on_call == calls_;
    return r;
  }
  void SetStepContext(int64_t step, int64_t first_global_sequence) override {
    contexts.emplace_back(step, first_global_sequence);
  }
  absl::StatusOr<MicroBatchResult> Evaluate(const int32_t*, const int32_t*, int) override {
    return MicroBatchResult{};
  }
  int seq_len() const override { return 8; }
  int vocab() const override { return 16; }
  double FlopsPerToken() const override { return 1000.0; }

  double seen_ce_scale = 0, seen_aux_scale = 0;
  int seen_B = 0;
  std::vector<std::pair<int64_t, int64_t>> contexts;  // SetStepContext calls
  int spike_on_call = 0;  // the ForwardBackward call (1-based) that reports a routing spike

 private:
  FakeClock* clock_;
  std::unique_ptr<device::Device> cpu_ = device::CreateCpuDevice();
  std::vector<ParamInfo> params_ = {{.name = "b", .shape = {2}, .offset = 0}};
  float p_[2] = {0, 0};
  float g_[2] = {0, 0};
  int calls_ = 0;
};

TEST(TrainerTest, StepStatistics) {
  FakeClock clock;
  RoutingStub model(&clock);
  MarkovSetup data = MakeMarkov(16, 4, 8, 0);
  TrainConfig config;
  config.steps = 1;
  config.micro_batches = 2;
  config.clip = 1.0;
  config.peak_flops = 1e4;
  config.schedule = {.kind = LrSchedule::Kind::kConstant, .lr = 0.25};
  auto trainer = Trainer::Create(&model, data.sampler.get(), config, &clock);
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  auto stats = (*trainer)->Step();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(model.seen_B, 4);
  EXPECT_DOUBLE_EQ(model.seen_ce_scale, 1.0 / (4 * 8 * 2));
  EXPECT_DOUBLE_EQ(model.seen_aux_scale, 0.5);
  EXPECT_EQ(stats->step, 0);
  EXPECT_DOUBLE_EQ(stats->loss, 2.5);  // mean of 2 and 3
  EXPECT_DOUBLE_EQ(stats->aux_loss, 0.1);
  EXPECT_EQ(stats->tokens, 64);
  EXPECT_DOUBLE_EQ(stats->forward_backward_seconds, 3.0);
  EXPECT_DOUBLE_EQ(stats->optimizer_seconds, 0.0);
  EXPECT_DOUBLE_EQ(stats->step_seconds, 3.0);
  EXPECT_DOUBLE_EQ(stats->tokens_per_second, 64 / 3.0);
  EXPECT_DOUBLE_EQ(stats->grad_norm, 100.0);  // (60, 80) accumulated over 2 micro-batches
  EXPECT_DOUBLE_EQ(stats->lr, 0.25);
  EXPECT_EQ(stats->tokens_per_expert,
            (std::vector<std::vector<int64_t>>{{12, 4, 0, 0}, {4, 4, 4, 4}}));
  EXPECT_EQ(stats->imbalance, (std::vector<double>{3.0, 1.0}));
  EXPECT_EQ(stats->activation_peak_bytes, 2000);
  EXPECT_DOUBLE_EQ(stats->model_flops, 64000.0);
  EXPECT_DOUBLE_EQ(stats->mfu, 64000.0 / 3.0 / 1e4);
  // Clipped to norm 1 before AdamW, whose first step moves each parameter by lr against its sign.
  EXPECT_NEAR(model.param_data()[0], -0.25, 1e-6);
  EXPECT_EQ((*trainer)->step(), 1);
}

// Before every micro-batch the model learns the step and the global index of the micro-batch's
// first sequence (what seeds routing spikes); a step is a spike step when a micro-batch says so.
TEST(TrainerTest, StepContextPrecedesEveryMicroBatch) {
  FakeClock clock;
  RoutingStub model(&clock);
  model.spike_on_call = 5;  // step 1, micro-batch 1
  MarkovSetup data = MakeMarkov(16, 4, 8, 0);
  TrainConfig config;
  config.steps = 3;
  config.micro_batches = 3;
  auto trainer = Trainer::Create(&model, data.sampler.get(), config, &clock);
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  std::vector<bool> spikes;
  for (int s = 0; s < 3; ++s) {
    auto stats = (*trainer)->Step();
    ASSERT_TRUE(stats.ok()) << stats.status();
    spikes.push_back(stats->routing_spike);
  }
  const std::vector<std::pair<int64_t, int64_t>> want = {{0, 0}, {0, 4}, {0, 8}, {1, 0}, {1, 4},
                                                         {1, 8}, {2, 0}, {2, 4}, {2, 8}};
  EXPECT_EQ(model.contexts, want);  // B = 4 sequences per micro-batch
  EXPECT_EQ(spikes, (std::vector<bool>{false, true, false}));
}

TEST(TrainerTest, CreateRejectsMismatches) {
  FakeClock clock;
  RoutingStub model(&clock);
  MarkovSetup wrong_t = MakeMarkov(16, 4, 9, 0);
  TrainConfig config;
  EXPECT_THAT(Trainer::Create(&model, wrong_t.sampler.get(), config).status().message(),
              HasSubstr("seq_len"));
  MarkovSetup big_vocab = MakeMarkov(32, 4, 8, 0);
  EXPECT_THAT(Trainer::Create(&model, big_vocab.sampler.get(), config).status().message(),
              HasSubstr("vocab"));
  MarkovSetup other_seed = MakeMarkov(16, 4, 8, 3);
  EXPECT_THAT(Trainer::Create(&model, other_seed.sampler.get(), config).status().message(),
              HasSubstr("seed"));
  // checkpoint.every_auto without the MTBF: no interval to compute (it would save every step).
  MarkovSetup fits = MakeMarkov(16, 4, 8, 0);
  TrainConfig no_mtbf;
  no_mtbf.checkpoint.dir = "unused";
  no_mtbf.checkpoint.every_auto = true;
  EXPECT_THAT(Trainer::Create(&model, fits.sampler.get(), no_mtbf).status().message(),
              HasSubstr("auto_hint.mtbf_seconds > 0"));
}

TEST(TrainerTest, ParallelLayoutNeedsAPipelineStage) {
  FakeClock clock;
  RoutingStub model(&clock);  // a Trainable, not a PipelineStage
  MarkovSetup data = MakeMarkov(16, 4, 8, 0);
  TrainConfig config;
  ParallelRuntime parallel;
  const absl::Status s =
      Trainer::Create(&model, data.sampler.get(), config, &clock, &parallel).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("pipeline stage"));
}

// A clock that moves `tick` seconds at every reading: a step reads it three times and a
// synchronous checkpoint three (start, write time, stall), so every step and every stall measures
// 2 * tick.
class TickingClock : public Clock {
 public:
  explicit TickingClock(double tick) : tick_(tick) {}
  double MonotonicSeconds() const override { return now_ += tick_; }
  double UnixSeconds() const override { return now_ += tick_; }

 private:
  double tick_;
  mutable double now_ = 0;
};

// Runs 20 steps under checkpoint.every auto with `hint`; returns the committed checkpoints and
// the interval reported after each step.
std::pair<std::vector<int64_t>, std::vector<int64_t>> RunAuto(const IntervalInputs& hint) {
  const int V = 16, T = 16;
  MarkovSetup data = MakeMarkov(V, 4, T, 5);
  TrainConfig config = ResumeConfig();
  testing_util::TestDir dir;
  config.checkpoint = {
      .dir = dir.path(), .every = 0, .keep = 0, .every_auto = true, .auto_hint = hint};
  TickingClock clock(0.01);
  BigramModel model(V, T, 1);
  auto trainer = Trainer::Create(&model, data.sampler.get(), config, &clock);
  EXPECT_TRUE(trainer.ok());
  std::vector<int64_t> intervals;
  EXPECT_TRUE(
      (*trainer)
          ->Run([&](const StepStats& s) { intervals.push_back(s.checkpoint_interval_steps); })
          .ok());
  return {CheckpointStore(dir.path(), 0).CommittedSteps(), intervals};
}

TEST(TrainerTest, AutoIntervalProbesTheStallThenSavesAtTheYoungDalyInterval) {
  // Steps and stalls measure 0.02 s; M = 0.25 s: sqrt(2 * 0.02 * 0.25) = 0.1 s = 5 steps. The
  // stall is unknown at first: a checkpoint after the first step measures it.
  const auto [saved, intervals] = RunAuto({.mtbf_seconds = 0.25});
  EXPECT_EQ(saved, (std::vector<int64_t>{1, 6, 11, 16, 20}));  // 20: the end of the run
  ASSERT_EQ(intervals.size(), 20u);
  EXPECT_EQ(intervals[0], 1);
  for (size_t i = 1; i < intervals.size(); ++i) EXPECT_EQ(intervals[i], 5) << "step " << i;
}

// Run says when each checkpoint and evaluation starts, before it runs and before the step's
// callback (the rank watchdog's phases, worker/rank_watchdog.h): `every: auto` too, which decides
// after the step, and the final checkpoint once, after the last step's callback.
TEST(TrainerTest, RunSaysWhenEachCheckpointAndEvaluationStarts) {
  const int V = 16, T = 16;
  MarkovSetup data = MakeMarkov(V, 4, T, 5);
  MarkovSetup held_out = MakeMarkov(V, 4, T, 99);
  TrainConfig config = ResumeConfig();
  config.steps = 19;
  config.schedule.max_steps = 19;
  testing_util::TestDir dir;
  config.checkpoint = {.dir = dir.path(),
                       .every = 0,
                       .keep = 0,
                       .every_auto = true,
                       .auto_hint = {.mtbf_seconds = 0.25}};
  config.eval = {.every = 8, .batches = 2};
  TickingClock clock(0.01);
  BigramModel model(V, T, 1);
  auto trainer =
      Trainer::Create(&model, data.sampler.get(), config, &clock, nullptr, held_out.sampler.get());
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  std::vector<std::string> said;
  ASSERT_TRUE(
      (*trainer)
          ->Run([&](const StepStats& s) { said.push_back(absl::StrCat("step ", s.step + 1)); },
                nullptr,
                [&](RunPhase phase, int64_t step) {
                  said.push_back(
                      absl::StrCat(phase == RunPhase::kCheckpoint ? "checkpoint " : "eval ", step));
                })
          .ok());
  const std::vector<int64_t> saved = CheckpointStore(dir.path(), 0).CommittedSteps();
  ASSERT_GE(saved.size(), 3u);  // the probe after step 1, the auto interval's, the final one
  ASSERT_EQ(saved.back(), 19);
  std::vector<std::string> expected;
  for (int64_t step = 1; step <= 19; ++step) {
    const bool saved_here = std::count(saved.begin(), saved.end(), step) == 1;
    if (saved_here && step < 19) expected.push_back(absl::StrCat("checkpoint ", step));
    if (step % 8 == 0 || step == 19) expected.push_back(absl::StrCat("eval ", step));
    expected.push_back(absl::StrCat("step ", step));
  }
  expected.push_back("checkpoint 19");  // the final one (19 is not on the auto interval)
  EXPECT_EQ(said, expected);
}

TEST(TrainerTest, AutoIntervalStartsFromTheHintAndGrowsWithTheMtbf) {
  // What earlier attempts measured: no probe.
  auto [saved, intervals] =
      RunAuto({.stall_seconds = 0.02, .step_seconds = 0.02, .mtbf_seconds = 0.25});
  EXPECT_EQ(saved, (std::vector<int64_t>{5, 10, 15, 20}));
  // Four times the MTBF: twice the interval.
  std::tie(saved, intervals) =
      RunAuto({.stall_seconds = 0.02, .step_seconds = 0.02, .mtbf_seconds = 1.0});
  EXPECT_EQ(saved, (std::vector<int64_t>{10, 20}));
  EXPECT_EQ(intervals.back(), 10);
}

}  // namespace
}  // namespace furnace::train

namespace furnace::train {
namespace {

// MFU on a GPU divides by the datasheet's dense figure at the GEMMs' precision; a GPU the table
// does not know gets 0 (MFU not reported), said in the source line, rather than a guess.
TEST(PeakFlopsTest, DatasheetFigureOfTheGpuAtThePrecision) {
  std::string source;
  EXPECT_DOUBLE_EQ(DatasheetPeakFlops("NVIDIA H200", device::Precision::kBf16, &source), 989.4e12);
  EXPECT_NE(source.find("H200 SXM"), std::string::npos) << source;
  EXPECT_DOUBLE_EQ(DatasheetPeakFlops("NVIDIA H200", device::Precision::kFp32), 66.9e12);
  EXPECT_DOUBLE_EQ(DatasheetPeakFlops("NVIDIA H100 PCIe", device::Precision::kBf16), 756.4e12);
  EXPECT_DOUBLE_EQ(DatasheetPeakFlops("NVIDIA H100 80GB HBM3", device::Precision::kBf16), 989.4e12);
  EXPECT_EQ(DatasheetPeakFlops("Some Future GPU", device::Precision::kBf16, &source), 0.0);
  EXPECT_NE(source.find("MFU not reported"), std::string::npos) << source;
}

// On a CPU the peak is measured once per machine: ranks that start together wait for the one that
// measures (never measuring at once, sharing the cores) and read its figure; later processes read
// it from the cache; a figure that cannot be written is measured again next time, not lost.
TEST(PeakFlopsTest, TheMachinesPeakIsMeasuredOnceByOneProcessWhileTheOthersWait) {
  testing_util::TestDir dir;
  const std::string cache = dir / "cache";
  std::atomic<int> measuring{0}, measurements{0}, overlapped{0};
  const auto measure = [&] {
    if (measuring.fetch_add(1) > 0) ++overlapped;
    ++measurements;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    --measuring;
    return 42.5e9;
  };
  constexpr int kRanks = 4;
  std::vector<double> peaks(kRanks);
  std::vector<int> cached(kRanks);
  std::vector<std::thread> ranks;
  for (int r = 0; r < kRanks; ++r) {
    ranks.emplace_back([&, r] {
      bool c = false;
      absl::StatusOr<double> p = MachinePeakFlops(cache, "vm", measure, &c);
      EXPECT_TRUE(p.ok()) << p.status();
      peaks[r] = p.value_or(0);
      cached[r] = c;
    });
  }
  for (auto& t : ranks) t.join();
  EXPECT_EQ(measurements.load(), 1);
  EXPECT_EQ(overlapped.load(), 0);
  EXPECT_EQ(std::count(cached.begin(), cached.end(), 1), kRanks - 1);
  for (double p : peaks) EXPECT_DOUBLE_EQ(p, 42.5e9);
  // A later job on the machine reads it; another host's name has a figure of its own.
  bool c = false;
  EXPECT_DOUBLE_EQ(*MachinePeakFlops(cache, "vm", measure, &c), 42.5e9);
  EXPECT_TRUE(c);
  EXPECT_DOUBLE_EQ(*MachinePeakFlops(
                       cache, "other", [] { return 7e9; }, &c),
                   7e9);
  EXPECT_FALSE(c);
  EXPECT_EQ(measurements.load(), 1);
  // A directory that cannot be made is an error the caller measures past.
  std::ofstream(dir / "file") << "x";
  EXPECT_FALSE(MachinePeakFlops(dir / "file/sub", "vm", measure).ok());
}

}  // namespace
}  // namespace furnace::train
