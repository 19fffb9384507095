// Held-out evaluation in the training loop (runtime/train/held_out_eval.h), one process: when it
// runs (eval.every and after the last step), what it computes (the mean of the model's forward-only
// loss over held-out batches 0 .. batches - 1), and that it changes nothing of the training run
// (parameters bit-identical to a run without it). The parallel layouts are in
// tests/runtime/parallel/eval_layout_test.cc.
#include "runtime/train/held_out_eval.h"

#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/blas.h"
#include "runtime/data/markov.h"
#include "runtime/data/sampler.h"
#include "runtime/device/device.h"
#include "runtime/model/gpt_moe.h"
#include "runtime/tensor/arena.h"
#include "runtime/train/trainer.h"
#include "tests/runtime/model/model_test_util.h"

namespace furnace::train {
namespace {

// The model tests' tiny MoE, with routing spikes on: evaluation must not inject them.
model::ModelConfig Tiny() {
  model::ModelConfig c = model::testing::TinyConfig();
  c.spikes.probability = 0.5;
  c.spikes.max_ratio = 2;
  c.spikes.seed = 3;
  return c;
}

std::unique_ptr<data::Sampler> Markov(int vocab, uint64_t seed) {
  data::MarkovConfig mc;
  mc.vocab = vocab;
  mc.seed = 5;
  data::SamplerConfig sc;
  sc.batch = 2;
  sc.seq_len = 8;
  sc.seed = seed;
  return *data::MakeMarkovSampler(*data::MarkovChain::Create(mc), sc);
}

struct Outcome {
  std::vector<float> params;
  std::vector<double> loss;                           // per step
  std::vector<std::pair<int64_t, EvalResult>> evals;  // (steps done, result)
};

Outcome Train(int64_t eval_every, int steps) {
  kernels::cpu::SetBlasThreads(1);
  std::unique_ptr<device::Device> cpu = device::CreateCpuDevice();
  tensor::DeviceArena arena(*cpu, 0);
  std::unique_ptr<model::GptMoe> model = *model::GptMoe::Create(Tiny(), 1, *cpu, arena);
  std::unique_ptr<data::Sampler> train = Markov(32, 1);
  std::unique_ptr<data::Sampler> held_out = Markov(32, 99);
  TrainConfig tc;
  tc.steps = steps;
  tc.micro_batches = 2;
  tc.seed = 1;
  tc.schedule.lr = 3e-3;
  tc.schedule.max_steps = steps;
  tc.eval.every = eval_every;
  tc.eval.batches = 3;
  absl::StatusOr<std::unique_ptr<Trainer>> trainer =
      Trainer::Create(model.get(), train.get(), tc, nullptr, nullptr, held_out.get());
  EXPECT_TRUE(trainer.ok()) << trainer.status();
  Outcome run;
  const absl::Status s = (*trainer)->Run([&](const StepStats& st) {
    run.loss.push_back(st.loss);
    if (st.eval) run.evals.emplace_back(st.step + 1, *st.eval);
  });
  EXPECT_TRUE(s.ok()) << s;
  run.params.assign(model->param_data(), model->param_data() + model->num_params());
  // The last evaluation is the mean of the model's own Evaluate over held-out batches 0, 1, 2.
  if (!run.evals.empty()) {
    double sum = 0;
    for (int i = 0; i < 3; ++i) {
      const data::Batch b = held_out->Sample(0, 0, i).value();
      sum += model->Evaluate(b.inputs.data(), b.targets.data(), b.B)->loss;
    }
    EXPECT_DOUBLE_EQ(run.evals.back().second.loss, sum / 3);
    EXPECT_DOUBLE_EQ(run.evals.back().second.perplexity, std::exp(sum / 3));
    EXPECT_EQ(run.evals.back().second.tokens, 3 * 2 * 8);
  }
  return run;
}

TEST(HeldOutEvalTest, RunsEveryNStepsAndAfterTheLast) {
  EXPECT_FALSE(EvalDue({0, 4}, 5, 10));
  EXPECT_FALSE(EvalDue({3, 4}, 2, 10));
  EXPECT_TRUE(EvalDue({3, 4}, 3, 10));
  EXPECT_TRUE(EvalDue({3, 4}, 10, 10));  // the end, off the grid
  EXPECT_FALSE(EvalDue({3, 4}, 0, 10));
  const Outcome run = Train(3, 7);
  ASSERT_EQ(run.evals.size(), 3u);
  EXPECT_EQ(run.evals[0].first, 3);
  EXPECT_EQ(run.evals[1].first, 6);
  EXPECT_EQ(run.evals[2].first, 7);
  // The model learns the chain: the held-out loss falls.
  EXPECT_LT(run.evals[2].second.loss, run.evals[0].second.loss);
}

TEST(HeldOutEvalTest, DoesNotChangeTraining) {
  const Outcome with = Train(1, 6);
  const Outcome without = Train(0, 6);
  EXPECT_EQ(with.evals.size(), 6u);
  EXPECT_TRUE(without.evals.empty());
  EXPECT_EQ(with.loss, without.loss);
  ASSERT_EQ(with.params.size(), without.params.size());
  EXPECT_EQ(
      std::memcmp(with.params.data(), without.params.data(), sizeof(float) * with.params.size()),
      0);
}

TEST(HeldOutEvalTest, RefusesEvalWithoutHeldOutData) {
  std::unique_ptr<device::Device> cpu = device::CreateCpuDevice();
  tensor::DeviceArena arena(*cpu, 0);
  std::unique_ptr<model::GptMoe> model = *model::GptMoe::Create(Tiny(), 1, *cpu, arena);
  std::unique_ptr<data::Sampler> train = Markov(32, 1);
  TrainConfig tc;
  tc.seed = 1;
  tc.eval.every = 2;
  tc.eval.batches = 1;
  absl::StatusOr<std::unique_ptr<Trainer>> trainer = Trainer::Create(model.get(), train.get(), tc);
  EXPECT_TRUE(absl::IsInvalidArgument(trainer.status())) << trainer.status();
  std::unique_ptr<data::Sampler> held_out = Markov(32, 2);
  tc.eval.batches = 0;
  trainer = Trainer::Create(model.get(), train.get(), tc, nullptr, nullptr, held_out.get());
  EXPECT_TRUE(absl::IsInvalidArgument(trainer.status())) << trainer.status();
}

}  // namespace
}  // namespace furnace::train
