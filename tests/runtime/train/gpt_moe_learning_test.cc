// Training learns, not just moves the loss: the GPT-MoE of MODEL.md (every layer MoE, top-2,
// dropless) trained on a synthetic Markov chain reaches a held-out loss within 5% of the chain's
// exact entropy rate H, the best any model can do.
#include <cstdio>

#include "gtest/gtest.h"
#include "kernels/blas.h"
#include "runtime/data/markov.h"
#include "runtime/data/sampler.h"
#include "runtime/device/device.h"
#include "runtime/model/gpt_moe.h"
#include "runtime/tensor/arena.h"
#include "runtime/train/trainer.h"

namespace furnace::train {
namespace {

TEST(GptMoeLearningTest, ReachesTheMarkovEntropyFloor) {
  kernels::cpu::SetBlasThreads(1);
  model::ModelConfig config;
  config.vocab = 32;
  config.seq_len = 32;
  config.d_model = 64;
  config.heads = 4;
  config.layers = 2;
  config.dense_ffn = 256;
  config.moe_every = 1;
  config.experts = 8;
  config.top_k = 2;
  config.expert_ffn = 128;
  config.capacity_factor = 0;
  config.normalize_topk = true;
  config.aux_alpha = 0.01;

  data::MarkovConfig mc;
  mc.vocab = config.vocab;
  mc.seed = 3;
  auto chain = data::MarkovChain::Create(mc);
  ASSERT_TRUE(chain.ok()) << chain.status();
  const double floor = chain->entropy_rate();
  data::SamplerConfig sc;
  sc.batch = 16;
  sc.seq_len = config.seq_len;
  sc.seed = 1;
  auto sampler = data::MakeMarkovSampler(*chain, sc);
  ASSERT_TRUE(sampler.ok()) << sampler.status();

  auto cpu = device::CreateCpuDevice();
  tensor::DeviceArena arena(*cpu, 0);
  auto model = model::GptMoe::Create(config, /*seed=*/1, *cpu, arena);
  ASSERT_TRUE(model.ok()) << model.status();

  TrainConfig tc;
  tc.steps = 200;
  tc.micro_batches = 1;
  tc.seed = 1;
  tc.schedule.lr = 3e-3;
  tc.schedule.warmup_steps = 10;
  tc.schedule.max_steps = tc.steps;
  auto trainer = Trainer::Create(model->get(), sampler->get(), tc);
  ASSERT_TRUE(trainer.ok()) << trainer.status();

  // Held-out loss: batches at step indices training never uses.
  auto held_out = [&]() {
    double sum = 0;
    const int batches = 8;
    for (int i = 0; i < batches; ++i) {
      data::Batch b = (*sampler)->Sample(1'000'000 + i, 0, 0).value();
      auto r = (*model)->Evaluate(b.inputs.data(), b.targets.data(), b.B);
      EXPECT_TRUE(r.ok()) << r.status();
      sum += r.ok() ? r->loss : 0;
    }
    return sum / batches;
  };
  const double before = held_out();
  int64_t within_at = -1;
  double after = before;
  for (int64_t step = 0; step < tc.steps; ++step) {
    ASSERT_TRUE((*trainer)->Step().ok());
    if ((step + 1) % 25 == 0) {
      after = held_out();
      if (within_at < 0 && after <= 1.05 * floor) within_at = step + 1;
    }
  }
  std::printf(
      "entropy floor H = %.4f nats/token; held-out loss %.4f before, %.4f after %lld "
      "steps; first within 5%% of H at step %lld\n",
      floor, before, after, static_cast<long long>(tc.steps), static_cast<long long>(within_at));
  EXPECT_GT(before, 1.5 * floor);  // it had something to learn
  EXPECT_LE(after, 1.05 * floor);
  EXPECT_GE(after, floor * 0.99);  // no model beats the entropy rate (up to sampling noise)
}

}  // namespace
}  // namespace furnace::train
